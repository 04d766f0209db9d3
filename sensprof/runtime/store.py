"""One layer's K or V as a streaming quantized cache holds it.

Sink tokens and the tokens not yet due for quantization stay in the model dtype; the rest are
packed codes plus scales and zero-points, exactly by memory.quantized_token_count (the rule the
profiler and the planner use), so the runtime holds what the profile measured and the plan priced.
"""

from __future__ import annotations

from collections import deque

import torch

from ..errors import SensprofError
from ..memory import CONSTANT_SCALE_BITS, quantized_token_count
from ..quant import (
    FP8_DTYPES,
    Quantized,
    dequantize_groups,
    group_last,
    quantize_groups,
    ungroup_last,
)
from ..rope import apply_rope, undo_rope
from ..schemes import QuantScheme
from .engine_layouts import LAYOUTS, code_table, engine_layout, levels, patterns
from .kernels import KernelBackend, PackedRead, dense_read, select


def runtime_problem(scheme: QuantScheme, head_dim: int) -> str | None:
    """Why the runtime cannot store this scheme, or None."""
    layout = engine_layout(scheme) if scheme.is_engine else None
    if scheme.is_engine and layout is None:
        return (f"{scheme.name} is vLLM's own format, emulated for profiling and validation; of vLLM's formats the "
                f"runtime stores {', '.join(sorted({n.split('.')[1] for n in LAYOUTS}))}")
    if scheme.rotation:
        return (f"{scheme.name} is llama.cpp's rotated cache, emulated for profiling and validation; the runtime "
                f"stores the plain codec ({scheme.name.split('_', 1)[1].split('.')[0]})")
    why = layout.problem(head_dim) if hasattr(layout, "problem") else None  # a layout's own limits
    if why:
        return why
    if (scheme.format == "int" and scheme.granularity in ("token", "channel") or scheme.is_engine) and head_dim % 8:
        return f"bit-plane packing needs head_dim divisible by 8 (got {head_dim})"
    return None


ROOM_KEPT = 256  # tokens of room a buffer never gives back: a pending group drains and refills without churn


class GrowingBuffer:
    """A tensor that grows at the end and is consumed from the front along one dim, at amortised O(new items)
    per append: capacity doubles when full (one copy), and a dead front is reclaimed in place or shrunk away
    instead of growing, so what is allocated stays within twice what is held while it only grows (four times
    after evictions, before it shrinks)."""

    def __init__(self, dim: int, floor: int = 0):
        self.dim = dim
        self.floor = floor  # capacity (items) it never shrinks below
        self.data: torch.Tensor | None = None
        self.start = 0  # first live item
        self.length = 0  # live items
        self.reallocations = 0  # fresh allocations (each copies the live items once)
        self.moves = 0  # reallocations and compactions: views taken before one are stale

    def capacity(self) -> int:
        return 0 if self.data is None else self.data.shape[self.dim]

    def view(self) -> torch.Tensor | None:
        """The live items: a view of the buffer (valid until the next append or drop)."""
        return None if self.data is None else self.data.narrow(self.dim, self.start, self.length)

    def append(self, x: torch.Tensor) -> None:
        n = x.shape[self.dim]
        if n == 0 and self.data is not None:
            return
        if self.data is None or self.start + self.length + n > self.capacity():
            self._make_room(x, n)
        self.data.narrow(self.dim, self.start + self.length, n).copy_(x)
        self.length += n

    def drop_front(self, n: int) -> None:
        self.start, self.length = self.start + n, self.length - n
        if self.capacity() > self.floor and self.length * 4 <= self.capacity():
            self._reallocate(2 * self.length)  # a long prefill's space, no longer needed

    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()

    def _make_room(self, x: torch.Tensor, n: int) -> None:
        if self.data is None:
            self.data = x.new_empty(x.shape[:self.dim] + (n,) + x.shape[self.dim + 1:])
            self.reallocations += 1
        elif self.length + n <= self.capacity() // 2:
            self._compact()
        else:
            self._reallocate(2 * (self.length + n))

    def _compact(self) -> None:
        """Move the live items to the front; the caller ensures the dead front is at least as long as they are,
        so source and destination do not overlap."""
        live = self.view()
        self.data.narrow(self.dim, 0, self.length).copy_(live)
        self.start = 0
        self.moves += 1

    def _reallocate(self, capacity: int) -> None:
        shape = self.data.shape[:self.dim] + (capacity,) + self.data.shape[self.dim + 1:]
        data = self.data.new_empty(shape)
        data.narrow(self.dim, 0, self.length).copy_(self.view())
        self.data, self.start = data, 0
        self.reallocations += 1
        self.moves += 1


class TensorStore:
    """Sinks as appended; the body as packed codes, scales and zero-points in growing buffers (one merged chunk
    the kernels read in place); pending tokens in a growing buffer too: an append costs O(new tokens)."""

    def __init__(self, scheme: QuantScheme, absmax: torch.Tensor | None = None, sliding: bool = False,
                 kernels: str = "auto"):
        self.scheme = scheme
        self.engine = engine_layout(scheme) if scheme.is_engine else None  # an engine's own layout (engine_layouts)
        self.rope = None  # keys stored before RoPE: the layer's RopeTable (rope_table.py), set by the layer
        self.preference = kernels
        self.kernels: KernelBackend | None = None  # chosen on the first append (when the device is known)
        self.sliding = sliding
        self.absmax = absmax
        if scheme.scale_source == "calibrated" and absmax is None:
            raise SensprofError(f"scheme {scheme.name} needs calibrated scales; the plan carries none for this layer")
        self.sink: torch.Tensor | None = None
        # full precision [B, H, T, D], not yet due for quantization (at most residual + group - 1 tokens once due)
        self._pending = GrowingBuffer(2, ROOM_KEPT + 2 * (scheme.residual + (scheme.group or 0)))
        # float8 codes [B, H, T, ...]; bit-planes [bits, B, H, T, D/8]
        bytes_ = scheme.codec == "fp8" or (self.engine is not None and self.engine.packing == "bytes")
        self._codes = GrowingBuffer(2 if bytes_ else 3, ROOM_KEPT)
        self._grows = scheme.granularity in ("token", "channel")  # per-group parameters grow along dim 2
        per = ROOM_KEPT // scheme.group if scheme.granularity == "channel" else ROOM_KEPT  # a channel group: G tokens
        self._scale, self._zero = GrowingBuffer(2, per), GrowingBuffer(2, per)
        self._constant: tuple | None = None  # (scale, zero) of a per-tensor or per-head scheme
        self._token_group: int | None = None  # read_token_group, once a read was built
        # tokens quantized per append: a sliding window evicts them whole; otherwise one merged count
        self.chunk_tokens: deque[int] = deque()
        self.flushed = 0  # body tokens that left `pending`: quantized, or evicted by a sliding window first
        self.total = 0
        self.dropped = 0  # tokens evicted from the front (sliding windows)
        self.dtype = None

    def pending_copy(self) -> torch.Tensor | None:
        """The tokens not yet quantized, as they are now (the next append may overwrite the buffer)."""
        p = self.pending
        return None if p is None or self.scheme.is_identity else p.clone()

    @property
    def pending(self) -> torch.Tensor | None:
        """The tokens not yet due, in the model dtype: [B, H, T, D] (a view, valid until the next append)."""
        return self._pending.view()

    # ------------------------------------------------------------------ writing
    def append(self, x: torch.Tensor) -> None:
        self.dtype = x.dtype
        if self.sink is None:  # a tensor of its own: a view of x would keep the whole first append (a prefill) alive
            self.sink = x.new_empty(x.shape[:-2] + (0, x.shape[-1]))
            self._pending.append(x[..., :0, :])
        s = self.scheme
        # the first S tokens ever seen are the sinks (even after a sliding window evicted them)
        take = max(0, min(s.sink - self.total, x.shape[-2])) if not s.is_identity else 0
        if take:
            self.sink = torch.cat([self.sink, x[..., :take, :]], dim=-2)
        rest = x[..., take:, :]
        self.total += x.shape[-2]
        held = self._pending.length
        due = min(quantized_token_count(s, self.total) - self.flushed, held + rest.shape[-2])
        if due > 0:
            self._quantize(self._first_due(rest, due))
            self._pending.drop_front(min(due, held))
        self._pending.append(rest[..., max(due - held, 0):, :])

    def _first_due(self, rest: torch.Tensor, due: int) -> torch.Tensor:
        """The first `due` tokens of pending then `rest`: tokens due now never pass through the buffer."""
        held = self._pending.length
        if due <= held:
            return self.pending[..., :due, :]
        if not held:
            return rest[..., :due, :]
        return torch.cat([self.pending, rest[..., :due - held, :]], dim=-2)

    def _body_start(self) -> int:
        """The absolute position of the first packed token held."""
        return min(self.scheme.sink, self.total) + self.flushed - self._codes.length

    def _quantize(self, y: torch.Tensor) -> None:
        """Packed onto the end of the body: reading then unpacks one tensor, not one per decode step."""
        n = y.shape[-2]
        if self.scheme.pre_rope:  # the codes of the keys before RoPE, as the profiler's taps quantize them
            at = self._body_start() + self._codes.length  # the position after the last packed token
            y = undo_rope(y, *self.rope.full(at, at + n, y.dtype))
        q = self._quantize_pack(y)
        self._codes.append(q.codes)
        if self._grows:
            self._scale.append(q.scale)
            if q.zero is not None:
                self._zero.append(q.zero)
        elif self._constant is None:  # one constant scale per layer or per head, copied out of the append's tensors
            self._constant = tuple(None if t is None else t.clone() for t in (q.scale, q.zero))
        if self.sliding or not self.chunk_tokens:
            self.chunk_tokens.append(n)
        else:
            self.chunk_tokens[0] += n
        self.flushed += n

    def _quantize_pack(self, y: torch.Tensor) -> Quantized:
        """Codes as the profiler computes them, stored packed in the kernels' layout:
        bit-planes [bits, B, H, T, D/8]; per-token scales [B, H, T, D/g]; per-channel [B, H, T/G, D]."""
        s = self.scheme
        b, h, t, d = y.shape
        if self.engine is not None:
            return self.engine.pack(y, self._kernels(y.device))
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
        codes = codes + (_CODE_OFFSETS["absmax"](s.bits) if s.codec == "absmax" else 0)
        return Quantized(self._kernels(y.device).pack_bitplanes(codes, s.bits), scale.contiguous(),
                         None if zero is None else zero.contiguous())

    def _kernels(self, device) -> KernelBackend:
        if self.kernels is None:
            self.kernels = select(self.preference, device)
        return self.kernels

    # ------------------------------------------------------------------ reading
    def _dequant(self, q: Quantized, lo: int, hi: int) -> torch.Tensor:
        """Tokens [lo, hi) of a packed chunk, dequantized in float32: [B, H, hi - lo, D].
        Table-driven unpacking and in-place scaling: no grouped copies of the cache."""
        s = self.scheme
        if self.engine is not None:
            return self.engine.dense(q, lo, hi, self._kernels(q.codes.device))
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
        offset = _CODE_OFFSETS.get(s.codec, lambda b: 0)(s.bits)
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
        for at, block in self.dense_blocks(lo, hi):
            out[..., at - lo:at - lo + block.shape[-2], :] = block
        return out

    def dense_blocks(self, lo: int, hi: int):
        """(first position, block) covering held tokens [lo, hi) in order: views of the sinks and pending tokens,
        the packed ones dequantized (a decode step's tail is usually views only: no copy until the kernel's)."""
        at = 0
        for part, n in self._parts():
            a, z = max(lo - at, 0), min(hi - at, n)
            if a < z:
                if isinstance(part, torch.Tensor):
                    block = part[..., a:z, :]
                elif self.scheme.pre_rope:  # back to each token's position, in the model's dtype as the profiler
                    p0 = self._body_start()
                    block = apply_rope(self._dequant(part, a, z).to(self.dtype), *self.rope.full(p0 + a, p0 + z,
                                                                                               self.dtype))
                else:
                    block = self._dequant(part, a, z)
                yield at + a, block
            at += n

    def dense_token(self, i: int) -> torch.Tensor:
        """Held token i (0 = the oldest still held) in the model dtype, [B, H, 1, D]: what dense_range(i, i + 1)
        holds, without walking the parts (a decode step's tail gains one token a step)."""
        sinks, packed = self.sink.shape[-2], self._codes.length
        if i < sinks:
            return self.sink[..., i:i + 1, :]
        if i >= sinks + packed:
            return self.pending[..., i - sinks - packed:i - sinks - packed + 1, :]
        return next(self.dense_blocks(i, i + 1))[1].to(self.dtype)

    def _parts(self):
        yield self.sink, self.sink.shape[-2]
        if self._codes.length:
            yield self._body(), self._codes.length
        yield self.pending, self._pending.length

    def _body(self) -> Quantized:
        """The packed tokens held, as views of the buffers (valid until the next append or eviction)."""
        if not self._grows:
            return Quantized(self._codes.view(), *self._constant)
        return Quantized(self._codes.view(), self._scale.view(), self._zero.view() if self._zero.length else None)

    @property
    def chunks(self) -> list[Quantized]:
        """The packed tokens per quantizing append (one merged chunk unless sliding), as views."""
        if not self.chunk_tokens:
            return []
        body, out, at = self._body(), [], 0
        per = self.scheme.group if self.scheme.granularity == "channel" else 1
        for n in self.chunk_tokens:
            codes = body.codes.narrow(self._codes.dim, at, n)
            if self._grows:
                scale, zero = (None if t is None else t.narrow(2, at // per, n // per) for t in (body.scale, body.zero))
            else:
                scale, zero = body.scale, body.zero
            out.append(Quantized(codes, scale, zero))
            at += n
        return out

    def packed_read(self):
        """(first held position, tokens, PackedRead) of the packed tokens held, read in place by the decode
        kernels, or None when none are packed; an unquantized side is read as it is held (dense_read)."""
        span = self.packed_span()
        if span is None:
            return None
        first, n = span[0] - self.dropped, span[1]
        if self.scheme.is_identity:
            return first, n, dense_read(self.pending)
        body, s = self._body(), self.scheme
        if self.engine is not None:
            return first, n, self.engine.read(body)
        b, h = self.sink.shape[:2]
        d = self.sink.shape[-1]
        lut, offset = _code_table(s, body.codes.device)
        if s.codec == "fp8":
            codes = body.codes.reshape(b, h, n, d).view(torch.uint8)
            packing = "bytes"
        else:
            codes, packing = body.codes, "planes"
        if s.granularity == "channel":
            scale, zero, tg, cg = body.scale, body.zero, s.group, 1
        elif s.granularity == "token":
            scale, zero = body.scale.reshape(b, h, n, -1), body.zero
            tg, cg = 1, d // scale.shape[-1]
        else:  # one scale per tensor or per head: a constant, seen through a stride-0 view
            scale = body.scale.reshape(1, -1, 1, 1).float().expand(b, h, n, 1)
            zero, tg, cg = None, 1, d
        rope = None
        if s.pre_rope:
            p0 = self._body_start()
            rope = self.rope.halves(p0, p0 + n)
        read = PackedRead(codes=codes, scale=scale, zero=zero, lut=lut, bits=s.bits, token_group=tg,
                          channel_group=cg, offset=offset, packing=packing, rope=rope)
        return first, n, read

    def packed_span(self) -> tuple[int, int] | None:
        """(first absolute position, tokens) of what packed_read reads, without building the read."""
        if self.scheme.is_identity:
            held = self._pending.length
            return (self.dropped, held) if held else None
        n = self._codes.length
        return (self.dropped + self.sink.shape[-2], n) if n else None

    def read_token_group(self) -> int:
        """Tokens per scale row of packed_read (constant for a scheme); packed tokens must be held."""
        if self._token_group is None:
            self._token_group = self.packed_read()[2].token_group
        return self._token_group

    def layout_moves(self) -> int:
        """Counts every move of the held tensors (a buffer's reallocation or compaction): a read's views taken
        before the count changed are stale; appends and evictions leave them valid."""
        if self.scheme.is_identity:  # read as held: the pending buffer
            return self._pending.moves
        return sum(b.moves for b in (self._codes, self._scale, self._zero))

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
        while self.chunk_tokens and self.chunk_tokens[0] <= excess:
            n = self.chunk_tokens.popleft()
            self._drop_body(n)
            excess, self.dropped = excess - n, self.dropped + n
        if not self.chunk_tokens and excess > 0 and self.scheme.granularity != "channel":
            # a per-channel group must see all of its G tokens (as the profiler's statistics did) before
            # they may go; per-token statistics need no neighbours
            n = min(excess, self._pending.length)
            self._pending.drop_front(n)
            self.dropped, self.flushed = self.dropped + n, self.flushed + n

    def _drop_body(self, n: int) -> None:
        self._codes.drop_front(n)
        if self._grows:
            per = n // self.scheme.group if self.scheme.granularity == "channel" else n
            self._scale.drop_front(per)
            if self._zero.data is not None:
                self._zero.drop_front(per)

    # ------------------------------------------------------------------ accounting
    def nbytes(self) -> int:
        """Bytes of every stored tensor: sinks, pending tokens, packed codes, scales, zero-points."""
        held = (self.sink, self.pending, self._codes.view(), self._zero.view())
        held += (self._scale.view(),) if self._grows else ()
        return sum(_bytes(t) for t in held) + self._constant_nbytes()

    def capacity_nbytes(self) -> int:
        """Bytes allocated: nbytes plus the free room of the growing buffers (at most about as much again)."""
        buffers = (self._pending, self._codes, self._zero) + ((self._scale,) if self._grows else ())
        return _bytes(self.sink) + sum(b.nbytes() for b in buffers) + self._constant_nbytes()

    def reallocations(self) -> int:
        """Fresh allocations of the growing buffers so far (each copied what they held once)."""
        return sum(b.reallocations for b in (self._pending, self._codes, self._scale, self._zero))

    def _constant_nbytes(self) -> int:
        """A per-tensor or per-head scale, priced as the plan prices it, while any packed token is held."""
        s = self.scheme
        if not self._codes.length:
            return 0
        if s.granularity == "tensor" and s.scale_source != "unit":
            return CONSTANT_SCALE_BITS // 8
        if s.granularity == "head":
            return CONSTANT_SCALE_BITS // 8 * self._constant[0].numel()
        return 0


def _code_table(scheme: QuantScheme, device) -> tuple[torch.Tensor, float | None]:
    """code -> value before scaling (float32 [2^bits]) as the store keeps codes, and the affine offset where
    there is one: minmax codes as they are; absmax codes stored shifted by 2^(b-1) - 1; llama.cpp's signed-max
    codes centred on 2^(b-1); fp8 codes are their bit patterns."""
    if scheme.codec == "fp8":
        return code_table(patterns, str(device), FP8_DTYPES[scheme.format]), None
    offset = float(_CODE_OFFSETS.get(scheme.codec, lambda b: 0)(scheme.bits))
    return code_table(levels, str(device), 2 ** scheme.bits, offset), offset


_CODE_OFFSETS = {"absmax": lambda b: 2 ** (b - 1) - 1, "signed_max": lambda b: 2 ** (b - 1)}


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()
