"""vLLM 0.33 ``--kv-cache-dtype ultraquant_4bit``: FP4 E2M1 codes + UE8M0 group-of-32 scales.

Facts (paths relative to the ``vllm`` package):

* ``v1/attention/ops/ultraquant/format.py``: per (token, KV head) one AoS slot
  ``[K codes D/2 | K scales D/32 | V codes D/2 | V scales D/32]`` bytes, i.e. ``D + D/16``
  bytes (136 B at D=128, 272 B at D=256); nibbles are packed low-first (element 2i in the
  low nibble); codes are OCP E2M1 bit patterns (sign | 2 exp | 1 mantissa); a scale byte
  ``e`` means ``2**(e - 127)``, byte 0 means "scale 0" (an all-zero group).
* ``v1/attention/ops/ultraquant/triton_store.py`` (``_ultraquant_store_kernel``, the
  production write path): K is Walsh-Hadamard rotated in fp32 by a radix-2 butterfly
  (``k = (sign*k + k[i^b]) * 0.70710678``), V is not rotated. Per group of 32:
  ``exp = floor(log2(0.156 * absmax) + 0.5)``, divide by ``2**exp`` and snap to the
  nearest E2M1 level with strict ``>`` against the 14 midpoints (ties go to the lower
  level, i.e. towards -inf); an all-zero group writes byte 0 and +0 codes.
* ``v1/attention/ops/ultraquant/triton_unified_attention.py`` (``ultraquant_unified_attention``)
  and ``ops/flydsl_ultraquant_decode.py``: the decode query is rotated by the same Hadamard
  (``q.float() @ PiT``) and cast to FP8 E4M3 with scale 1 before the QK product; V is
  dequantized as ``code * 2**(e-127)``.
* ``v1/attention/backends/ultraquant_attn.py`` (``_prefill_attention``): a first-chunk
  prefill attends over the *raw* bf16 K/V of the batch, not the cache; decode and
  continuation chunks read the quantized cache.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .nibbles import pack_nibbles, unpack_nibbles

GROUP = 32
C = 0.156
BIAS = 127
_INV_SQRT2 = 0.7071067811865476
# E2M1 bit pattern -> value (format.FP4_BITS_TO_VALUE)
_BITS_TO_VALUE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# midpoints between the 15 sorted levels (format.MIDPOINTS_SORTED)
_LEVELS = (-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(_LEVELS[:-1], _LEVELS[1:]))


def check_head_dim(d: int) -> None:
    """The store kernel's butterfly and ``tl.arange`` need a power of two; groups need 32 | D."""
    if d < GROUP or d & (d - 1):
        raise ValueError(f"ultraquant_4bit needs a power-of-two head_dim >= 32, got {d}")


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """Normalised Sylvester WHT along the last dim, in the store kernel's fp32 op order.

    The matrix is symmetric and orthonormal, so the same call is its own inverse
    (up to float rounding).
    """
    y = x.float()
    d = y.shape[-1]
    idx = torch.arange(d, device=y.device)
    for stage in range(int(math.log2(d))):
        b = 1 << stage
        partner = y[..., idx ^ b]
        sign = torch.where((idx & b) == 0, 1.0, -1.0).to(y.device)
        y = (sign * y + partner) * _INV_SQRT2
    return y


def quantize_ultraquant(x: torch.Tensor, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales exactly as the cache holds them.

    Returns ``(codes uint8 [..., D/2], scale_bytes uint8 [..., D/32])``. ``rotate=True`` is
    the K path (Hadamard first), ``False`` the V path.
    """
    d = x.shape[-1]
    check_head_dim(d)
    y = hadamard_rotate(x) if rotate else x.float()
    g = y.reshape(*y.shape[:-1], d // GROUP, GROUP)
    amax = g.abs().amax(-1)
    zero = amax == 0
    s_raw = amax * torch.tensor(C, dtype=torch.float32)
    exp = torch.floor(torch.log2(torch.where(zero, torch.ones_like(s_raw), s_raw)) + 0.5).to(torch.int32)
    div = torch.where(zero, torch.ones_like(s_raw), torch.exp2(exp.float()))
    norm = g / div.unsqueeze(-1)
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=x.device)
    sorted_idx = (norm.unsqueeze(-1) > mids).sum(-1)
    sorted_idx = torch.where(zero.unsqueeze(-1), torch.full_like(sorted_idx, 7), sorted_idx)
    bits = torch.where(sorted_idx < 7, 15 - sorted_idx, sorted_idx - 7).reshape(*y.shape[:-1], d)
    codes = pack_nibbles(bits)
    byte = exp + BIAS
    byte = torch.where(zero | (byte < 0) | (byte > 255), torch.zeros_like(byte), byte).to(torch.uint8)
    return codes, byte


def dequantize_ultraquant(codes: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """``code * 2**(byte - 127)`` (0 for byte 0), fp32, in the basis it was stored in."""
    bits = unpack_nibbles(codes.to(torch.int64))
    vals = torch.tensor(_BITS_TO_VALUE, dtype=torch.float32, device=codes.device)[bits]
    b = scale_bytes.to(torch.int32)
    s = torch.where(b == 0, torch.zeros_like(b, dtype=torch.float32), torch.exp2((b - BIAS).float()))
    g = vals.reshape(*vals.shape[:-1], b.shape[-1], GROUP) * s.unsqueeze(-1)
    return g.reshape(vals.shape)


def ultraquant_k(x: torch.Tensor) -> torch.Tensor:
    """K as attention sees it, rotated back to the input basis.

    vLLM stores Hadamard-rotated K and rotates the query the same way, so q.k of this
    result equals vLLM's rotated product up to float error (the query's own FP8 cast is
    :func:`ultraquant_query`).
    """
    codes, scales = quantize_ultraquant(x, rotate=True)
    return hadamard_rotate(dequantize_ultraquant(codes, scales))


def ultraquant_v(x: torch.Tensor) -> torch.Tensor:
    """V as attention reads it (no rotation)."""
    return dequantize_ultraquant(*quantize_ultraquant(x, rotate=False))


def ultraquant_query(q: torch.Tensor) -> torch.Tensor:
    """The decode query's precision haircut, in the input basis: ``H^T fp8_e4m3(H q)``.

    ``ultraquant_unified_attention`` casts the rotated query with scale 1 (torch's cast:
    round-to-nearest-even, saturating at 448 in torch 2.13 on CPU).
    """
    qr = hadamard_rotate(q).to(torch.float8_e4m3fn).float()
    return hadamard_rotate(qr)


EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.ultraquant_4bit.K": ultraquant_k,
    "vllm.ultraquant_4bit.V": ultraquant_v,
}

QUERY_TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.ultraquant_4bit": ultraquant_query,
}


def bytes_per_token_head(head_dim: int) -> dict[str, int]:
    """Cache bytes per token per KV head (``format.slot_size``; no padding beyond it)."""
    check_head_dim(head_dim)
    return {"K": head_dim // 2 + head_dim // GROUP, "V": head_dim // 2 + head_dim // GROUP}
