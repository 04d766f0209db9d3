"""Per-layer attention taps: record statistics (baseline) or quantize K or V (profiling).

A tap is called by sensprof's attention function with the layer's post-RoPE K and V.
"""

from __future__ import annotations

import torch

from .hooks import apply_rope, undo_rope
from .metrics import MomentStats, attention_kl, relative_l2
from .quant import fake_quant
from .schemes import QuantScheme


def full_precision_from(scheme: QuantScheme, n: int, device=None) -> torch.Tensor | None:
    """For each query position t, the first key position still held in full precision.

    What a streaming cache holds when query t runs: the `residual` most recent tokens, and with
    per-channel token groups the tokens of the group that is not complete yet. None: nothing recent.
    """
    seen = torch.arange(1, n + 1, device=device)
    start = seen - scheme.residual
    if scheme.granularity == "channel":
        body = (seen - scheme.sink).clamp_min(0)
        start = torch.minimum(start, scheme.sink + (body // scheme.group) * scheme.group)
    if bool((start >= seen).all()):
        return None
    return start


def mixed_attention(eager, module, query, k_q, v_q, key, value, mask, fp_from, kwargs):
    """Attention where query t reads keys j >= fp_from[t] in full precision and the rest quantized.

    Done with the model's own eager attention over [quantized ; full-precision] keys and a mask
    that lets each query see each key exactly once; the two halves of the weights are then summed.
    """
    n = key.shape[-2]
    neg = torch.finfo(query.dtype).min
    if mask is None:
        mask = torch.full((n, n), neg, dtype=query.dtype, device=query.device).triu(1)[None, None]
    mask = mask[..., -query.shape[-2]:, :n]
    use_q = torch.arange(n, device=query.device)[None, :] < fp_from[-query.shape[-2]:, None]
    m_q = torch.where(use_q, mask, torch.full_like(mask, neg))
    m_fp = torch.where(use_q, torch.full_like(mask, neg), mask)
    out, w = eager(module, query, torch.cat([k_q, key], dim=-2), torch.cat([v_q, value], dim=-2),
                   torch.cat([m_q, m_fp], dim=-1), **kwargs)
    return out, (w[..., :n] + w[..., n:]) if w is not None else None


class StatsTap:
    """Baseline pass: collect absmax (calibration) and outlier statistics of K (pre/post RoPE) and V."""

    def __init__(self, session, layer: int):
        self.session, self.layer = session, layer
        self.stats = {"K": MomentStats(), "V": MomentStats()}

    def __call__(self, eager, module, query, key, value, mask, kwargs):
        self.stats["K"].update(key)
        self.stats["V"].update(value)
        rope = self.session.rope.get(self.layer)
        if rope is not None:
            self.stats.setdefault("K_pre", MomentStats()).update(undo_rope(key, *rope))
        return eager(module, query, key, value, mask, **kwargs)


class QuantTap:
    """Quantize one tensor of one layer; batch chunk i uses schemes[i]. Records local damage."""

    def __init__(self, session, layer: int, tensor: str, schemes: list[QuantScheme], chunk: int,
                 calibration: dict | None = None):
        self.session, self.layer, self.tensor = session, layer, tensor
        self.schemes, self.chunk = schemes, chunk
        self.calibration = calibration or {}
        self.local: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _quantize(self, scheme, key, value, rope):
        if self.tensor == "V":
            return key, fake_quant(value, scheme, self.calibration.get("V"))
        if scheme.pre_rope:
            if rope is None:
                raise ValueError(f"layer {self.layer} has no RoPE to quantize keys before")
            cos, sin = rope
            pre = fake_quant(undo_rope(key, cos, sin), scheme, self.calibration.get("K_pre"))
            return apply_rope(pre, cos, sin).to(key.dtype), value
        return fake_quant(key, scheme, self.calibration.get("K")), value

    def __call__(self, eager, module, query, key, value, mask, kwargs):
        rope = self.session.rope.get(self.layer)
        outs, weights = [], []
        self.local = []
        for i, scheme in enumerate(self.schemes):
            sl = slice(i * self.chunk, (i + 1) * self.chunk)
            q, k, v = query[sl], key[sl], value[sl]
            m = mask[sl] if mask is not None and mask.shape[0] > 1 else mask
            r = None
            if rope is not None:
                r = tuple(t[sl] if t.shape[0] > 1 else t for t in rope)
            out_b, w_b = eager(module, q, k, v, m, **kwargs)
            k_q, v_q = self._quantize(scheme, k, v, r)
            fp_from = full_precision_from(scheme, k.shape[-2], k.device)
            if fp_from is None:
                out_q, w_q = eager(module, q, k_q, v_q, m, **kwargs)
            else:
                out_q, w_q = mixed_attention(eager, module, q, k_q, v_q, k, v, m, fp_from, kwargs)
            self.local.append((attention_kl(w_b, w_q).cpu(), relative_l2(out_b, out_q).cpu()))
            outs.append(out_q)
            weights.append(w_q)
        return torch.cat(outs), torch.cat(weights)
