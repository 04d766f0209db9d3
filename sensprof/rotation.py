"""Orthogonal rotations some engines apply to K, V and the query before a quantized cache stores them.

llama.cpp (src/llama-kv-cache.cpp, attn_rot_k / attn_rot_v; llama-cpp-python 0.3.36 has it) multiplies the query
and the key by a normalised Sylvester Hadamard matrix when the K cache is quantized, and the value (undoing it on
the attention output) when the V cache is: an outlier channel is spread over its whole block, so the block's
scale no longer follows it. Keys use the largest power-of-two block (at least 64) that divides head_dim, values
blocks of 64; a head_dim that 64 does not divide is not rotated. The rotation acts on the channels in the
engine's order: llama.cpp's converter permutes a Llama-family checkpoint's q/k rows so rotary pairs (i, i + D/2)
become adjacent (2i, 2i + 1) ("interleaved"); the model sensprof loads keeps transformers' order ("halves").
Rotated products are unchanged (H is orthogonal and symmetric); only the quantization sees the rotated basis.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix over sqrt(n) (ggml_gen_hadamard's), float32 on the CPU."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def block_size(rotation: str, head_dim: int) -> int:
    """The rotation's block for this head_dim; 0: the engine does not rotate it."""
    if not rotation or head_dim % 64:
        return 0
    if rotation == "hadamard64":
        return 64
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def interleave_order(head_dim: int) -> torch.Tensor:
    """Position p of the engine's channels holds transformers' channel order[p]: (0, D/2, 1, D/2 + 1, ...)."""
    half = torch.arange(head_dim // 2)
    return torch.stack([half, half + head_dim // 2], 1).reshape(-1)


def _blocks_times_hadamard(x: torch.Tensor, n: int) -> torch.Tensor:
    """Each block of n channels times H (its own inverse: symmetric and orthogonal)."""
    return (x.reshape(*x.shape[:-1], x.shape[-1] // n, n) @ hadamard(n).to(x.device)).reshape(x.shape)


def rotate(x: torch.Tensor, rotation: str, order: str = "halves") -> torch.Tensor:
    """x [..., D] in the engine's rotated basis (float32), channels in the engine's order."""
    d = x.shape[-1]
    n = block_size(rotation, d)
    x = x.float()
    if not n:
        return x
    if order == "interleaved":
        x = x[..., interleave_order(d).to(x.device)]
    return _blocks_times_hadamard(x, n)


def unrotate(y: torch.Tensor, rotation: str, order: str = "halves") -> torch.Tensor:
    """The inverse of rotate: back to x's basis and channel order."""
    d = y.shape[-1]
    n = block_size(rotation, d)
    if not n:
        return y
    x = _blocks_times_hadamard(y.float(), n)
    if order == "interleaved":
        x = x[..., torch.argsort(interleave_order(d)).to(x.device)]
    return x
