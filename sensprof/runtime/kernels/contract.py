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

from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class PackedRead:
    """One of a layer's K or V as a kernel reads it in place, whatever the scheme:
    value[b, h, t, d] = lut[code[b, h, t, d]] * scale[b, h, t // token_group, d // channel_group] + zero[same].

    One description for every codec (minmax, absmax and signed-max integers are a shifted identity table, fp8 is the
    table of its 256 bit patterns, codebook formats are their codebook) and every granularity (per token, per
    channel, per head or per tensor are only different groups; a constant scale is an expanded view, stride 0), so
    a backend needs one decode kernel, not one per layout.
    codes: "planes" uint8 bit-planes [bits, B, H, T, D // 8] (plane k holds bit k of eight codes a byte), or
      "bytes" uint8 [B, H, T, D] (one 8-bit code a byte: fp8 bit patterns), or "dense": the values themselves,
      float32 / float16 / bfloat16 [B, H, T, D] (a side the plan leaves unquantized; its lut, scale and zero are
      not read: dense_read builds one).
    scale / zero (zero may be None): float16 or float32, indexable as [B, H, ceil(T / token_group),
      D // channel_group] (any strides).
    lut: float32 [2 ** bits]; offset: not None when lut[c] = c - offset (the integer codecs), so a kernel may
      compute the value instead of looking it up.
    rope: keys stored before RoPE: (cos, sin) [B, T, R / 2] of each token's position, applied to the dequantized
      tile (rotate-half over the first R channels) before q.k; None for everything else.
    word: the scale is vLLM's int4 fp32 word, one per token and head (token_group 1, channel_group D, zero None):
      the zero-point code sits in its low 4 mantissa bits (split_word), decoded by the kernel as it reads.
    wide: channels d < wide (a multiple of 8) have one more code bit, held as plane `bits` at the same strides
      (wide_plane(): the planes are then parts of one row of bytes per token, as Octave's keys are held); the
      other channels read lut[2 ** (bits + 1) + code], a second codebook. 0 for every other layout.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    lut: torch.Tensor
    bits: int
    token_group: int
    channel_group: int
    offset: float | None = None
    packing: str = "planes"
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    word: bool = False
    wide: int = 0
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    """What a backend derives from the read once (the C kernels' description of its tensors), reused while a layer
    keeps the read between decode steps; every read starts with an empty one (narrowed ones too: replace() does not
    copy it)."""

    @property
    def tokens(self) -> int:
        return self.codes.shape[3 if self.packing == "planes" else 2]

    @property
    def head_dim(self) -> int:
        return self.codes.shape[-1] * (8 if self.packing == "planes" else 1)

    @property
    def dense(self) -> bool:
        return self.packing == "dense"

    def wide_plane(self) -> torch.Tensor:
        """The extra bit of the wide channels: [B, H, T, wide // 8] uint8, a view at plane `bits`."""
        c = self.codes
        return c.as_strided((*c.shape[1:4], self.wide // 8), c.stride()[1:], c.storage_offset() + self.bits * c.stride(0))

    def narrow(self, lo: int, hi: int) -> "PackedRead":
        """Tokens [lo, hi) as views (lo a multiple of token_group)."""
        if lo % self.token_group:
            raise ValueError(f"a read must start on a token group ({self.token_group}), not at {lo}")
        codes = self.codes[:, :, :, lo:hi] if self.packing == "planes" else self.codes[..., lo:hi, :]
        g0, g1 = lo // self.token_group, -(-hi // self.token_group)
        part = (lambda x: None if x is None else x[:, :, g0:g1])
        rope = None if self.rope is None else tuple(x[:, lo:hi] for x in self.rope)
        return replace(self, codes=codes, scale=part(self.scale), zero=part(self.zero), rope=rope)


def dense_read(values: torch.Tensor) -> PackedRead:
    """Unquantized K or V [B, H, T, D] read in place by the same kernels: a layer with one side unquantized (or
    none quantized) decodes packed too, with no dense copy of the cache on each step."""
    b, h, t, _ = values.shape
    one = torch.ones(1, 1, 1, 1, device=values.device).expand(b, h, t, 1)
    return PackedRead(codes=values, scale=one, zero=None, lut=one.new_zeros(1), bits=8 * values.element_size(),
                      token_group=1, channel_group=values.shape[-1], packing="dense")


def split_word(word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int4 fp32 word -> (scale, zero) float32: the scale is the word with its low 4 bits cleared, the zero
    -zp * scale (zp those 4 bits), so value = code * scale + zero = (code - zp) * scale."""
    bits = word.view(torch.int32)
    scale = (bits & -16).view(torch.float32)
    return scale, -(bits & 15).float() * scale


def _fp16_minmax(r: PackedRead) -> bool:
    return (r.packing == "planes" and r.offset == 0 and r.rope is None and r.zero is not None
            and r.scale.dtype == torch.float16 and r.zero.dtype == torch.float16)


def kivi_keys(r: PackedRead) -> bool:
    """Min-max codes per channel over whole groups of tokens with fp16 scale and zero: the layout the first fast
    kernels were written for (KIVI keys)."""
    return _fp16_minmax(r) and r.channel_group == 1 and r.tokens % r.token_group == 0


def kivi_values(r: PackedRead) -> bool:
    """Min-max codes per token over groups of channels with fp16 scale and zero (KIVI values)."""
    return _fp16_minmax(r) and r.token_group == 1


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

    def quantize_pack_int4_rht(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's int4_per_token_head write of x [N, D] (the model's dtype), bit for bit as
        engines/vllm/per_token_head.quantize_int4 computes it: the Hadamard-rotated codes as 4 bit-planes
        [4, N, D // 8] and the fp32 word [N] (scale, zero-point in its low 4 bits): a vLLM plan's append in one pass."""

    def decode_attention(self, q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor,
                         v_tail: torch.Tensor, *, scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One query per sequence q [B, Hq, D] over packed keys and values (any layout PackedRead describes; K and
        V hold the same T tokens) plus a full-precision tail [B, Hkv, Tt, D] -> [B, Hq, D] fp32: a decode step reads
        the cache without a dequantized copy. mask: bool [B, T + Tt] (the packed tokens, then the tail), False =
        not read (left padding, tokens a sliding window has passed); None = read every token. The codes may be
        strided token slices."""
