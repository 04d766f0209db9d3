"""Decode attention that reads the planned cache's packed storage, through transformers' AttentionInterface.

`use_planned_attention(model)` switches the model to an attention function named
"sensprof_planned_<previous>". For a decode step (one new token) on a PlannedCache layer, the cache's
`update` returns `PackedKV` handles instead of dequantized tensors, and this function runs the packed
decode kernel (Triton on a GPU, the compiled C kernels on a CPU, else the PyTorch reference). Anything else (prefill, other caches,
masks it cannot read) goes to the previous implementation
unchanged, so switching is harmless for every other use of the model.
"""

from __future__ import annotations

import torch

from ..models import model_eager
from .prefill import PrefillKV

PREFIX = "sensprof_planned_"


class PackedKV:
    """Stands for a PlannedLayer's keys or values during a decode step (nothing is dequantized yet)."""

    def __init__(self, layer, which: str):
        self.layer = layer
        self.which = which

    @property
    def shape(self):
        store = self.layer.k_store if self.which == "k" else self.layer.v_store
        b, h, _, d = store.pending.shape
        return torch.Size((b, h, store.seq_length(), d))

    @property
    def dtype(self):
        return self.layer.k_store.dtype

    @property
    def device(self):
        return self.layer.device


def _fallback(name: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def call(module, query, key, value, attention_mask, **kwargs):
        fn = model_eager(module) if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]
        return fn(module, query, key, value, attention_mask, **kwargs)

    return call


def _make_attention(previous: str):
    fallback = _fallback(previous)

    def planned_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if isinstance(key, PrefillKV):
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            out = key.layer.prefill_attention(fallback, module, query, key, value, attention_mask,
                                              dict(kwargs, scaling=scaling, dropout=dropout))
            return out, None
        if isinstance(key, PackedKV):
            layer = key.layer
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            out = layer.packed_decode(query, attention_mask, scaling, kwargs)
            if out is not None:
                return out, None
            key, value = layer.dense_kv()
            query = layer.attention_query(query)
        return fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    return planned_attention


def use_planned_attention(model) -> str:
    """Route the model's attention through the packed-cache decode path; returns the new implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import (
        ALL_MASK_ATTENTION_FUNCTIONS,
        AttentionMaskInterface,
        eager_mask,
    )

    current = model.config._attn_implementation
    if current.startswith(PREFIX):
        return current
    previous = current or "eager"
    name = PREFIX + previous
    AttentionInterface.register(name, _make_attention(previous))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS.get(previous, eager_mask))
    model.set_attn_implementation(name)
    return name


def reads_through_interface(model) -> bool:
    """True when every attention module hands its cached K/V straight to transformers' attention interface
    (the modeling code of the families sensprof targets); others must get tensors from the cache."""
    import inspect

    from ..models import decoder_layers

    try:
        sources = {type(layer.self_attn): inspect.getsource(type(layer.self_attn).forward)
                   for layer in decoder_layers(model)}
    except (AttributeError, OSError, TypeError):
        return False
    return all("ALL_ATTENTION_FUNCTIONS" in src for src in sources.values())
