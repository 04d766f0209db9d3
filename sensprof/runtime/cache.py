"""A transformers Cache that stores each layer's K and V as a plan says.

One layer object per decoder layer (transformers' `Cache(layers=[...])`), so a mixed-precision cache
is just a list; no modeling code is touched. This is the reference path: attention reads the
dequantized cache; packed-cache decode kernels are the next step.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..errors import SensprofError
from ..schemes import get_scheme
from .store import TensorStore, runtime_problem


class PlannedLayer(DynamicLayer):
    """K and V of one layer, each in its own scheme; a sliding-window layer keeps only its window."""

    is_croppable = False

    def __init__(self, k_scheme: str, v_scheme: str, absmax: dict | None = None, sliding_window: int | None = None):
        super().__init__()
        absmax = absmax or {}
        sliding = sliding_window is not None
        self.k_store = TensorStore(get_scheme(k_scheme), _absmax(absmax.get("K")), sliding)
        self.v_store = TensorStore(get_scheme(v_scheme), _absmax(absmax.get("V")), sliding)
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k_store.append(key_states)
        self.v_store.append(value_states)
        keys, values = self.k_store.dense(), self.v_store.dense()
        if self.is_sliding:
            visible = self.sliding_window - 1 + key_states.shape[-2]
            keys, values = keys[..., -visible:, :], values[..., -visible:, :]
            self.k_store.drop_front(self.sliding_window - 1)
            self.v_store.drop_front(self.sliding_window - 1)
        return keys, values

    def get_seq_length(self) -> int:
        return self.k_store.total

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        n = self.k_store.total
        if not self.is_sliding:
            return n + query_length, 0
        if n >= self.sliding_window:
            return self.sliding_window - 1 + query_length, n - self.sliding_window + 1
        return n + query_length, 0

    def get_max_length(self) -> int:
        return self.sliding_window if self.is_sliding else -1

    def reset(self) -> None:
        raise SensprofError("a PlannedCache cannot be reset; build a new one with PlannedCache.from_plan")

    def crop(self, tokens_to_remove: int) -> None:
        raise SensprofError("a PlannedCache cannot be cropped (quantized tokens cannot be un-quantized)")

    def nbytes(self) -> int:
        return self.k_store.nbytes() + self.v_store.nbytes()


def _absmax(values):
    return None if values is None else torch.tensor(values, dtype=torch.float32)


class PlannedCache(Cache):
    """`model.generate(..., past_key_values=PlannedCache.from_plan(plan, model))`."""

    @classmethod
    def from_plan(cls, plan, model=None, check_model: bool = True) -> PlannedCache:
        if model is not None and check_model:
            from ..models import describe_layers, fingerprint

            if fingerprint(model) != plan.model_fingerprint:
                raise SensprofError(f"the plan was made for another model (fingerprint {plan.model_fingerprint}, "
                                    f"this one {fingerprint(model)}); re-plan for this model")
            if len(describe_layers(model)) != len(plan.layers):
                raise SensprofError("the plan's layer count differs from the model's; re-plan for this model")
        layers = []
        for p in plan.layers:
            for name in (p.k_scheme, p.v_scheme):
                why = runtime_problem(get_scheme(name), p.head_dim)
                if why:
                    raise SensprofError(f"layer {p.layer}: the runtime cannot store scheme {name!r}: {why}; "
                                        "re-plan without it")
            layers.append(PlannedLayer(p.k_scheme, p.v_scheme, p.absmax,
                                       p.window if p.kind == "sliding" else None))
        return cls(layers=layers)

    def nbytes(self) -> int:
        """Every stored tensor: packed codes, scales, zero-points, sink and residual tokens."""
        return sum(layer.nbytes() for layer in self.layers)
