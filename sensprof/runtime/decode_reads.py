"""What one layer's decode step hands the kernel: K and V packed over the tokens both hold packed, and the rest of
the held tokens as a full-precision tail, kept from one step to the next.

From one step to the next almost nothing changes: the packed reads cover the same tokens until a key group packs,
and the tail gains the new token. Rebuilding them each step cost more than the attention itself at short contexts
(a description of each read, views of every buffer, the tail's dequantized tokens and their concatenation), so
DecodeReads keeps both and only redoes what a step changed: the reads when the tokens they cover or the buffers
under them move, the tail when a token in it changes state (packs), else the tail gains one row.
"""

from __future__ import annotations

import torch

from .kernels import PackedRead
from .store import ROOM_KEPT, GrowingBuffer, TensorStore


def overlap(k_store: TensorStore, v_store: TensorStore, spans, lo: int) -> tuple[int, int]:
    """The absolute positions [a, b) >= lo that K and V both hold packed (spans: their packed_span()), starting on
    whole groups of both reads and ending on a whole key group (the fast kernels' whole-group layouts stay whole);
    a = b = lo when there are none."""
    k_span, v_span = spans
    if k_span is None or v_span is None:
        return lo, lo
    (k0, nk), (v0, nv) = k_span, v_span
    gk, gv = k_store.read_token_group(), v_store.read_token_group()
    a, end = max(k0, v0, lo), min(k0 + nk, v0 + nv)
    while a < end and ((a - k0) % gk or (a - v0) % gv):
        a += 1
    b = a + (end - a) // gk * gk
    return (a, b) if b > a else (lo, lo)


def packed_reads(k_store: TensorStore, v_store: TensorStore, a: int, b: int) -> tuple[PackedRead, PackedRead]:
    """K's and V's reads of the absolute positions [a, b) (views of the stores' buffers), or empty ones."""
    if b == a:
        return no_tokens(k_store), no_tokens(v_store)
    reads = []
    for store in (k_store, v_store):
        first, n, read = store.packed_read()
        first += store.dropped
        reads.append(read if (a, b) == (first, first + n) else read.narrow(a - first, b - first))
    return tuple(reads)


def tail(store: TensorStore, lo: int, a: int, b: int, t: int) -> torch.Tensor:
    """The held tokens of [lo, a) and [b, t) (absolute positions) in the model dtype, in that order: a view when one
    part holds them all, else one concatenation."""
    d = store.dropped
    blocks = [x.to(store.dtype) for lo_, hi_ in ((lo, a), (b, t)) for _, x in store.dense_blocks(lo_ - d, hi_ - d)]
    if len(blocks) == 1:
        return blocks[0]
    if not blocks:
        p = store.pending
        return p.new_empty(*p.shape[:2], 0, p.shape[-1])
    return torch.cat(blocks, dim=-2)


def no_tokens(store: TensorStore) -> PackedRead:
    """An empty read (every token is in the tail), in the layout of a 1-bit minmax code."""
    b, h, _, d = store.pending.shape
    dev = store.pending.device
    empty = torch.zeros(b, h, 0, d, dtype=torch.float16, device=dev)
    return PackedRead(codes=torch.zeros(1, b, h, 0, d // 8 or 1, dtype=torch.uint8, device=dev), scale=empty,
                      zero=empty, lut=torch.arange(2, dtype=torch.float32, device=dev), bits=1, token_group=1,
                      channel_group=1, offset=0.0)


class DecodeReads:
    """One layer's reads, kept between decode steps (valid while the stores only append; every check is on counts,
    so a step that reuses them costs a few integer comparisons)."""

    def __init__(self):
        self._reads_key = None
        self._reads: tuple[PackedRead, PackedRead] | None = None
        self._tail_key = None
        self._tail_t = 0  # the absolute end of the kept tail
        self._tail_ends = (0, 0)  # K's and V's packed ends when the tail was last brought up to date
        self._tails = (GrowingBuffer(2, ROOM_KEPT), GrowingBuffer(2, ROOM_KEPT))
        self._empty: tuple[torch.Tensor, torch.Tensor] | None = None  # K's and V's empty tails

    def step(self, k_store: TensorStore, v_store: TensorStore, lo: int, t: int):
        """(a, b, K read, V read, K tail, V tail) for a step reading the held positions [lo, t)."""
        stores = (k_store, v_store)
        spans = tuple(s.packed_span() for s in stores)
        a, b = overlap(k_store, v_store, spans, lo)
        key = (a, b) + tuple(x for s, span in zip(stores, spans) for x in ((span or (None,))[0], s.layout_moves()))
        if key != self._reads_key:
            self._reads, self._reads_key = packed_reads(k_store, v_store, a, b), key
        return (a, b, *self._reads, *self._tail(stores, spans, lo, a, b, t))

    def _tail(self, stores, spans, lo: int, a: int, b: int, t: int):
        """The tails of [lo, a) and [b, t): the last step's plus the new token's row where no held token of them has
        changed state since (a token packed since is read dequantized now; one pending is read as appended)."""
        if a == lo and b == t:  # every held token is read packed (per-token layouts on both sides)
            if self._empty is None:
                self._empty = tuple(tail(s, lo, a, b, t) for s in stores)
            self._tail_key = None
            return self._empty
        # where each side's packed tokens end (where none are, where they would start: after the sinks)
        ends = tuple(sum(span) if span else s.dropped + s.sink.shape[-2] for s, span in zip(stores, spans))
        key = (lo, a, b) + tuple(s.dropped for s in stores)
        grows = key == self._tail_key and t == self._tail_t + 1 and all(
            max(before, b) >= min(now, self._tail_t) for before, now in zip(self._tail_ends, ends))
        for buffer, store in zip(self._tails, stores):
            if grows:
                buffer.append(store.dense_token(t - 1 - store.dropped))
            else:
                buffer.drop_front(buffer.length)
                buffer.append(tail(store, lo, a, b, t))
        self._tail_key, self._tail_t, self._tail_ends = key, t, ends
        return tuple(buffer.view() for buffer in self._tails)
