"""One layer's K or V as a streaming quantized cache holds it.

Sink tokens and the tokens not yet due for quantization stay in the model dtype; the rest are
packed codes plus scales and zero-points, exactly by memory.quantized_token_count (the rule the
profiler and the planner use), so the runtime holds what the profile measured and the plan priced.
"""

from __future__ import annotations

import torch

from ..errors import SensprofError
from ..memory import CONSTANT_SCALE_BITS, quantized_token_count
from ..quant import Quantized, group_last, ungroup_last, dequantize_groups, quantize_groups
from ..schemes import QuantScheme
from .kernels import pack_bitplanes, unpack_bitplanes


def runtime_problem(scheme: QuantScheme, head_dim: int) -> str | None:
    """Why the runtime cannot store this scheme, or None."""
    if scheme.pre_rope:
        return "keys stored before RoPE (_pre) would need RoPE re-applied at every read"
    if scheme.format == "int" and scheme.granularity in ("token", "channel") and head_dim % 8:
        return f"bit-plane packing needs head_dim divisible by 8 (got {head_dim})"
    return None


class TensorStore:
    def __init__(self, scheme: QuantScheme, absmax: torch.Tensor | None = None, sliding: bool = False):
        self.scheme = scheme
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
        s = self.scheme
        yf = y.float()
        if s.granularity == "token":
            d = yf.shape[-1]
            q = quantize_groups(group_last(yf, min(s.group or d, d)), s)
        elif s.granularity == "channel":
            q = quantize_groups(group_last(yf.transpose(-1, -2), s.group), s)
        else:
            a = self.absmax
            if a is not None:
                a = a.float().to(y.device)
                a = a.amax().reshape(1, 1, 1, 1) if s.granularity == "tensor" else a.reshape(1, -1, 1, 1)
            q = quantize_groups(yf, s, a)
            q = Quantized(q.codes, q.scale.reshape(-1)[:1] if s.granularity == "tensor" else q.scale[:1, :, :1, :1],
                          q.zero)
        self.chunks.append(self._pack(q, y.shape))
        self.chunk_tokens.append(y.shape[-2])
        self.flushed += y.shape[-2]
        if len(self.chunks) > 1 and not self.sliding:
            self._merge()

    def _merge(self) -> None:
        """One packed chunk instead of one per decode step: reading then unpacks one tensor, not thousands.
        (Sliding windows keep chunks apart so the oldest can be evicted whole.)"""
        s = self.scheme
        code_dim = 2 if s.codec == "fp8" else 3  # float8 [B, H, T, ...]; bit-planes [bits, B, H, T, D/8]
        scale_dim = {"token": 2, "channel": 3}.get(s.granularity)  # per-group parameters grow with tokens
        codes = torch.cat([q.codes for q in self.chunks], dim=code_dim)
        if scale_dim is None:  # one constant scale per layer or per head
            scale, zero = self.chunks[0].scale, self.chunks[0].zero
        else:
            scale = torch.cat([q.scale for q in self.chunks], dim=scale_dim)
            zero = None if self.chunks[0].zero is None else torch.cat([q.zero for q in self.chunks], dim=scale_dim)
        self.chunks = [Quantized(codes, scale, zero)]
        self.chunk_tokens = [sum(self.chunk_tokens)]

    def _pack(self, q: Quantized, shape) -> Quantized:
        s = self.scheme
        if s.codec == "fp8":
            return q  # float8 codes; scale fp32 (per token) or one constant
        offset = 2 ** (s.bits - 1) - 1 if s.codec == "absmax" else 0
        codes = q.codes + offset
        if s.granularity == "channel":  # codes are [B, H, D, n_groups, G]: back to [B, H, T, D] to pack along D
            codes = ungroup_last(codes, shape[-2]).transpose(-1, -2)
        else:
            codes = codes.reshape(*shape[:-1], -1)[..., : shape[-1]] if s.granularity == "token" else codes
        half = (lambda t: t.half()) if s.scale_bits == 16 else (lambda t: t)
        zero = None if q.zero is None else (q.zero.half() if s.zero_bits == 16 else q.zero)
        scale = half(q.scale) if s.granularity in ("token", "channel") else q.scale
        return Quantized(pack_bitplanes(codes, s.bits), scale, zero)

    # ------------------------------------------------------------------ reading
    def _unpack(self, q: Quantized, n: int, d: int) -> torch.Tensor:
        s = self.scheme
        if s.codec == "fp8":
            deq = dequantize_groups(q, s)
            return ungroup_last(deq, d) if s.granularity == "token" else deq
        offset = 2 ** (s.bits - 1) - 1 if s.codec == "absmax" else 0
        codes = unpack_bitplanes(q.codes, s.bits).float() - offset
        scale = q.scale.float()
        zero = None if q.zero is None else q.zero.float()
        if s.granularity == "token":
            g = min(s.group or d, d)
            deq = dequantize_groups(Quantized(group_last(codes, g), scale, zero), s)
            return ungroup_last(deq, d)
        if s.granularity == "channel":
            deq = dequantize_groups(Quantized(group_last(codes.transpose(-1, -2), s.group), scale, zero), s)
            return ungroup_last(deq, n).transpose(-1, -2)
        return dequantize_groups(Quantized(codes, scale, zero), s)

    def dense(self) -> torch.Tensor:
        """Every held token, dequantized, in the model dtype: [B, H, T, D]."""
        parts = [self.sink]
        d = self.pending.shape[-1]
        for q, n in zip(self.chunks, self.chunk_tokens):
            parts.append(self._unpack(q, n, d).to(self.dtype))
        parts.append(self.pending)
        return torch.cat(parts, dim=-2)

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
