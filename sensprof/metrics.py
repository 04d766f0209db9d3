"""Damage measures: end-to-end (next-token distribution) and local (one layer's attention)."""

from __future__ import annotations

import torch


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), dim=-1)


def token_nll(logp: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """NLL of each next token (positions 0..T-2 predict tokens 1..T-1): [W, T-1]."""
    return -logp[:, :-1].gather(-1, input_ids[:, 1:, None].to(logp.device)).squeeze(-1)


def kl_and_dnll(base_p: torch.Tensor, base_logits: torch.Tensor, logits: torch.Tensor, input_ids: torch.Tensor):
    """Per-position KL(baseline ‖ quantized) [W, T] and ΔNLL of the next token [W, T-1].

    Written in the logit difference d = z_q - z_b, which float32 holds exactly (close numbers subtract
    exactly): KL = log E_p[e^d] - E_p[d] = log1p(E_p[expm1(d - E_p[d])]). No log-softmax is formed, so
    a KL of 1e-12 is not buried under float32 rounding of log-probabilities (~1e-7), at float32 speed.
    """
    d = logits.float() - base_logits
    target_d = d[:, :-1].gather(-1, input_ids[:, 1:, None].to(d.device)).squeeze(-1)
    mean_d = _expect(base_p, d)
    kl = torch.log1p(_expect(base_p, d.sub_(mean_d[..., None]).expm1_()))  # in place: d is large
    # NLL_q - NLL_b = (lse(z_q) - lse(z_b)) - d[target], and lse(z_q) - lse(z_b) = E_p[d] + KL
    return kl, (mean_d + kl)[:, :-1] - target_d


def _expect(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """E_p[x] over the last dim as batched dot products (no [W, T, V] temporary)."""
    return (p.unsqueeze(-2) @ x.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def attention_kl_sum(p_base: torch.Tensor, p_quant: torch.Tensor) -> torch.Tensor:
    """Sum over batch and queries of KL between attention rows, per query head: [Hq].

    In blocks of queries, so the float64 temporaries stay small at long context."""
    total = torch.zeros(p_base.shape[1], dtype=torch.float64, device=p_base.device)
    step = max(1, (1 << 22) // max(1, p_base.shape[0] * p_base.shape[1] * p_base.shape[-1]))
    for t0 in range(0, p_base.shape[2], step):
        pb, pq = p_base[:, :, t0:t0 + step].double(), p_quant[:, :, t0:t0 + step].double()
        kl = torch.xlogy(pb, pb) - torch.xlogy(pb, pq.clamp_min(1e-300))
        total += kl.sum(-1).clamp_min(0.0).sum(dim=(0, 2))
    return total


def squared_errors(out_base: torch.Tensor, out_quant: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(||O_q - O_b||^2, ||O_b||^2) per query head [Hq], summable over blocks of queries."""
    ob, oq = out_base.double(), out_quant.double()
    return (oq - ob).pow(2).sum(dim=(0, 1, 3)), ob.pow(2).sum(dim=(0, 1, 3))


class MomentStats:
    """Streaming per-head, per-channel absmax and pooled moments of one cached tensor."""

    def __init__(self):
        self.chan_absmax = None  # [H, D]
        self.moments = torch.zeros(5, dtype=torch.float64)  # n, sum x, x^2, x^3, x^4

    def update(self, x: torch.Tensor) -> None:
        """x: [B, H, T, D]"""
        a = x.detach().abs().amax(dim=(0, 2)).float().cpu()
        self.chan_absmax = a if self.chan_absmax is None else torch.maximum(self.chan_absmax, a)
        xd = x.detach().double().reshape(-1)
        self.moments += torch.stack([xd.new_tensor(float(xd.numel())), xd.sum(),  # on x's device (a GPU's too)
                                     xd.pow(2).sum(), xd.pow(3).sum(), xd.pow(4).sum()]).cpu()

    @property
    def head_absmax(self) -> torch.Tensor:
        return self.chan_absmax.amax(-1)

    def outlier_ratio(self) -> torch.Tensor:
        """Per head: largest channel absmax over the median channel absmax."""
        med = self.chan_absmax.median(dim=-1).values.clamp_min(1e-12)
        return self.chan_absmax.amax(-1) / med

    def kurtosis(self) -> float:
        n, s1, s2, s3, s4 = (float(v) for v in self.moments)
        mu = s1 / n
        var = s2 / n - mu * mu
        if var <= 0:
            return float("nan")
        m4 = s4 / n - 4 * mu * s3 / n + 6 * mu * mu * s2 / n - 3 * mu**4
        return m4 / (var * var)
