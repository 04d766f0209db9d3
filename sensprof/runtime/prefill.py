"""Prefill through the planned cache as the profiler measured it: each prompt position reads every earlier key and
value as the cache held it when that position ran, not as it is held once the chunk is in.

A streaming cache quantizes a token only once it is due (its per-channel group complete and out of the residual
window: memory.quantized_token_count), so within one prompt chunk a query early in a group reads the group's
tokens in full precision and a later one reads them quantized. The chunk's attention therefore runs over two
versions of the tokens that changed state during the chunk (the profiler's taps.quantized_attention, a block of
queries at a time); tokens quantized before the chunk, and tokens still pending after it, have one version.
"""

from __future__ import annotations

import torch

from ..hooks import QUERY_BLOCK
from ..quant import quantize_query
from ..taps import quantized_attention


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


def exact_prefill_attention(fallback, module, query, keys, values, k_scheme, v_scheme, attention_mask, kwargs):
    """The chunk's attention output [B, q, Hq, D]: query rows are the last q of the n held positions.

    keys / values: (as held now, with the chunk's changed tokens in full precision), each [B, H, n, D]."""
    (k_q, k_fp), (v_q, v_fp) = keys, values
    query = quantize_query(k_scheme, query)  # an engine's query transform (the profiler's QuantTap applies it too)
    n, q = k_q.shape[-2], query.shape[-2]
    mask = attention_mask
    if mask is not None and mask.dtype == torch.bool:  # the parts are joined by an additive mask
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~mask, torch.finfo(query.dtype).min)
    k_s = None if k_scheme.is_identity else k_scheme
    v_s = None if v_scheme.is_identity else v_scheme
    outs = []
    for lo in range(0, q, QUERY_BLOCK):
        hi = min(q, lo + QUERY_BLOCK)
        m = None if mask is None else mask[..., lo:hi, :]
        out, _ = quantized_attention(fallback, module, query[..., lo:hi, :], k_fp, v_fp, k_q, v_q, k_s, v_s, m,
                                     kwargs, rows=slice(n - q + lo, n - q + hi), weights=False)
        outs.append(out)
    return torch.cat(outs, dim=1)
