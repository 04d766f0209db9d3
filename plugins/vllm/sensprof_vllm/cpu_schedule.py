"""On vLLM's CPU backend, give each layer the attention schedule made for its own KV dtype.

CPU_ATTN schedules a step's work once per KV-cache group (CPUAttentionMetadataBuilder.build), with the engine-wide
cache_config.cache_dtype, and that schedule carries the kernel's own sizes: the KV element, the Q, logits and output
buffers, the tile alignment, and the scratchpad each thread may use (csrc/cpu/cpu_attn.cpp get_scheduler_metadata,
which dispatches on the KV dtype). A plan that keeps some layers at auto beside fp8 ones sets the global to fp8
(plan.global_dtype), so without this every auto layer would run the float kernel on a schedule sized for the fp8
kernel (Gemma 3 270M, 256 tokens: 371,072 B of scratchpad a thread scheduled for fp8, 250,880 B for auto). The
builder here also schedules the step for each other dtype its group's layers hold, and each layer's forward takes
the schedule of its own dtype. Only engines serving a plan are touched; there a group whose layers all hold the
builder's dtype runs on the one schedule vLLM makes.
"""

from __future__ import annotations

import functools

_MARK = "_sensprof_schedule_wrapped"
SCHEDULES = "_sensprof_schedules"  # on a step's CPUAttentionMetadata: KV dtype -> its scheduler metadata
USED = "_sensprof_schedule_dtype"  # on a CPU_ATTN impl: the KV dtype of the schedule its last forward ran on


def group_dtypes(builder) -> tuple[str, ...]:
    """The KV dtypes of the CPU_ATTN layers in this builder's group; none in an engine without a plan (cached: a
    group's layers do not change once built)."""
    cached = getattr(builder, "_sensprof_group_dtypes", None)
    if cached is not None:
        return cached
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from .patch import planned

    found = ()
    if planned(builder.vllm_config):
        layers = get_layers_from_vllm_config(builder.vllm_config, Attention, builder.layer_names)
        found = tuple(sorted({str(layer.impl.kv_cache_dtype) for layer in layers.values()
                              if isinstance(layer.impl, CPUAttentionBackendImpl)}))
    builder._sensprof_group_dtypes = found
    return found


def _wrap_build(orig):
    @functools.wraps(orig)
    def build(self, *args, **kwargs):
        meta = orig(self, *args, **kwargs)
        own, dtypes = str(self.kv_cache_dtype), group_dtypes(self)
        if not dtypes:  # no plan: vLLM's own schedule, untouched
            return meta
        schedules = {own: meta.scheduler_metadata}
        saved = self.kv_cache_dtype
        try:
            for dtype in (d for d in dtypes if d != own):  # the same step, scheduled for the kernel of that dtype
                self.kv_cache_dtype = dtype
                schedules[dtype] = orig(self, *args, **kwargs).scheduler_metadata
        finally:
            self.kv_cache_dtype = saved
        setattr(meta, SCHEDULES, schedules)
        return meta

    setattr(build, _MARK, True)
    return build


def _wrap_forward(orig):
    @functools.wraps(orig)
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        schedules = getattr(attn_metadata, SCHEDULES, None)
        if schedules is not None:
            dtype = str(self.kv_cache_dtype)
            attn_metadata.scheduler_metadata = schedules[dtype]
            setattr(self, USED, dtype)
        return orig(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

    setattr(forward, _MARK, True)
    return forward


def install() -> None:
    """Wrap CPU_ATTN's builder and impl once per process; a vLLM without the CPU backend's module is left as it is."""
    try:
        from vllm.v1.attention.backends import cpu_attn
    except ImportError:
        return
    builder, impl = cpu_attn.CPUAttentionMetadataBuilder, cpu_attn.CPUAttentionBackendImpl
    if not getattr(builder.build, _MARK, False):
        builder.build = _wrap_build(builder.build)
    if not getattr(impl.forward, _MARK, False):
        impl.forward = _wrap_forward(impl.forward)
