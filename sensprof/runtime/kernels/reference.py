"""Reference bit-plane packing: a b-bit code costs exactly b bits (3- and 5-bit codes too).

Plane k holds bit k of every code, eight codes to a byte along the last dim:
codes [..., D] (D a multiple of 8) <-> packed [b, ..., D // 8] uint8.
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(8, dtype=torch.uint8)


def pack_bitplanes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if codes.shape[-1] % 8:
        raise ValueError(f"the packed dim must be a multiple of 8, got {codes.shape[-1]}")
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)
    shifts = _SHIFTS.to(c.device)
    planes = [(((c >> k) & 1) << shifts).sum(-1, dtype=torch.uint8) for k in range(bits)]
    return torch.stack(planes)


def unpack_bitplanes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    shifts = _SHIFTS.to(packed.device)
    out = None
    for k in range(bits):
        b = ((packed[k].unsqueeze(-1) >> shifts) & 1) << k
        out = b if out is None else out | b
    return out.reshape(*packed.shape[1:-1], packed.shape[-1] * 8)


def quantize_pack_tokens(x: torch.Tensor, bits: int, group: int):
    """Per-token asymmetric quantization over groups of `group` channels, packed (KIVI values).

    x [N, D] -> codes [bits, N, D // 8] uint8, scale and zero [N, D // group] fp16 (codes from the
    exact fp32 statistics, as quant.py does).
    """
    n, d = x.shape
    xg = x.float().reshape(n, d // group, group)
    mn, mx = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
    scale = (mx - mn) / (2**bits - 1)
    inv = torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, 1.0), torch.zeros_like(scale))
    codes = torch.floor((xg - mn) * inv + 0.5).clamp(0, 2**bits - 1).reshape(n, d)
    return pack_bitplanes(codes, bits), scale.squeeze(-1).half(), mn.squeeze(-1).half()


def decode_attention(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_tail, v_tail, *,
                     bits_k: int, bits_v: int, group_k: int, group_v: int, scaling: float) -> torch.Tensor:
    """One query per sequence over a packed cache: keys per channel (groups of `group_k` tokens),
    values per token (groups of `group_v` channels), then the full-precision tail.

    q [B, Hq, D]; k_codes / v_codes [bits, B, Hkv, T, D // 8]; k_scale / k_zero [B, Hkv, T // group_k, D];
    v_scale / v_zero [B, Hkv, T, D // group_v]; k_tail / v_tail [B, Hkv, Tt, D]. Returns [B, Hq, D] fp32.
    """
    b, hkv, t = k_codes.shape[1:4]
    d = q.shape[-1]
    k = unpack_bitplanes(k_codes, bits_k).float()  # [B, Hkv, T, D]
    k = k * k_scale.float().repeat_interleave(group_k, dim=2) + k_zero.float().repeat_interleave(group_k, dim=2)
    v = unpack_bitplanes(v_codes, bits_v).float().reshape(b, hkv, t, d // group_v, group_v)
    v = (v * v_scale.float()[..., None] + v_zero.float()[..., None]).reshape(b, hkv, t, d)
    k = torch.cat([k, k_tail.float()], dim=2)
    v = torch.cat([v, v_tail.float()], dim=2)
    rep = q.shape[1] // hkv
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    p = torch.softmax(torch.einsum("bhd,bhtd->bht", q.float(), k) * scaling, dim=-1)
    return torch.einsum("bht,bhtd->bhd", p, v)
