"""Rotary position embedding maths: the profiler's pre-RoPE taps undo it, quantize, and apply it again."""

from __future__ import annotations

import torch


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotate-half RoPE on [B, H, T, D]; partial rotary leaves the tail as is."""
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    out = rot * cos + _rotate_half(rot) * sin
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def undo_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return apply_rope(x, cos, -sin)
