"""What a kernel backend is: every op the runtime calls (store.py, cache.py), one signature for all backends.

The backends are the modules reference, cpu_kernels and triton_kernels; `select()` returns one. Each
module defines every member below with exactly this signature (tests/runtime/kernels/test_contract.py
compares them with inspect.signature) and may fall back to the reference for inputs it does not take; the
capability flags say what a caller must check instead. Layouts: bit-planes [bits, ..., D / 8] uint8 (plane
k holds bit k of eight codes a byte); per-token scales / zero-points [..., T, D / g]; per-channel
[..., T / G, D]; fp16 where the scheme stores fp16.

Why a Protocol and not torch.library.custom_op: the backend is chosen per cache (a preference, a device,
whether Triton or a compiler exists), not by the tensors' device, and Triton must also run CPU tensors
under TRITON_INTERPRET=1, which a device-keyed dispatcher would send to the C kernels; custom ops would
also add dispatcher overhead to each of a decode step's small calls and register global names at import.
A Protocol costs nothing at run time, and nothing here needs autograd or torch.compile.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class KernelBackend(Protocol):
    NAME: str
    """Reported by `sensprof generate` (which kernels read the packed cache)."""
    NEEDS_POWER_OF_TWO_HEAD_DIM: bool
    """decode_attention handles only power-of-two head dims (Triton tiles span the head dim); for another head
    dim the caller reads the dense cache instead. Every other op takes any head dim divisible by 8."""

    def pack_bitplanes(self, codes: torch.Tensor, bits: int) -> torch.Tensor:
        """Integer codes [..., D] (D a multiple of 8) -> bit-planes [bits, ..., D // 8]: b bits per b-bit code.
        The store packs the codecs the fused quantizers do not cover (absmax, signed-max, per-head, ...)."""

    def unpack_float(self, packed: torch.Tensor, bits: int, offset: float = 0.0) -> torch.Tensor:
        """Bit-planes [bits, B, H, T, D // 8] -> codes minus `offset` as float32 [B, H, T, D]: the dense read of
        the codecs whose scale is one constant (per tensor or per head), applied by the caller."""

    def quantize_pack_tokens(self, x: torch.Tensor, bits: int, group: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Min-max codes of x [N, D] per token over groups of `group` channels, packed, with fp16 scale and zero
        [N, D // group]: appending KIVI values in one pass, codes from the fp32 statistics as quant.py has them."""

    def quantize_pack_channels(self, x: torch.Tensor, bits: int, group: int
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Min-max codes of x [N, T, D] per channel over groups of `group` tokens (T a multiple), packed
        [bits, N, T, D // 8], with fp16 scale and zero [N, T // group, D]: appending KIVI keys."""

    def dequantize_tokens(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int,
                          group: int, offset: float = 0.0) -> torch.Tensor:
        """(code - offset) * scale + zero with per-token parameters [B, H, T, D // group] -> float32
        [B, H, T, D]: the dense read path (prefill, and decode steps the packed kernel does not serve)."""

    def dequantize_channels(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int,
                            group: int, offset: float = 0.0) -> torch.Tensor:
        """The same with per-channel parameters [B, H, T // group, D] (T a multiple of `group`)."""

    def decode_attention(self, q: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, k_zero: torch.Tensor,
                         v_codes: torch.Tensor, v_scale: torch.Tensor, v_zero: torch.Tensor, k_tail: torch.Tensor,
                         v_tail: torch.Tensor, *, bits_k: int, bits_v: int, group_k: int, group_v: int,
                         scaling: float) -> torch.Tensor:
        """One query per sequence q [B, Hq, D] over packed keys (per channel, groups of `group_k` tokens) and
        values (per token, groups of `group_v` channels) plus a full-precision tail [B, Hkv, Tt, D] -> [B, Hq, D]
        fp32: a decode step reads the cache without a dequantized copy. The codes may be strided token slices."""
