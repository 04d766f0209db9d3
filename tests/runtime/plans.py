"""Helpers of the runtime tests: a plan for a model without profiling it, and token-by-token decoding."""

import torch

from sensprof.models import describe_layers, fingerprint
from sensprof.artifacts import LayerPlan, Plan
from sensprof.runtime.generate import cache_kwarg


def make_plan(model, pairs, absmax):
    """A plan giving layer i the (K scheme, V scheme) pairs[i] and the calibrated absmax[i]."""
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, absmax[i.index])
              for i, (k, v) in zip(describe_layers(model), pairs)]
    return Plan.hand_made("tiny", fingerprint(model), layers)


def decode_logprobs(model, cache, ids):
    """Next-token log-probabilities [B, T, V], feeding ids one token per step through `cache`."""
    steps = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], use_cache=True, **{cache_kwarg(model): cache}).logits[:, -1])
    return torch.stack(steps, 1).log_softmax(-1)
