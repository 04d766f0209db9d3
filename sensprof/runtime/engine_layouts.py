"""Engine formats the runtime stores as the engine does, and reads packed (the rest are emulated for profiling only).

vLLM's int4_per_token_head: Hadamard-rotated K / V, 4-bit codes per (token, head) with one fp32 word holding the
scale and, in its low 4 mantissa bits, the zero-point (engines/vllm/per_token_head.py has the facts). The runtime
keeps exactly those bytes (the codes as 4 bit-planes: D / 2 bytes, as vLLM's nibbles; the fp32 word), and reads them
in the rotated basis: the query is rotated for keys and the output rotated back for values, as vLLM's kernel does.
"""

from __future__ import annotations

import torch

from ..engines.vllm.per_token_head import ZP_MASK, largest_pow2_divisor, quantize_int4, single_rht
from ..quant import Quantized
from .kernels import PackedRead


class Int4PerTokenHead:
    bits = 4
    rotated = True

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        """y [B, H, T, D] in the model dtype -> bit-planes [4, B, H, T, D / 8] and the fp32 word [B, H, T, 1]."""
        packed, word = quantize_int4(y)
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
        return Quantized(ops.pack_bitplanes(codes, 4), word.unsqueeze(-1).contiguous(), None)

    @staticmethod
    def scale_zero(word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 word -> (scale, -zp * scale), float32 like the word: decoded per read (T values, not T x D)."""
        bits = word.view(torch.int32)
        scale = (bits & -16).view(torch.float32)
        return scale, -(bits & ZP_MASK).float() * scale

    def read(self, codes: torch.Tensor, word: torch.Tensor) -> PackedRead:
        """The rotated values as a kernel reads them: code * scale + (-zp * scale)."""
        scale, zero = self.scale_zero(word)
        lut = torch.arange(16, dtype=torch.float32, device=codes.device)
        return PackedRead(codes=codes, scale=scale, zero=zero, lut=lut, bits=4, token_group=1,
                          channel_group=codes.shape[-1] * 8, offset=0.0)

    def dense(self, codes: torch.Tensor, word: torch.Tensor, ops) -> torch.Tensor:
        """Tokens back in the model's basis (float32), as the profiler's emulation computes them."""
        scale, _ = self.scale_zero(word)
        zp = (word.view(torch.int32) & ZP_MASK).float()
        rotated = (ops.unpack_float(codes, 4) - zp) * scale
        return self.from_rotated(rotated)

    @staticmethod
    def to_rotated(x: torch.Tensor) -> torch.Tensor:
        return single_rht(x.float())

    @staticmethod
    def from_rotated(y: torch.Tensor) -> torch.Tensor:
        return single_rht(y.float(), inverse=True) / largest_pow2_divisor(y.shape[-1])

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """q such that q . (rotated key) is the model's q . k: rht(q) / b."""
        return single_rht(q.float()) / largest_pow2_divisor(q.shape[-1])


LAYOUTS = {"vllm.int4_per_token_head": Int4PerTokenHead}


def engine_layout(scheme):
    """The runtime layout of an engine scheme, or None when the runtime does not store it."""
    cls = LAYOUTS.get(scheme.emulation)
    return None if cls is None else cls()
