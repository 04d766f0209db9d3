"""A transformers Cache that stores each layer's K and V as a plan says.

One layer object per decoder layer (transformers' `Cache(layers=[...])`), so a mixed-precision cache
is just a list; no modeling code is touched. Prefill reads the dequantized cache; a decode step reads
the packed storage directly through the decode kernel (see attention.py) where the layer's schemes allow.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..errors import SensprofError
from ..quant import quantize_query
from ..schemes import get_scheme
from .attention import (
    PackedKV,
    reads_through_interface,
    use_planned_attention,
)
from .decode_reads import DecodeReads
from .kernels import KernelBackend, select
from .prefill import PrefillKV, exact_prefill_attention, full_precision_versions
from .rope_table import RopeTable, capture_position_embeddings
from .store import TensorStore, runtime_problem


class PlannedLayer(DynamicLayer):
    """K and V of one layer, each in its own scheme; a sliding-window layer keeps only its window."""

    is_croppable = False

    def __init__(self, k_scheme: str, v_scheme: str, absmax: dict | None = None, sliding_window: int | None = None,
                 kernels: str = "auto", index: int = 0, attention_module=None, rope: RopeTable | None = None):
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
        self.index, self.attention_module = index, attention_module
        self.k_store.rope = rope  # keys stored before RoPE: the position table shared by the layers of this kind
        self.reads = DecodeReads()  # what the decode kernel reads, kept between steps

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.kernels = select(self.preference, key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.k_store.scheme.pre_rope:
            self._extend_rope(n)
        exact = self.packed and n > 1 and not (self.is_sliding and self.k_store.total + n > self.sliding_window)
        before = (self.k_store.pending_copy(), self.v_store.pending_copy()) if exact else None
        self.k_store.append(key_states)
        self.v_store.append(value_states)
        if exact:  # the prompt's positions read K and V as held when each ran (prefill.py)
            keys, values = self.dense_kv()
            k_fp = full_precision_versions(self.k_store, before[0], key_states, keys)
            v_fp = full_precision_versions(self.v_store, before[1], value_states, values)
            if self.is_sliding:
                self.k_store.drop_front(self.sliding_window - 1)
                self.v_store.drop_front(self.sliding_window - 1)
            return PrefillKV(self, "k", (keys, k_fp)), PrefillKV(self, "v", (values, v_fp))
        if self.packed and n == 1:
            if self.is_sliding:  # the step reads the window (this token and window - 1 before it)
                self.k_store.drop_front(self.sliding_window)
                self.v_store.drop_front(self.sliding_window)
            return PackedKV(self, "k"), PackedKV(self, "v")
        keys, values = self.dense_kv()
        if self.is_sliding:
            visible = self.sliding_window - 1 + key_states.shape[-2]
            keys, values = keys[..., -visible:, :], values[..., -visible:, :]
            self.k_store.drop_front(self.sliding_window - 1)
            self.v_store.drop_front(self.sliding_window - 1)
        return keys, values

    def _extend_rope(self, n: int) -> None:
        pe = getattr(self.attention_module, "sensprof_rope", None)
        if pe is None:
            raise SensprofError(f"layer {self.index}: the model passes no RoPE tables (position_embeddings) to its "
                                "attention, so keys stored before RoPE (_pre) cannot be rotated back; re-plan without "
                                "_pre key schemes")
        self.k_store.rope.extend(pe[0], pe[1], self.k_store.total + n, self.index)

    def prefill_attention(self, fallback, module, query, keys, values, attention_mask, kwargs):
        return exact_prefill_attention(fallback, module, query, keys.versions, values.versions,
                                       self.k_store.scheme, self.v_store.scheme, attention_mask, kwargs)

    def dense_kv(self):
        return self.k_store.dense(), self.v_store.dense()

    def packed_decode(self, query: torch.Tensor, attention_mask, scaling: float, kwargs: dict):
        """Attention of one new token over the packed cache ([B, 1, Hq, D]), or None where the kernel
        does not apply (the caller then reads the dense cache)."""
        if query.shape[2] != 1 or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
            return None
        d = query.shape[-1]
        if self.kernels.NEEDS_POWER_OF_TWO_HEAD_DIM and d & (d - 1):
            return None  # Triton tiles span the head dim (tl.arange): 64 and 128 are fine, 80 or 96 are not
        # positions are absolute here: a sliding window's K and V stores may hold different spans (whole chunks go)
        ks, vs = self.k_store, self.v_store
        lo, t = max(ks.dropped, vs.dropped), ks.total  # both hold [lo, t)
        ok, valid = read_mask(attention_mask, t - lo, self.sliding_window)
        if not ok:
            return None
        a, b, k_body, v_body, k_tail, v_tail = self.reads.step(ks, vs, lo, t)
        a, b = a - lo, b - lo
        mask = None if valid is None else torch.cat([valid[:, a:b], valid[:, :a], valid[:, b:]], dim=-1)
        q = self.attention_query(query)[:, :, 0]
        if ks.engine is not None and ks.engine.rotated:  # an engine's rotated basis: rotate the query and the tail
            q = ks.engine.query(q).to(query.dtype)
            if k_tail.shape[-2]:
                k_tail = ks.engine.to_rotated(k_tail).to(k_tail.dtype)
        if vs.engine is not None and vs.engine.rotated and v_tail.shape[-2]:
            v_tail = vs.engine.to_rotated(v_tail).to(v_tail.dtype)
        out = self.kernels.decode_attention(q, k_body, v_body, k_tail, v_tail, scaling=scaling, mask=mask)
        if vs.engine is not None and vs.engine.rotated:
            out = vs.engine.from_rotated(out)
        self.packed_steps += 1
        return out.to(query.dtype).unsqueeze(1)

    def attention_query(self, query: torch.Tensor) -> torch.Tensor:
        """The query attention uses: an engine format may transform it too (vLLM's fp8 cast on Hopper)."""
        return quantize_query(self.k_store.scheme, query)

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


def read_mask(attention_mask, held: int, window: int | None):
    """(usable, which held tokens a decode step reads: bool [B, held], or None for all). The mask covers the last
    tokens held (all of them, or a sliding window's); tokens before it, and before the window, are not read."""
    valid = None
    if attention_mask is not None:
        if attention_mask.dim() != 4:
            return False, None
        m = attention_mask[:, 0, -1, :]
        m = m if m.dtype == torch.bool else m == 0
        n = m.shape[-1]
        if n >= held:
            valid = m[:, n - held:]
        else:
            valid = torch.cat([torch.zeros(m.shape[0], held - n, dtype=torch.bool, device=m.device), m], dim=-1)
    if window is not None and held > window:
        recent = (torch.arange(held, device=None if valid is None else valid.device) >= held - window)[None]
        valid = recent if valid is None else valid & recent
    if valid is None or bool(valid.all()):
        return True, None
    return True, valid


def _attention_modules(model):
    if model is None:
        return None
    from ..models import decoder_layers

    return [layer.self_attn for layer in decoder_layers(model)]


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
        attention = _attention_modules(model)
        if any(get_scheme(p.k_scheme).pre_rope for p in plan.layers) and attention is None:
            raise SensprofError("the plan stores keys before RoPE (_pre): its cache needs the model (its position "
                                "embeddings); pass model= to PlannedCache.from_plan")
        layers, tables = [], {}
        for p in plan.layers:
            for name in (p.k_scheme, p.v_scheme):
                why = runtime_problem(get_scheme(name), p.head_dim)
                if why:
                    raise SensprofError(f"layer {p.layer}: the runtime cannot store scheme {name!r}: {why}; "
                                        "re-plan without it")
            rope = None
            if get_scheme(p.k_scheme).pre_rope:
                capture_position_embeddings(attention[p.layer])
                rope = tables.setdefault(p.kind, RopeTable())  # a model's sliding layers may have their own RoPE
            layers.append(PlannedLayer(p.k_scheme, p.v_scheme, p.absmax, p.window if p.kind == "sliding" else None,
                                       kernels, p.layer, None if attention is None else attention[p.layer], rope))
        if model is not None:
            select(kernels, next(model.parameters()).device)  # a preference that cannot run fails here, in one line
        if model is not None and packed_decode and reads_through_interface(model):
            use_planned_attention(model)
            for layer in layers:
                layer.packed = True
        cache = cls(layers=layers)
        cache.rope_tables = list(tables.values())
        return cache

    def nbytes(self) -> int:
        """Every stored tensor: packed codes, scales, zero-points, sink and residual tokens, and the position tables
        of keys stored before RoPE (one per kind of layer, shared by its layers)."""
        return sum(layer.nbytes() for layer in self.layers) + sum(t.nbytes() for t in getattr(self, "rope_tables", []))
