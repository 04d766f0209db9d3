"""One layer's K or V as a streaming quantized cache holds it.

Sink tokens and the tokens not yet due for quantization stay in the model dtype; the rest are
packed codes plus scales and zero-points, exactly by memory.quantized_token_count (the rule the
profiler and the planner use), so the runtime holds what the profile measured and the plan priced.
"""

from __future__ import annotations

import torch

from ..errors import SensprofError
from ..memory import CONSTANT_SCALE_BITS, quantized_token_count
from ..quant import (
    Quantized,
    dequantize_groups,
    group_last,
    quantize_groups,
    ungroup_last,
)
from ..schemes import QuantScheme
from .kernels import KernelBackend, select


def runtime_problem(scheme: QuantScheme, head_dim: int) -> str | None:
    """Why the runtime cannot store this scheme, or None."""
    if scheme.is_engine or scheme.query:
        return (f"{scheme.name} is vLLM's own format (emulated for profiling and validation); "
                "the runtime stores sensprof's formats only")
    if scheme.pre_rope:
        return "keys stored before RoPE (_pre) would need RoPE re-applied at every read"
    if scheme.format == "int" and scheme.granularity in ("token", "channel") and head_dim % 8:
        return f"bit-plane packing needs head_dim divisible by 8 (got {head_dim})"
    return None


class TensorStore:
    def __init__(self, scheme: QuantScheme, absmax: torch.Tensor | None = None, sliding: bool = False,
                 kernels: str = "auto"):
        self.scheme = scheme
        self.preference = kernels
        self.kernels: KernelBackend | None = None  # chosen on the first append (when the device is known)
        self.sliding = sliding
        self.absmax = absmax
        if scheme.scale_source == "calibrated" and absmax is None:
            raise SensprofError(f"scheme {scheme.name} needs calibrated scales; the plan carries none for this layer")
        self.sink: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # full precision, not yet due for quantization
        self.chunks: list[Quantized] = []
        self.chunk_tokens: list[int] = []
        self.flushed = 0  # body tokens that left `pending`: quantized, or evicted by a sliding window first
        self.total = 0
        self.dropped = 0  # tokens evicted from the front (sliding windows)
        self.dtype = None

    # ------------------------------------------------------------------ writing
    def append(self, x: torch.Tensor) -> None:
        self.dtype = x.dtype
        if self.sink is None:
            self.sink = x[..., :0, :]
            self.pending = x[..., :0, :]
        s = self.scheme
        # the first S tokens ever seen are the sinks (even after a sliding window evicted them)
        take = max(0, min(s.sink - self.total, x.shape[-2])) if not s.is_identity else 0
        if take:
            self.sink = torch.cat([self.sink, x[..., :take, :]], dim=-2)
        self.pending = torch.cat([self.pending, x[..., take:, :]], dim=-2)
        self.total += x.shape[-2]
        due = min(quantized_token_count(s, self.total) - self.flushed, self.pending.shape[-2])
        if due > 0:
            self._quantize(self.pending[..., :due, :])
            self.pending = self.pending[..., due:, :]

    def _quantize(self, y: torch.Tensor) -> None:
        self.chunks.append(self._quantize_pack(y))
        self.chunk_tokens.append(y.shape[-2])
        self.flushed += y.shape[-2]
        if len(self.chunks) > 1 and not self.sliding:
            self._merge()

    def _quantize_pack(self, y: torch.Tensor) -> Quantized:
        """Codes as the profiler computes them, stored packed in the kernels' layout:
        bit-planes [bits, B, H, T, D/8]; per-token scales [B, H, T, D/g]; per-channel [B, H, T/G, D]."""
        s = self.scheme
        b, h, t, d = y.shape
        if s.codec == "minmax" and s.scale_bits == 16 and s.zero_bits == 16 and s.granularity in ("token", "channel"):
            ops = self._kernels(y.device)
            if s.granularity == "token":
                g = min(s.group or d, d)
                codes, scale, zero = ops.quantize_pack_tokens(y.reshape(-1, d), s.bits, g)
                return Quantized(codes.view(s.bits, b, h, t, d // 8), scale.view(b, h, t, d // g),
                                 zero.view(b, h, t, d // g))
            codes, scale, zero = ops.quantize_pack_channels(y.reshape(b * h, t, d), s.bits, s.group)
            return Quantized(codes.view(s.bits, b, h, t, d // 8), scale.view(b, h, t // s.group, d),
                             zero.view(b, h, t // s.group, d))
        yf = y.float()
        half = (lambda v: v.half()) if s.scale_bits == 16 else (lambda v: v)
        half_zero = (lambda v: v.half()) if s.zero_bits == 16 else (lambda v: v)
        zero = None
        if s.granularity == "token":
            q = quantize_groups(group_last(yf, min(s.group or d, d)), s)
            if s.codec == "fp8":
                return q  # float8 codes [B, H, T, n, g]; fp32 scale per group
            codes, scale = q.codes.reshape(b, h, t, d), half(q.scale.squeeze(-1))
            if q.zero is not None:
                zero = half_zero(q.zero.squeeze(-1))
        elif s.granularity == "channel":
            q = quantize_groups(group_last(yf.transpose(-1, -2), s.group), s)  # [B, H, D, T/G, G]
            codes = ungroup_last(q.codes, t).transpose(-1, -2)
            scale = half(q.scale.squeeze(-1).transpose(-1, -2))
            if q.zero is not None:
                zero = half_zero(q.zero.squeeze(-1).transpose(-1, -2))
        else:
            a = self.absmax
            if a is not None:
                a = a.float().to(y.device)
                a = a.amax().reshape(1, 1, 1, 1) if s.granularity == "tensor" else a.reshape(1, -1, 1, 1)
            q = quantize_groups(yf, s, a)
            scale = q.scale.reshape(-1)[:1] if s.granularity == "tensor" else q.scale[:1, :, :1, :1]
            if s.codec == "fp8":
                return Quantized(q.codes, scale, None)
            codes = q.codes
        codes = codes + (2 ** (s.bits - 1) - 1 if s.codec == "absmax" else 0)
        return Quantized(self._kernels(y.device).pack_bitplanes(codes, s.bits), scale.contiguous(),
                         None if zero is None else zero.contiguous())

    def _kernels(self, device) -> KernelBackend:
        if self.kernels is None:
            self.kernels = select(self.preference, device)
        return self.kernels

    def _merge(self) -> None:
        """One packed chunk instead of one per decode step: reading then unpacks one tensor, not thousands.
        (Sliding windows keep chunks apart so the oldest can be evicted whole.)"""
        s = self.scheme
        code_dim = 2 if s.codec == "fp8" else 3  # float8 [B, H, T, ...]; bit-planes [bits, B, H, T, D/8]
        grows = s.granularity in ("token", "channel")  # per-group parameters grow with tokens, along dim 2
        codes = torch.cat([q.codes for q in self.chunks], dim=code_dim)
        if not grows:  # one constant scale per layer or per head
            scale, zero = self.chunks[0].scale, self.chunks[0].zero
        else:
            scale = torch.cat([q.scale for q in self.chunks], dim=2)
            zero = None if self.chunks[0].zero is None else torch.cat([q.zero for q in self.chunks], dim=2)
        self.chunks = [Quantized(codes, scale, zero)]
        self.chunk_tokens = [sum(self.chunk_tokens)]

    # ------------------------------------------------------------------ reading
    def _dequant(self, q: Quantized, lo: int, hi: int) -> torch.Tensor:
        """Tokens [lo, hi) of a packed chunk, dequantized in float32: [B, H, hi - lo, D].
        Table-driven unpacking and in-place scaling: no grouped copies of the cache."""
        s = self.scheme
        if s.codec == "fp8":
            if s.granularity == "token":
                deq = dequantize_groups(Quantized(q.codes[:, :, lo:hi], q.scale[:, :, lo:hi], None), s)
                return deq.reshape(*deq.shape[:3], -1)
            return dequantize_groups(Quantized(q.codes[:, :, lo:hi], q.scale, None), s)
        if s.granularity == "channel":  # whole groups of G tokens, then trimmed
            g = s.group
            g0, g1 = lo // g, -(-hi // g)
            codes = q.codes[:, :, :, g0 * g:g1 * g]
        else:
            codes = q.codes[:, :, :, lo:hi]
        offset = {"absmax": 2 ** (s.bits - 1) - 1, "signed_max": 2 ** (s.bits - 1)}.get(s.codec, 0)
        ops = self._kernels(codes.device)
        if s.granularity == "token":
            zero = None if q.zero is None else q.zero[:, :, lo:hi]
            return ops.dequantize_tokens(codes, q.scale[:, :, lo:hi], zero, s.bits,
                                         codes.shape[-1] * 8 // q.scale.shape[-1], offset)
        if s.granularity == "channel":
            zero = None if q.zero is None else q.zero[:, :, g0:g1]
            f = ops.dequantize_channels(codes, q.scale[:, :, g0:g1], zero, s.bits, s.group, offset)
            return f[:, :, lo - g0 * s.group:hi - g0 * s.group]
        return ops.unpack_float(codes, s.bits, offset).mul_(q.scale.float())

    def dense(self) -> torch.Tensor:
        """Every held token, dequantized, in the model dtype: [B, H, T, D]."""
        return self.dense_range(0, self.seq_length())

    def dense_range(self, lo: int, hi: int) -> torch.Tensor:
        """Held tokens [lo, hi) (0 = the oldest still held), dequantized, in the model dtype."""
        b, h, _, d = self.pending.shape
        out = torch.empty(b, h, max(hi - lo, 0), d, dtype=self.dtype, device=self.pending.device)
        at = 0
        for part, n in self._parts():
            a, z = max(lo - at, 0), min(hi - at, n)
            if a < z:
                block = part[..., a:z, :] if isinstance(part, torch.Tensor) else self._dequant(part, a, z)
                out[..., at + a - lo:at + z - lo, :] = block
            at += n
        return out

    def _parts(self):
        yield self.sink, self.sink.shape[-2]
        yield from zip(self.chunks, self.chunk_tokens)
        yield self.pending, self.pending.shape[-2]

    def packed_body(self):
        """(first held position, tokens, packed chunk) of the one merged chunk, or None."""
        if len(self.chunks) != 1:
            return None
        return self.sink.shape[-2], self.chunk_tokens[0], self.chunks[0]

    def seq_length(self) -> int:
        return self.total - self.dropped

    # ------------------------------------------------------------------ sliding windows
    def drop_front(self, keep: int) -> None:
        """Evict the oldest tokens beyond the last `keep` (sliding windows), never splitting a packed chunk;
        what a partial chunk keeps beyond `keep` is hidden by the attention mask."""
        excess = self.seq_length() - keep
        if excess <= 0:
            return
        n = min(excess, self.sink.shape[-2])
        self.sink, excess, self.dropped = self.sink[..., n:, :], excess - n, self.dropped + n
        while self.chunks and self.chunk_tokens[0] <= excess:
            n = self.chunk_tokens.pop(0)
            self.chunks.pop(0)
            excess, self.dropped = excess - n, self.dropped + n
        if not self.chunks and excess > 0 and self.scheme.granularity != "channel":
            # a per-channel group must see all of its G tokens (as the profiler's statistics did) before
            # they may go; per-token statistics need no neighbours
            n = min(excess, self.pending.shape[-2])
            self.pending, self.dropped, self.flushed = self.pending[..., n:, :], self.dropped + n, self.flushed + n

    # ------------------------------------------------------------------ accounting
    def nbytes(self) -> int:
        """Bytes of every stored tensor: sinks, pending tokens, packed codes, scales, zero-points."""
        total = 0
        for t in (self.sink, self.pending):
            if t is not None:
                total += t.numel() * t.element_size()
        for q in self.chunks:
            for t in (q.codes, q.zero) + ((q.scale,) if self.scheme.granularity in ("token", "channel") else ()):
                if t is not None:
                    total += t.numel() * t.element_size()
        if self.chunks and self.scheme.granularity == "tensor" and self.scheme.scale_source != "unit":
            total += CONSTANT_SCALE_BITS // 8
        elif self.chunks and self.scheme.granularity == "head":
            total += CONSTANT_SCALE_BITS // 8 * self.chunks[0].scale.numel()
        return total
