"""vLLM's 4-bit packing, shared by its int4, nvfp4 and ultraquant formats: element 2i in the low nibble of byte i,
element 2i + 1 in the high nibble."""

from __future__ import annotations

import torch


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Integer codes 0 .. 15 [..., D] (D even) -> uint8 [..., D / 2]."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(data: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., D / 2] -> one code per element [..., D], in data's dtype."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(*data.shape[:-1], data.shape[-1] * 2)
