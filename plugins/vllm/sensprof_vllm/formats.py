"""How an asymmetric layer stores one token-head of K and of V in its byte page, in pure PyTorch.

The arithmetic is sensprof's (sensprof/quant.py), repeated here because the plugin never imports sensprof; the
tests hold the two bit for bit. Components (plan.py names them):
  auto           the model dtype's own bytes
  fp8_e4m3/e5m2  unit scale, codes as vLLM's CPU cache writer makes them (clamp, then truncate toward zero:
                 csrc/cpu/cpu_attn_fp8.hpp), so K fp8 of an asymmetric layer is stored as a plain fp8 layer stores it
  int<b>_t<g>    KIVI values: asymmetric min-max codes per token over groups of g channels, the codes b-bit packed
                 (LSB first), each group's scale and minimum as float16
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .plan import component_bytes, component_fields

_FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def fp8_toward_zero(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """vLLM's CPU fp8 writer: clamp to +-max, keep the leading bits of the float32 value (toward zero); e4m3 never
    writes its NaN code. The bytes, as uint8."""
    fmax = _FP8[fmt][1]
    v = y.float().clamp(-fmax, fmax)
    if fmt == "fp8_e4m3":
        bits = (v * 2.0**-120).view(torch.int32).long()
        payload = ((bits >> 20) & 0x7F).clamp_max(0x7E)
    else:
        bits = v.view(torch.int32).long()
        exp = ((bits >> 23) & 0xFF) - 127
        shift = (-14 - exp).clamp_min(0)
        sub = torch.where(shift + 21 >= 32, 0,
                          ((0x800000 | (bits & 0x7FFFFF)) >> (shift + 21).clamp_max(31)).clamp_max(3))
        payload = torch.where(exp < -14, sub, ((exp + 15).clamp_min(0) << 2) | ((bits >> 21) & 0x3))
    sign = (bits >> 24) & 0x80
    return torch.where(v == 0, 0, sign | payload).to(torch.uint8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] integer codes < 2**bits -> [..., ceil(n*bits/8)] uint8, LSB first."""
    c = codes.to(torch.int32)
    planes = (c.unsqueeze(-1) >> torch.arange(bits, dtype=torch.int32)) & 1  # [..., n, bits]
    flat = planes.flatten(-2)
    pad = (-flat.shape[-1]) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(*flat.shape[:-1], pad)], dim=-1)
    weights = 1 << torch.arange(8, dtype=torch.int32)
    return (flat.unflatten(-1, (-1, 8)) * weights).sum(-1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The inverse of pack_bits: [..., nbytes] uint8 -> [..., n] int32 codes."""
    planes = (packed.to(torch.int32).unsqueeze(-1) >> torch.arange(8, dtype=torch.int32)) & 1
    flat = planes.flatten(-2)[..., :n * bits]
    weights = 1 << torch.arange(bits, dtype=torch.int32)
    return (flat.unflatten(-1, (n, bits)) * weights).sum(-1)


@dataclass(frozen=True)
class Component:
    """One tensor's (K's or V's) storage in an asymmetric layer."""

    name: str
    kind: str  # "auto" | "fp8" | "int"
    bits: int = 16
    group: int = 0

    @staticmethod
    def parse(name: str) -> "Component":
        kind, bits, group = component_fields(name)
        return Component(name, kind, bits, group)

    def nbytes(self, head_size: int, model_dtype: torch.dtype) -> int:
        """Bytes of one token-head (plan.py's arithmetic, which the plan's bytes per token sums)."""
        return component_bytes(self.name, head_size, torch.empty((), dtype=model_dtype).element_size())

    def group_of(self, head_size: int) -> int:
        """Channels per group: a group wider than the head is the whole head (sensprof's fake_quant)."""
        return min(self.group, head_size)

    def write(self, x: torch.Tensor) -> torch.Tensor:
        """[..., D] in the model dtype -> [..., nbytes] uint8."""
        if self.kind == "auto":
            return x.contiguous().view(torch.uint8)
        if self.kind == "fp8":
            return fp8_toward_zero(x, self.name)
        d = x.shape[-1]
        g = self.group_of(d)
        xg = x.float().unflatten(-1, (d // g, g))
        levels = 2**self.bits - 1
        mn = xg.amin(-1, keepdim=True)
        scale = (xg.amax(-1, keepdim=True) - mn) / levels
        inv = torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, 1.0), torch.zeros_like(scale))
        codes = torch.floor((xg - mn) * inv + 0.5).clamp(0, levels).flatten(-2)
        stats = torch.cat([scale, mn], dim=-1).half().contiguous().view(torch.uint8).flatten(-2)
        return torch.cat([pack_bits(codes, self.bits), stats], dim=-1)

    def read(self, data: torch.Tensor, head_size: int, model_dtype: torch.dtype) -> torch.Tensor:
        """[..., nbytes] uint8 -> [..., D] in the model dtype (as a kernel decoding into it, and sensprof's emulation,
        hand the values to attention)."""
        if self.kind == "auto":
            return data.contiguous().view(model_dtype)
        if self.kind == "fp8":
            return data.contiguous().view(_FP8[self.name][0]).to(model_dtype)
        code_bytes = (head_size * self.bits + 7) // 8
        codes = unpack_bits(data[..., :code_bytes], self.bits, head_size).float()
        stats = data[..., code_bytes:].contiguous().view(torch.float16).float()
        g = self.group_of(head_size)
        stats = stats.unflatten(-1, (head_size // g, 2))
        codes = codes.unflatten(-1, (head_size // g, g))
        return (codes * stats[..., :1] + stats[..., 1:]).flatten(-2).to(model_dtype)
