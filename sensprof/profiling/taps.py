"""Per-layer attention taps: record statistics (baseline) or quantize K or V (profiling).

A tap is called by sensprof's attention function with the layer's post-RoPE K and V.
"""

from __future__ import annotations

import torch

from .hooks import plain_attention, query_blocks
from ..rope import apply_rope, undo_rope
from ..planning.pricing import check_reads  # noqa: F401  (the profiler checks its --reads here)
from ..metrics import MomentStats, attention_kl_sum, squared_errors
from ..quant import fake_quant, quantize_query
from ..schemes import QuantScheme


def full_precision_from(scheme: QuantScheme, n: int, device=None, reads: str = "streaming") -> torch.Tensor | None:
    """For each query position t, the first key position still held in full precision.

    What a streaming cache holds when query t runs: the `residual` most recent tokens, and with
    per-channel token groups every group not yet complete and out of that window. None: nothing recent.
    reads="all": no group waits to be complete (every token past the sinks and the scheme's residual window is
    read quantized, a per-channel group with the statistics of the whole group as fake_quant groups it).
    """
    seen = torch.arange(1, n + 1, device=device)
    start = seen - scheme.residual
    if scheme.granularity == "channel" and reads == "streaming":  # the same rule as memory.quantized_token_count
        out_of_window = (seen - scheme.sink - scheme.residual).clamp_min(0)
        start = scheme.sink + (out_of_window // scheme.group) * scheme.group
    if bool((start >= seen).all()):
        return None
    return start


def reads_quantized(sink: int, fp_from: torch.Tensor | None, j: torch.Tensor) -> torch.Tensor:
    """[rows, len(j)] bool: whether each query (its first full-precision position, fp_from [rows]) reads positions j
    quantized: past the sinks and before fp_from (fp_from None: every position past the sinks, [1, len(j)])."""
    reads = j[None, :] >= sink  # sink tokens are kept in full precision: reading them is the baseline's read
    return reads if fp_from is None else reads & (j[None, :] < fp_from[:, None])


def quantized_reads(scheme: QuantScheme | None, n: int, device=None, reads: str = "streaming") -> torch.Tensor | None:
    """[n, n] bool: query t reads key/value j quantized. None: every read is quantized (or none is)."""
    if scheme is None or scheme.is_identity:
        return torch.zeros(n, n, dtype=torch.bool, device=device)
    fp_from = full_precision_from(scheme, n, device, reads)
    if fp_from is None and not scheme.sink:
        return None
    return reads_quantized(scheme.sink, fp_from, torch.arange(n, device=device))


def first_quantized_row(pairs, n: int, reads: str = "streaming") -> int:
    """The first query position that reads a quantized key or value under any (K scheme, V scheme) pair: the
    positions before it compute exactly the baseline (n: none reads one)."""
    first = n
    for pair in pairs:
        for scheme in pair:
            if scheme is None or scheme.is_identity:
                continue
            if scheme.query:
                return 0  # the query itself is transformed at every position
            fp_from = full_precision_from(scheme, n, reads=reads)
            if fp_from is None:  # every token past the sinks is read quantized (quantized_reads' rows)
                first = min(first, 0 if scheme.sink < n else n)
                continue
            rows = (fp_from > scheme.sink).nonzero()  # query t reads quantized tokens sink..fp_from[t]-1
            if len(rows):
                first = min(first, int(rows[0]))
    return first


def attention_over_parts(eager, module, query, parts, mask, kwargs, rows: slice | None = None,
                         weights: bool = True):
    """Attention where each (query t, position j) reads one of several (K, V) versions.

    `parts` is a list of (key, value, reads [n, n] bool) whose `reads` partition the positions.
    Runs the model's own eager attention once over the concatenated versions with a mask that lets
    each query see each position exactly once; the blocks of the weights are then summed back.
    `rows`: the positions of `query` (and of `mask`'s rows) when it is a block of the queries (default: the last).
    `weights=False`: the caller does not read the attention weights (None is returned; summing them back is not free).
    """
    n = parts[0][0].shape[-2]
    tq = query.shape[-2]
    rows = rows if rows is not None else slice(n - tq, n)
    neg = torch.finfo(query.dtype).min
    if mask is None:
        mask = torch.full((n, n), neg, dtype=query.dtype, device=query.device).triu(1)[None, None][..., rows, :]
    mask = mask[..., -tq:, :n]
    blocked = torch.full_like(mask, neg)
    keys = torch.cat([k for k, _, _ in parts], dim=-2)
    values = torch.cat([v for _, v, _ in parts], dim=-2)
    masks = torch.cat([torch.where(reads[rows], mask, blocked) for _, _, reads in parts], dim=-1)
    if not weights:
        return plain_attention(eager, module, query, keys, values, masks, **kwargs)[0], None
    out, w = eager(module, query, keys, values, masks, **kwargs)
    if w is not None:
        return out, sum(w[..., i * n:(i + 1) * n] for i in range(len(parts)))
    return out, None


def mixed_attention(eager, module, query, k_q, v_q, key, value, mask, fp_from, kwargs):
    """Attention where query t reads keys j >= fp_from[t] in full precision and the rest quantized."""
    n = key.shape[-2]
    use_q = torch.arange(n, device=query.device)[None, :] < fp_from[:, None]
    return attention_over_parts(eager, module, query, [(k_q, v_q, use_q), (key, value, ~use_q)], mask, kwargs)


def quantized_attention(eager, module, query, key, value, k_q, v_q, k_scheme, v_scheme, mask, kwargs,
                        rows: slice | None = None, weights: bool = True, reads: str = "streaming"):
    """Attention as a cache holding K per `k_scheme` and V per `v_scheme` computes it, read as `reads` says (for the
    queries at positions `rows`, default all)."""
    n = key.shape[-2]
    rk = quantized_reads(k_scheme, n, key.device, reads)
    rv = quantized_reads(v_scheme, n, key.device, reads)
    if rk is None and rv is None:
        if weights:
            return eager(module, query, k_q, v_q, mask, **kwargs)
        return plain_attention(eager, module, query, k_q, v_q, mask, **kwargs)
    ones = torch.ones(n, n, dtype=torch.bool, device=key.device)
    rk = ones if rk is None else rk
    rv = ones if rv is None else rv
    parts = [(k_q, v_q, rk & rv), (k_q, value, rk & ~rv), (key, v_q, ~rk & rv), (key, value, ~rk & ~rv)]
    sel = rows if rows is not None else slice(n - query.shape[-2], n)
    parts = [p for p in parts if bool(p[2][sel].any())]
    return attention_over_parts(eager, module, query, parts, mask, kwargs, rows, weights)


class StatsTap:
    """Baseline pass: collect absmax (calibration) and outlier statistics of K (pre/post RoPE) and V."""

    def __init__(self, session, layer: int, recorder=None):
        self.session, self.layer, self.recorder = session, layer, recorder
        self.stats = {"K": MomentStats(), "V": MomentStats()}

    def __call__(self, eager, module, query, key, value, mask, kwargs):
        if self.recorder is not None:
            self.recorder.record(self.layer, key, value, mask)
        self.stats["K"].update(key)
        self.stats["V"].update(value)
        rope = self.session.rope.get(self.layer)
        if rope is not None:
            self.stats.setdefault("K_pre", MomentStats()).update(undo_rope(key, *rope))
        return plain_attention(eager, module, query, key, value, mask, **kwargs)


class QuantTap:
    """Quantize K and/or V of one layer; batch chunk i uses pairs[i] = (K scheme, V scheme), None = keep.

    Records the local damage (attention KL and output error per query head) of each chunk.
    """

    def __init__(self, session, layer: int, pairs: list[tuple[QuantScheme | None, QuantScheme | None]],
                 chunk: int, calibration: dict | None = None, local: bool = True, reference: dict | None = None,
                 reads: str = "streaming"):
        self.session, self.layer, self.want_local, self.reads = session, layer, local, check_reads(reads)
        # The unquantized attention of this layer's input, shared by every cell of a layer (the input is the
        # baseline's whatever is quantized here), so local metrics cost one extra attention per layer, not per cell.
        self.reference = reference if reference is not None else {}
        self.shared = reference is not None  # the caller's promise: every call sees this layer's baseline input
        self.pairs, self.chunk = pairs, chunk
        self.calibration = calibration or {}
        self.local: list[tuple[torch.Tensor, torch.Tensor]] = []

    def quantize_key(self, scheme, key, rope):
        if scheme is None or scheme.is_identity:
            return key
        if scheme.pre_rope:
            if rope is None:
                raise ValueError(f"layer {self.layer} has no RoPE to quantize keys before")
            cos, sin = rope
            pre = fake_quant(undo_rope(key, cos, sin), scheme, self.calibration.get("K_pre"))
            return apply_rope(pre, cos, sin).to(key.dtype)
        return fake_quant(key, scheme, self.calibration.get("K"))

    def quantize_value(self, scheme, value):
        if scheme is None or scheme.is_identity:
            return value
        return fake_quant(value, scheme, self.calibration.get("V"))

    def __call__(self, eager, module, query, key, value, mask, kwargs):
        rope = self.session.rope.get(self.layer)
        outs, weights = [], []
        self.local = []
        for i, (k_scheme, v_scheme) in enumerate(self.pairs):
            sl = slice(i * self.chunk, (i + 1) * self.chunk)
            q, k, v = query[sl], key[sl], value[sl]
            m = mask[sl] if mask is not None and mask.shape[0] > 1 else mask
            r = None if rope is None else tuple(t[sl] if t.shape[0] > 1 else t for t in rope)
            k_q, v_q = self.quantize_key(k_scheme, k, r), self.quantize_value(v_scheme, v)
            qq = quantize_query(k_scheme, q)
            blocks = query_blocks(q.shape[-2], m)
            offset = k.shape[-2] - q.shape[-2]  # the queries are the last positions (one, when decoding)
            kl_sum = err = ref = 0.0
            parts = []
            for b in blocks:  # one block unless the window is long: then no [T, T] weights are held for all queries
                mb = None if m is None else m[..., b, :]
                rows = slice(offset + b.start, offset + b.stop)
                out_q, w_q = quantized_attention(eager, module, qq[..., b, :], k, v, k_q, v_q, k_scheme, v_scheme,
                                                 mb, kwargs, rows=rows, weights=self.want_local,
                                                 reads=self.reads)
                if self.want_local:
                    if len(blocks) > 1:
                        out_b, w_b = eager(module, q[..., b, :], k, v, mb, **kwargs)
                    else:
                        if "out" not in self.reference:
                            self.reference["out"], self.reference["weights"] = eager(module, q, k, v, m, **kwargs)
                        out_b, w_b = self.reference["out"], self.reference["weights"]
                    num, den = squared_errors(out_b, out_q)
                    kl_sum, err, ref = kl_sum + attention_kl_sum(w_b, w_q), err + num, ref + den
                parts.append((out_q, w_q))
            if self.want_local:
                n_rows = q.shape[0] * q.shape[-2]
                self.local.append(((kl_sum / n_rows).cpu(), (err.sqrt() / ref.sqrt().clamp_min(1e-300)).cpu()))
            out = torch.cat([o for o, _ in parts], dim=1)
            unmoved = first_quantized_row([(k_scheme, v_scheme)], k.shape[-2], self.reads) - offset
            if unmoved > 0:  # these queries read nothing quantized: exactly the unquantized attention, bit for bit
                plain = self.reference.get("plain") if self.shared else None
                if plain is None:
                    plain = plain_attention(eager, module, q, k, v, m, **kwargs)[0]
                    if self.shared:
                        self.reference["plain"] = plain
                out = torch.cat([plain[:, :unmoved], out[:, unmoved:]], dim=1)
            outs.append(out)
            weights.append(parts[0][1] if len(parts) == 1 else None)
        return torch.cat(outs), (None if any(w is None for w in weights) else torch.cat(weights))
