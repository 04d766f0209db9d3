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
