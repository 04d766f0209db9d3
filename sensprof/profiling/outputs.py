"""Next-token distributions compared without materialising [tokens, vocab] log-probabilities.

A cell's end-to-end damage is KL(baseline || quantized) of the next-token distribution at every position.
The plain way (`MaterializedBaseline`, kept for `--naive` and as the reference in tests) holds the
baseline's logits and probabilities and the quantized logits in fp32: memory and time that grow with the
vocabulary and dominate cells of large-vocabulary models. `Baseline` keeps the decoder's final hidden states
and per-position log-sum-exp instead, and computes the LM head and the KL together, a block of positions and
a chunk of the vocabulary at a time; positions whose hidden state did not move are skipped (their KL is 0).
Exact by default; `sample=K` is the opt-in approximation (top-K tokens plus K tail samples per position).
"""

from __future__ import annotations

import time

import torch

from ..errors import SensprofError
from ..metrics import kl_and_dnll, log_probs, token_nll
from ..models import text_config

CHUNK_ELEMENTS = 1 << 24  # floats in one [positions, vocab] temporary (64 MiB)
KEEP_LOGITS_BYTES = 2 << 30  # the baseline's fp32 logits are kept when they fit here, else recomputed per chunk
KEEP_PROBS_BYTES = 1 << 30  # ... and its probabilities too when both fit here (small vocabularies: fewer passes)


class OutputHead:
    """The model's LM head as a function of the decoder's final hidden states, with its logit transforms."""

    def __init__(self, model):
        self.model = model
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        head = model.get_output_embeddings()
        if self.decoder is None or head is None or getattr(head, "weight", None) is None:
            raise SensprofError(f"{type(model).__name__} has no separate decoder and LM head")
        self.weight, self.bias = head.weight, getattr(head, "bias", None)
        cfg = text_config(model)
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.multiply = getattr(cfg, "logit_scale", None)  # Cohere
        self.divide = getattr(cfg, "logits_scaling", None)  # Granite
        self.vocab = self.weight.shape[0]

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {} if position_ids is None else {"position_ids": position_ids}
        out = self.decoder(input_ids=input_ids, use_cache=False, **extra)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        z = z.float()
        if self.multiply is not None:
            z = z * self.multiply
        if self.divide is not None:
            z = z / self.divide
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    def logits(self, h: torch.Tensor, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """fp32 logits of the vocabulary slice [lo, hi) for hidden states h [N, H]."""
        b = None if self.bias is None else self.bias[lo:hi]
        return self._transform(torch.nn.functional.linear(h, self.weight[lo:hi], b))

    def logits_at(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the given vocabulary ids per position: h [N, H], ids [N, k] -> [N, k]."""
        z = (self.weight[ids] @ h.unsqueeze(-1)).squeeze(-1)
        if self.bias is not None:
            z = z + self.bias[ids]
        return self._transform(z)

    @torch.no_grad()
    def matches_model(self, input_ids: torch.Tensor) -> bool:
        """Whether the model's logits are this head applied to its decoder's output (no unknown transform)."""
        ids = input_ids[:1, : min(16, input_ids.shape[1])]
        full = self.model(input_ids=ids, use_cache=False).logits.float()
        ours = self.logits(self.hidden(ids))
        tol = 1e-3 * (1.0 + float(full.abs().max()))
        return ours.shape == full.shape and float((ours - full).abs().max()) <= tol


def output_head(model, input_ids: torch.Tensor, kl: str = "exact") -> OutputHead | None:
    """The chunked head, or None where full logits must be compared (asked for, or a model it cannot reproduce)."""
    if kl == "materialized":
        return None
    try:
        head = OutputHead(model)
    except SensprofError:
        head = None
    if head is None or not head.matches_model(input_ids):
        if kl != "exact":
            raise SensprofError(f"--kl {kl} needs a model whose logits are its LM head of its decoder's output; "
                                f"{type(model).__name__}'s are not: use --kl exact")
        return None
    return head


def _blocks(n_rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(1, width))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1)  # on a CPU several times faster than a batched [1, C] @ [C, 1] product


def _summary(kl: torch.Tensor, dnll: torch.Tensor, per_token: bool = False) -> dict:
    """Means over windows; with per_token, also each predicted position's KL and ΔNLL ([W, T - 1], float64)."""
    per_window = kl.mean(-1)
    out = {"kl": max(float(kl.mean()), 0.0), "kl_std": float(per_window.std()) if kl.shape[0] > 1 else 0.0,
           "dnll": float(dnll.mean()), "kl_per_window": [float(x) for x in per_window]}
    if per_token:
        out |= {"kl_tokens": kl[:, : dnll.shape[1]].double().cpu(), "dnll_tokens": dnll.double().cpu()}
    return out


class Baseline:
    """The unquantized model's next-token distributions on windows [W, T], kept as hidden states + log-sum-exp."""

    def __init__(self, head: OutputHead, hidden: torch.Tensor, input_ids: torch.Tensor, *,
                 keep_logits_bytes: int = KEEP_LOGITS_BYTES, sample: int = 0, seed: int = 0):
        self.head, self.sample = head, sample
        w, t, hdim = hidden.shape
        self.shape = (w, t)
        self.h = hidden.reshape(w * t, hdim)
        n, vocab = w * t, head.vocab
        if sample and 2 * sample >= vocab:
            raise SensprofError(f"--kl sampled:{sample} samples as many tokens as the {vocab}-token vocabulary "
                                "holds; use --kl exact")
        tgt = torch.zeros(w, t, dtype=torch.long, device=self.h.device)
        tgt[:, :-1] = input_ids[:, 1:].to(tgt.device)
        self.targets = tgt.reshape(n)
        self.seconds = {"lm_head": 0.0, "kl": 0.0}
        keep = n * vocab * 4 <= keep_logits_bytes and not sample
        self.logits = torch.empty(n, vocab, dtype=torch.float32, device=self.h.device) if keep else None
        keep_p = keep and 2 * n * vocab * 4 <= min(keep_logits_bytes, KEEP_PROBS_BYTES)
        self.probs = torch.empty(n, vocab, dtype=torch.float32, device=self.h.device) if keep_p else None
        self.prob_sum = torch.empty(n, dtype=torch.float64, device=self.h.device)
        self.lse = torch.empty(n, dtype=torch.float64, device=self.h.device)
        self.ref = torch.empty(n, dtype=torch.long, device=self.h.device)
        self.ref_logit = torch.empty(n, dtype=torch.float32, device=self.h.device)
        self.target_logit = torch.empty(n, dtype=torch.float32, device=self.h.device)
        if sample:
            self.sample_ids = torch.empty(n, 2 * sample, dtype=torch.long, device=self.h.device)
            self.sample_weights = torch.empty(n, 2 * sample, dtype=torch.float32, device=self.h.device)
            self.sample_logits = torch.empty(n, 2 * sample, dtype=torch.float32, device=self.h.device)
            gen = torch.Generator(device=self.h.device).manual_seed(seed)
        for r0, r1 in _blocks(n, vocab):
            z = head.logits(self.h[r0:r1])
            if not torch.isfinite(z).all():
                raise SensprofError("the unquantized model produced NaN/Inf logits on these windows; try --dtype "
                                    "float32 or a shorter --seq-len")
            if keep:
                self.logits[r0:r1] = z
            lse = torch.logsumexp(z.double(), dim=-1)
            self.lse[r0:r1] = lse
            p = z.sub(lse.float()[:, None]).exp_()
            self.prob_sum[r0:r1] = p.sum(-1)
            if self.probs is not None:
                self.probs[r0:r1] = p
            self.ref[r0:r1] = z.argmax(-1)
            self.ref_logit[r0:r1] = z.gather(1, self.ref[r0:r1, None]).squeeze(1)
            self.target_logit[r0:r1] = z.gather(1, self.targets[r0:r1, None]).squeeze(1)
            if sample:
                self._draw(r0, r1, z, lse, gen)
        nll = (self.lse - self.target_logit.double()).view(w, t)[:, :-1]
        self.mean_nll = float(nll.mean())

    def _draw(self, r0, r1, z, lse, gen):
        """Top-K tokens (weight p) and K tail tokens drawn from p restricted to the tail (weight tail mass / K)."""
        k = self.sample
        p = z.sub(lse.float()[:, None]).exp_()
        top_p, top = p.topk(k, dim=-1)
        tail = p.scatter_(1, top, 0.0)
        mass = tail.double().sum(-1, keepdim=True)
        draws = torch.multinomial(tail.clamp_min_(1e-30), k, replacement=True, generator=gen)
        self.sample_ids[r0:r1] = torch.cat([top, draws], 1)
        self.sample_weights[r0:r1] = torch.cat([top_p, mass.expand(-1, k) / k], 1).float()
        self.sample_logits[r0:r1] = z.gather(1, self.sample_ids[r0:r1])

    def prefix(self, n: int) -> torch.Tensor:
        """The baseline's final hidden states of the first n positions of each window, [W, n, H]."""
        w, t = self.shape
        return self.h.view(w, t, -1)[:, :n]

    def token_nll(self) -> torch.Tensor:
        """The baseline's NLL of each next token, [W, T - 1] float64."""
        w, t = self.shape
        return (self.lse - self.target_logit.double()).view(w, t)[:, :-1].cpu()

    def compare(self, hidden_q: torch.Tensor, per_token: bool = False) -> dict:
        """KL, its spread across windows and ΔNLL of the quantized model's hidden states [W, T, H]."""
        n = self.h.shape[0]
        hq = hidden_q.reshape(n, -1)
        kl = torch.zeros(n, dtype=torch.float64, device=hq.device)
        dnll = torch.zeros(n, dtype=torch.float64, device=hq.device)
        moved = (hq != self.h).any(-1)  # unmoved positions have KL 0 and ΔNLL 0 exactly: skipped
        rows = None if bool(moved.all()) else moved.nonzero().squeeze(-1)
        width = 2 * self.sample if self.sample else self.head.vocab
        for r0, r1 in _blocks(n if rows is None else len(rows), width):
            idx = slice(r0, r1) if rows is None else rows[r0:r1]  # a slice takes views, not copies
            kl[idx], dnll[idx] = (self._sampled if self.sample else self._exact)(idx, hq[idx])
        w, t = self.shape
        return _summary(kl.view(w, t), dnll.view(w, t)[:, :-1], per_token)

    def _exact(self, idx, hq):
        hb, lse, tgt = self.h[idx], self.lse[idx].float(), self.targets[idx]
        rows = hq.shape[0]
        t0 = time.perf_counter()
        c = self.head.logits_at(hq, self.ref[idx].unsqueeze(1)).squeeze(1) - self.ref_logit[idx]
        s1, s2, d_tgt = (torch.zeros(rows, dtype=torch.float64, device=hq.device) for _ in range(3))
        s0 = self.prob_sum[idx]  # the baseline's probabilities sum to 1 only up to rounding: re-normalised below
        head_s = time.perf_counter() - t0
        vocab = self.head.vocab
        step = max(1, CHUNK_ELEMENTS // max(1, rows))
        for lo in range(0, vocab, step):
            hi = min(vocab, lo + step)
            t0 = time.perf_counter()
            zq = self.head.logits(hq, lo, hi)
            zb = self.logits[idx, lo:hi] if self.logits is not None else self.head.logits(hb, lo, hi)
            t1 = time.perf_counter()
            d = zq.sub_(zb)
            p = self.probs[idx, lo:hi] if self.probs is not None else zb.sub(lse[:, None]).exp_()
            s1 += _rowdot(p, d)
            inside = (tgt >= lo) & (tgt < hi)
            d_tgt += torch.where(inside, d.gather(1, (tgt - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(1), 0.0)
            s2 += _rowdot(p, d.sub_(c[:, None]).expm1_())
            t2 = time.perf_counter()
            head_s += t1 - t0
            self.seconds["kl"] += t2 - t1
        self.seconds["lm_head"] += head_s
        return self._finish(c, s1 / s0, s2 / s0, d_tgt)

    def _sampled(self, idx, hq):
        t0 = time.perf_counter()
        ids = self.sample_ids[idx]
        zq = self.head.logits_at(hq, ids)
        c = self.head.logits_at(hq, self.ref[idx, None]).squeeze(1) - self.ref_logit[idx]
        d_tgt = self.head.logits_at(hq, self.targets[idx, None]).squeeze(1) - self.target_logit[idx]
        t1 = time.perf_counter()
        d = zq - self.sample_logits[idx]
        wts = self.sample_weights[idx]
        s0 = wts.double().sum(-1)
        m1 = _rowdot(wts, d).double() / s0
        m2 = _rowdot(wts, (d - c[:, None]).expm1()).double() / s0
        self.seconds["lm_head"] += t1 - t0
        self.seconds["kl"] += time.perf_counter() - t1
        return self._finish(c, m1, m2, d_tgt)

    @staticmethod
    def _finish(c, m1, m2, d_tgt):
        # KL = log E_p[e^d] - E_p[d], with log E_p[e^d] = c + log1p(E_p[expm1(d - c)]) for the shift c = d at
        # the baseline's top token, so that a tiny KL is not lost in rounding; ΔNLL = E_p[d] + KL - d[target].
        kl = (c.double() - m1) + torch.log1p(m2)
        return kl.clamp_min(0.0), m1 + kl - d_tgt.double()


class MaterializedBaseline:
    """The plain way (full [W, T, vocab] fp32 logits and probabilities): `--naive` and the tests' reference."""

    def __init__(self, logits: torch.Tensor, input_ids: torch.Tensor):
        logp = log_probs(logits)
        if not torch.isfinite(logp).all():
            raise SensprofError("the unquantized model produced NaN/Inf logits on these windows; try --dtype "
                                "float32 or a shorter --seq-len")
        self.logits = logits.float()
        self.p = logp.exp().float()
        self.mean_nll = float(token_nll(logp, input_ids).mean())
        self.input_ids = input_ids
        self.seconds = {"lm_head": 0.0, "kl": 0.0}

    def token_nll(self) -> torch.Tensor:
        return token_nll(log_probs(self.logits), self.input_ids).double().cpu()

    def compare(self, logits: torch.Tensor, per_token: bool = False) -> dict:
        t0 = time.perf_counter()
        kl, dnll = kl_and_dnll(self.p, self.logits, logits, self.input_ids)
        self.seconds["kl"] += time.perf_counter() - t0
        return _summary(kl, dnll, per_token)
