"""A transformers Cache that stores each layer's K and V as a plan says.

One layer object per decoder layer (transformers' `Cache(layers=[...])`), so a mixed-precision cache
is just a list; no modeling code is touched. Prefill reads the dequantized cache; a decode step reads
the packed storage directly through the decode kernel (see attention.py) where the layer's schemes allow.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..errors import SensprofError
from ..schemes import get_scheme
from .attention import (
    PackedKV,
    masks_nothing,
    reads_through_interface,
    use_planned_attention,
)
from .kernels import KernelBackend, select
from .store import TensorStore, runtime_problem


class PlannedLayer(DynamicLayer):
    """K and V of one layer, each in its own scheme; a sliding-window layer keeps only its window."""

    is_croppable = False

    def __init__(self, k_scheme: str, v_scheme: str, absmax: dict | None = None, sliding_window: int | None = None,
                 kernels: str = "auto"):
        super().__init__()
        absmax = absmax or {}
        sliding = sliding_window is not None
        self.k_store = TensorStore(get_scheme(k_scheme), _absmax(absmax.get("K")), sliding, kernels)
        self.v_store = TensorStore(get_scheme(v_scheme), _absmax(absmax.get("V")), sliding, kernels)
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.preference = kernels
        self.kernels: KernelBackend | None = None
        self.packed = False  # set when the model's attention reads PackedKV handles (use_planned_attention)
        self.packed_steps = 0  # decode steps served by the packed kernel (the rest read the dense cache)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.kernels = select(self.preference, key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k_store.append(key_states)
        self.v_store.append(value_states)
        if self.packed and key_states.shape[-2] == 1 and not self.is_sliding:
            return PackedKV(self, "k"), PackedKV(self, "v")
        keys, values = self.dense_kv()
        if self.is_sliding:
            visible = self.sliding_window - 1 + key_states.shape[-2]
            keys, values = keys[..., -visible:, :], values[..., -visible:, :]
            self.k_store.drop_front(self.sliding_window - 1)
            self.v_store.drop_front(self.sliding_window - 1)
        return keys, values

    def dense_kv(self):
        return self.k_store.dense(), self.v_store.dense()

    def packed_decode(self, query: torch.Tensor, attention_mask, scaling: float, kwargs: dict):
        """Attention of one new token over the packed cache ([B, 1, Hq, D]), or None where the kernel
        does not apply (the caller then reads the dense cache)."""
        if query.shape[2] != 1 or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
            return None
        if not (_kernel_reads(self.k_store.scheme, "channel") and _kernel_reads(self.v_store.scheme, "token")):
            return None
        k_body, v_body = self.k_store.packed_body(), self.v_store.packed_body()
        if k_body is None or v_body is None or not masks_nothing(attention_mask):
            return None
        (k0, nk, qk), (v0, nv, qv) = k_body, v_body
        gk = self.k_store.scheme.group
        # the kernel reads the positions both K and V hold packed, starting and ending on whole key groups
        a = k0 + -(-(max(k0, v0) - k0) // gk) * gk
        b = a + (min(k0 + nk, v0 + nv) - a) // gk * gk
        if b <= a:
            return None
        d = query.shape[-1]
        if self.kernels.NEEDS_POWER_OF_TWO_HEAD_DIM and d & (d - 1):
            return None  # Triton tiles span the head dim (tl.arange): 64 and 128 are fine, 80 or 96 are not
        t = self.k_store.seq_length()
        k_tail = torch.cat([self.k_store.dense_range(0, a), self.k_store.dense_range(b, t)], dim=-2)
        v_tail = torch.cat([self.v_store.dense_range(0, a), self.v_store.dense_range(b, t)], dim=-2)
        ka, kb, va, vb = (a - k0) // gk, (b - k0) // gk, a - v0, b - v0
        out = self.kernels.decode_attention(
            query[:, :, 0], qk.codes[:, :, :, ka * gk:kb * gk], qk.scale[:, :, ka:kb], qk.zero[:, :, ka:kb],
            qv.codes[:, :, :, va:vb], qv.scale[:, :, va:vb], qv.zero[:, :, va:vb], k_tail, v_tail,
            bits_k=self.k_store.scheme.bits, bits_v=self.v_store.scheme.bits, group_k=gk,
            group_v=d // qv.scale.shape[-1], scaling=scaling)
        self.packed_steps += 1
        return out.to(query.dtype).unsqueeze(1)

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


def _kernel_reads(scheme, granularity: str) -> bool:
    """The decode kernel reads asymmetric integer codes with fp16 scales: per channel for K, per token for V."""
    return (scheme.codec == "minmax" and scheme.granularity == granularity and scheme.scale_bits == 16
            and scheme.zero_bits == 16)


def _absmax(values):
    return None if values is None else torch.tensor(values, dtype=torch.float32)


class PlannedCache(Cache):
    """`model.generate(..., past_key_values=PlannedCache.from_plan(plan, model))`."""

    @classmethod
    def from_plan(cls, plan, model=None, check_model: bool = True, kernels: str = "auto",
                  packed_decode: bool = True) -> PlannedCache:
        """With `model`, decode steps read the packed cache through the decode kernel: the model's
        attention is switched to sensprof's (which defers to the previous one for anything else).
        `kernels`: auto | triton | reference."""
        if model is not None and check_model:
            from ..models import describe_layers, fingerprint

            plan.check_model(fingerprint(model), "this model", "re-plan for this model")
            plan.check_layers([(i.kv_heads, i.head_dim) for i in describe_layers(model)], "this model")
        layers = []
        for p in plan.layers:
            for name in (p.k_scheme, p.v_scheme):
                why = runtime_problem(get_scheme(name), p.head_dim)
                if why:
                    raise SensprofError(f"layer {p.layer}: the runtime cannot store scheme {name!r}: {why}; "
                                        "re-plan without it")
            layers.append(PlannedLayer(p.k_scheme, p.v_scheme, p.absmax,
                                       p.window if p.kind == "sliding" else None, kernels))
        if model is not None:
            select(kernels, next(model.parameters()).device)  # a preference that cannot run fails here, in one line
        if model is not None and packed_decode and reads_through_interface(model):
            use_planned_attention(model)
            for layer in layers:
                layer.packed = True
        return cls(layers=layers)

    def nbytes(self) -> int:
        """Every stored tensor: packed codes, scales, zero-points, sink and residual tokens."""
        return sum(layer.nbytes() for layer in self.layers)
