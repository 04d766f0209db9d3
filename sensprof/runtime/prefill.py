"""Prefill through the planned cache as the profiler measured it: each prompt position reads every earlier key and
value as the cache held it when that position ran, not as it is held once the chunk is in.

A streaming cache quantizes a token only once it is due (its per-channel group complete and out of the residual
window: memory.quantized_token_count), so within one prompt chunk a query early in a group reads the group's
tokens in full precision and a later one reads them quantized. The chunk's attention therefore reads two
versions of the tokens that change state during the chunk, with the profiler's rule (taps.full_precision_from).
It runs a block of queries at a time over only what that block can read: positions up to its last query, one
version where every query of the block reads the same one, and both versions, masked per query, over the band
where the block's queries differ (about a block wide), so a long prompt costs about one causal attention, not
one attention over every version of every position.
"""

from __future__ import annotations

import torch

from ..profiling.hooks import plain_attention
from ..quant import quantize_query
from ..profiling.taps import full_precision_from, reads_quantized

EXACT_QUERY_BLOCK = 256  # queries per call: the band of two versions is about this wide


class PrefillKV:
    """Stands for a PlannedLayer's keys or values during a prompt chunk: the attention function asks the layer for
    the streaming-exact attention instead of reading one tensor."""

    def __init__(self, layer, which: str, versions):
        self.layer, self.which, self.versions = layer, which, versions

    @property
    def shape(self):
        return self.versions[0].shape

    @property
    def dtype(self):
        return self.versions[0].dtype

    @property
    def device(self):
        return self.versions[0].device


def full_precision_versions(store, before: torch.Tensor | None, new: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """Every held token (`held`: the store's dense read now), with the tokens that were not yet quantized when the
    chunk began (`before`, then the chunk's own `new` ones) in full precision: what the chunk's earliest queries
    read. The store only decides which tokens are quantized, so an unquantized scheme gives `held` back."""
    if store.scheme.is_identity:
        return held
    fresh = new if before is None or not before.shape[-2] else torch.cat([before, new], dim=-2)
    return torch.cat([held[..., :held.shape[-2] - fresh.shape[-2], :], fresh.to(held.dtype)], dim=-2)


class _Reads:
    """Which version of a position a query reads: quantized iff sink <= j < fp_from[row] (fp_from None: every j past
    the sinks), none for an unquantized scheme."""

    def __init__(self, scheme, n: int, device):
        self.none = scheme.is_identity
        self.sink = 0 if self.none else scheme.sink
        self.fp_from = None if self.none else full_precision_from(scheme, n, device)

    def bounds(self, r0: int, r1: int, end: int) -> tuple[int, int, int]:
        """(sink, lo, hi) for rows [r0, r1): positions [sink, lo) are read quantized by every row, [lo, hi) by some."""
        if self.none:
            return 0, 0, 0
        if self.fp_from is None:
            return self.sink, end, end
        lo, hi = int(self.fp_from[r0]), int(self.fp_from[r1 - 1])  # fp_from never decreases
        return self.sink, max(lo, self.sink), max(hi, self.sink)

    def quantized(self, rows: torch.Tensor, cols: slice) -> torch.Tensor:
        """[len(rows), len(cols)] bool for a mixed segment."""
        return reads_quantized(self.sink, self.fp_from[rows], torch.arange(cols.start, cols.stop, device=rows.device))


def _state(bounds: tuple[int, int, int], a: int) -> str:
    """A segment [a, b) between breakpoints is wholly before the sinks, quantized, mixed, or after (full precision)."""
    sink, lo, hi = bounds
    return "fp" if a < sink or a >= hi else ("q" if a < lo else "mixed")


def exact_prefill_attention(fallback, module, query, keys, values, k_scheme, v_scheme, attention_mask, kwargs):
    """The chunk's attention output [B, q, Hq, D]: query rows are the last q of the n held positions.

    keys / values: (as held now, with the chunk's changed tokens in full precision), each [B, H, n, D]."""
    (k_q, k_fp), (v_q, v_fp) = keys, values
    query = quantize_query(k_scheme, query)  # an engine's query transform (the profiler's QuantTap applies it too)
    n, q = k_q.shape[-2], query.shape[-2]
    neg = torch.finfo(query.dtype).min
    mask = attention_mask
    if mask is not None and mask.dtype == torch.bool:  # the parts are joined by an additive mask
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, neg)
    rk, rv = _Reads(k_scheme, n, query.device), _Reads(v_scheme, n, query.device)
    if not any(lo < hi for _, lo, hi in (rk.bounds(n - q, n, n), rv.bounds(n - q, n, n))):
        # no token changes state within the chunk: every query reads K and V as held now, in one call
        return plain_attention(fallback, module, query, k_q, v_q, attention_mask, **kwargs)[0]
    versions = {"k": {"q": k_q, "fp": k_fp}, "v": {"q": v_q, "fp": v_fp}}
    outs = []
    for lo in range(0, q, EXACT_QUERY_BLOCK):
        hi = min(q, lo + EXACT_QUERY_BLOCK)
        r0, r1 = n - q + lo, n - q + hi  # the block's rows; no row reads past r1 - 1
        rows = torch.arange(r0, r1, device=query.device)
        kb, vb = rk.bounds(r0, r1, r1), rv.bounds(r0, r1, r1)
        cuts = sorted({0, r1, *(min(max(x, 0), r1) for x in kb + vb)})
        block = None if mask is None else mask[..., lo:hi, :n]
        if block is None:  # causal
            block = torch.zeros(hi - lo, r1, dtype=query.dtype, device=query.device).masked_fill_(
                torch.arange(r1, device=query.device)[None, :] > rows[:, None], neg)[None, None]
        ks, vs, ms = [], [], []
        for a, b in zip(cuts, cuts[1:]):
            if a == b:
                continue
            cols = block[..., a:b]
            sk, sv = _state(kb, a), _state(vb, a)
            for kv in (("q", "fp") if sk == "mixed" else (sk,)):
                for vv in (("q", "fp") if sv == "mixed" else (sv,)):
                    reads = None
                    if sk == "mixed":
                        reads = rk.quantized(rows, slice(a, b)) == (kv == "q")
                    if sv == "mixed":
                        rv_reads = rv.quantized(rows, slice(a, b)) == (vv == "q")
                        reads = rv_reads if reads is None else reads & rv_reads
                    ks.append(versions["k"][kv][..., a:b, :])
                    vs.append(versions["v"][vv][..., a:b, :])
                    ms.append(cols if reads is None else cols.masked_fill(~reads, neg))
        one = len(ks) == 1
        out, _ = plain_attention(fallback, module, query[..., lo:hi, :], ks[0] if one else torch.cat(ks, dim=-2),
                                 vs[0] if one else torch.cat(vs, dim=-2), ms[0] if one else torch.cat(ms, dim=-1),
                                 **kwargs)
        outs.append(out)
    return torch.cat(outs, dim=1)
