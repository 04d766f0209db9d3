"""Reference kernels in PyTorch: the backend that runs anywhere, and the oracle the others are tested against.

Bit-plane packing: a b-bit code costs exactly b bits (3- and 5-bit codes too). Plane k holds bit k of
every code, eight codes to a byte along the last dim: codes [..., D] (D a multiple of 8) <->
packed [b, ..., D // 8] uint8.
"""

from __future__ import annotations

import torch

from ...engines.vllm.nibbles import unpack_nibbles
from ...engines.vllm.per_token_head import quantize_int4
from ...quant import minmax_codes
from .contract import PackedRead, split_word

NAME = "reference"
NEEDS_POWER_OF_TWO_HEAD_DIM = False
_SHIFTS = torch.arange(8, dtype=torch.uint8)
_LUTS: dict = {}


def pack_bitplanes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if codes.shape[-1] % 8:
        raise ValueError(f"the packed dim must be a multiple of 8, got {codes.shape[-1]}")
    c = codes.to(torch.uint8).reshape(1, *codes.shape[:-1], codes.shape[-1] // 8, 8)
    shifts = _SHIFTS.to(c.device)
    k = torch.arange(bits, dtype=torch.uint8, device=c.device).view(bits, *[1] * (c.dim() - 1))
    return (((c >> k) & 1) << shifts).sum(-1, dtype=torch.uint8)  # all planes in three ops


def _spread_tables(device):
    """byte -> int64 whose 8 bytes are its 8 bits (0/1); and a 16-bit version for two planes at once
    (low byte -> bit 0 of each code, high byte -> bit 1). Built once per device."""
    if device not in _LUTS:
        byte = torch.arange(256, dtype=torch.int64)
        one = sum(((byte >> i) & 1) << (8 * i) for i in range(8))
        pair = torch.arange(65536, dtype=torch.int64)
        two = one[pair & 255] | (one[pair >> 8] << 1)
        _LUTS[device] = (one.to(device), two.to(device))
    return _LUTS[device]


def unpack_bitplanes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Table look-ups, two planes per look-up (index_select: far faster than advanced indexing on CPU)."""
    one, two = _spread_tables(packed.device)
    out = None
    for k in range(0, bits, 2):
        if k + 1 < bits:
            x = two.index_select(0, (packed[k].int() | (packed[k + 1].int() << 8)).reshape(-1))
        else:
            x = one.index_select(0, packed[k].int().reshape(-1))
        if k:
            x <<= k
        out = x if out is None else out.bitwise_or_(x)
    return out.view(torch.uint8).view(*packed.shape[1:-1], packed.shape[-1] * 8)


def unpack_float(packed: torch.Tensor, bits: int, offset: float = 0.0) -> torch.Tensor:
    """Codes as float32 minus `offset` (the codec's code offset): packed [bits, ..., D // 8] -> [..., D]."""
    f = unpack_bitplanes(packed, bits).float()
    return f.sub_(offset) if offset else f


def quantize_pack_tokens(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token asymmetric quantization over groups of `group` channels, packed (KIVI values).

    x [N, D] -> codes [bits, N, D // 8] uint8, scale and zero [N, D // group] fp16. Codes come from
    the exact fp32 statistics, as quant.py computes them, so the runtime stores what the profile measured.
    """
    n, d = x.shape
    codes, scale, mn = minmax_codes(x.float().reshape(n, d // group, group), bits)
    return pack_bitplanes(codes.reshape(n, d), bits), scale.squeeze(-1).half(), mn.squeeze(-1).half()


def quantize_pack_channels(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel asymmetric quantization over groups of `group` tokens, packed (KIVI keys).

    x [N, T, D] (T a multiple of `group`) -> codes [bits, N, T, D // 8] uint8, scale and zero
    [N, T // group, D] fp16, from the exact fp32 statistics.
    """
    n, t, d = x.shape
    codes, scale, mn = minmax_codes(x.float().reshape(n, t // group, group, d), bits, dim=2)
    return pack_bitplanes(codes.reshape(n, t, d), bits), scale.squeeze(2).half(), mn.squeeze(2).half()


def quantize_pack_int4_rht(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's nibbles (dim 2i low, 2i + 1 high) re-packed as bit-planes of the codes in dim order."""
    packed, word = quantize_int4(x)
    return pack_bitplanes(unpack_nibbles(packed), 4), word


def dequantize_channels(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, group: int,
                        offset: float = 0.0) -> torch.Tensor:
    """codes [bits, B, H, T, D // 8], scale / zero (or None) [B, H, T // group, D] -> float32 [B, H, T, D]:
    (code - offset) * scale + zero, offset being the codec's (absmax codes are stored shifted)."""
    u = unpack_float(codes, bits, offset)
    b, h, t, d = u.shape
    ug = u.view(b, h, t // group, group, d)
    if zero is None:
        return ug.mul_(scale.float().unsqueeze(3)).view(b, h, t, d)
    return torch.addcmul(zero.float().unsqueeze(3), ug, scale.float().unsqueeze(3)).view(b, h, t, d)


def dequantize_tokens(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, group: int,
                      offset: float = 0.0) -> torch.Tensor:
    """codes [bits, B, H, T, D // 8], scale / zero (or None) [B, H, T, D // group] -> float32 [B, H, T, D]."""
    u = unpack_float(codes, bits, offset)
    b, h, t, d = u.shape
    ug = u.view(b, h, t, d // group, group)
    if zero is None:
        return ug.mul_(scale.float().unsqueeze(-1)).view(b, h, t, d)
    return torch.addcmul(zero.float().unsqueeze(-1), ug, scale.float().unsqueeze(-1)).view(b, h, t, d)


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotate-half RoPE on [B, H, T, D] with half-width tables cos / sin [B, T, R / 2] (the first R
    channels rotate): keys stored before RoPE get their position back on read."""
    h = cos.shape[-1]
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
    x1, x2 = x[..., :h], x[..., h:2 * h]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * h:]], dim=-1)


def _per_token(x: torch.Tensor, read: PackedRead, t: int) -> torch.Tensor:
    """Per-group parameters [B, H, ceil(T / tg), D / cg] -> float32 [B, H, T, D]."""
    x = x.float()
    if read.token_group > 1:
        x = x.repeat_interleave(read.token_group, dim=2)
    x = x[:, :, :t]
    return x.repeat_interleave(read.channel_group, dim=3) if read.channel_group > 1 else x


def dequantize_read(read: PackedRead) -> torch.Tensor:
    """A PackedRead as float32 [B, H, T, D] (post-RoPE for keys stored before it): the oracle of every kernel."""
    if read.dense:
        out = read.codes.float()
    else:
        codes = unpack_bitplanes(read.codes, read.bits) if read.packing == "planes" else read.codes
        if read.wide:  # the wide channels' extra bit; the others index the second codebook
            w = read.wide
            high = unpack_bitplanes(read.wide_plane().unsqueeze(0), 1).long() << read.bits
            codes = torch.cat([codes[..., :w].long() + high, codes[..., w:].long() + 2 ** (read.bits + 1)], dim=-1)
        t = codes.shape[2]
        scale, zero = split_word(read.scale) if read.word else (read.scale, read.zero)
        out = read.lut.to(codes.device).float()[codes.long()] * _per_token(scale, read, t)
        if zero is not None:
            out = out + _per_token(zero, read, t)
    return out if read.rope is None else rotate_half_rope(out, *read.rope)


def decode_attention(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor, v_tail: torch.Tensor, *,
                     scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence over a packed cache of any layout, then the full-precision tail: the packed tokens
    are dequantized whole (the oracle; the other backends read them tile by tile).

    q [B, Hq, D]; k_tail / v_tail [B, Hkv, Tt, D]; mask bool [B, T + Tt] or None. Returns [B, Hq, D] fp32.
    Query heads share their KV head by a reshape, not a copy of the cache.
    """
    b, hq, d = q.shape
    keys = torch.cat([dequantize_read(k), k_tail.float()], dim=2)
    values = torch.cat([dequantize_read(v), v_tail.float()], dim=2)
    hkv = keys.shape[1]
    s = torch.matmul(q.float().reshape(b, hkv, hq // hkv, d), keys.transpose(-1, -2)) * scaling
    if mask is not None:
        s = s.masked_fill(~mask.to(s.device)[:, None, None, :], -float("inf"))
    return torch.matmul(torch.softmax(s, dim=-1), values).reshape(b, hq, d)
