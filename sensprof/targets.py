"""What each serving engine can express, as data the planner and exporters share (no torch).

A target offers *options* for each tensor of each layer and constraints that tie them:
  sensprof  any profiled scheme per layer, K and V independent (sensprof's own runtime runs it)
  vllm      one global --kv-cache-dtype (its K and V formats), plus layers kept at the model dtype; with
            per_layer, each layer its own dtype (served by sensprof's vLLM plugin, plugins/vllm)
  sglang    one global dtype for K and V, no skipping
  llamacpp  one K type and one V type for all layers (-ctk / -ctv)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .engines.llamacpp.catalog import CACHE_TYPES, key_scheme, value_scheme
from .engines.llamacpp.catalog import channel_order as llamacpp_channel_order  # noqa: F401  (for plan and api)
from .engines.vllm.catalog import GPU_NAMES, check_vllm_gpu  # noqa: F401  (no torch; imports nothing from here)
from .errors import SensprofError

VLLM_GPUS = tuple(GPU_NAMES)
DEFAULT_VLLM_GPU = VLLM_GPUS[0]


@dataclass(frozen=True)
class EngineDtype:
    """One value of an engine's KV-cache flag, and the profiled schemes that reproduce its K and V."""

    flag_value: str
    k_scheme: str
    v_scheme: str
    needs_scales: bool = False  # calibrated: the engine must be given per-layer scales
    boundary_skip: int = 0  # the engine itself keeps the first and last N attention layers at the model dtype

    @property
    def schemes(self) -> tuple[str, str]:
        return self.k_scheme, self.v_scheme

    def forced_skips(self, n_layers: int) -> list[int]:
        """Layers the engine keeps at the model dtype whatever the user asks: vLLM's boundary layers, the first
        and last min(N, layers // 2) of a dense model (TurboQuantConfig.get_boundary_skip_layers)."""
        b = min(self.boundary_skip, n_layers // 2)
        return sorted(set(range(b)) | set(range(max(0, n_layers - b), n_layers)))


def same(flag: str, scheme: str | None = None, **kw) -> EngineDtype:
    return EngineDtype(flag, scheme or flag, scheme or flag, **kw)


# how the engine lets choices vary: per layer and tensor, one dtype plus skipped layers, one for K and V, one each
Structure = Literal["free", "global_skip", "global", "global_kv", "per_layer"]

# The dtypes sensprof's vLLM plugin gives a layer of its own, per platform (plugins/vllm, docs/vllm-plugin.md: checked
# in the running engine on vLLM's CPU backend only; calibrated scales need a checkpoint kv_cache_scheme, which would
# override the plan, so none are offered). On CUDA the plugin builds every layer on TRITON_ATTN, whose impl reads only
# its own layer's dtype (vLLM 0.33 triton_attn.py:509, 560): not fp8_e5m2 (Attention.forward casts the query of any
# fp8* layer and then asserts the dtype is fp8/fp8_e4m3, attention.py:471-520), no fp8 below SM89 (triton_attn.py:
# 514-523: Ampere), no TurboQuant (its backend keeps the boundary-skip rule for a global dtype only) or nvfp4
# (FlashInfer's 0.33 builder reads the global dtype). Not yet run on a GPU.
_TRITON = ("auto", "fp8_e4m3", "fp8_per_token_head", "int8_per_token_head", "int4_per_token_head")
PER_LAYER_DTYPES = {"cpu": ("auto", "fp8_e4m3", "fp8_e5m2"), "hopper": _TRITON, "blackwell": _TRITON,
                    "ampere": ("auto", "int8_per_token_head", "int4_per_token_head")}
# TRITON_ATTN casts an fp8_e4m3 layer's query to fp8 (unit scale) on every CUDA GPU (supports_quant_query_input,
# triton_attn.py:553), so such a layer's keys are the query-cast scheme there, whatever backend one dtype would get
PER_LAYER_K_SCHEME = {("fp8_e4m3", gpu): "fp8_e4m3_qfp8" for gpu in ("hopper", "blackwell")}
# Keys and Values in their own formats, "k:<K>/v:<V>", served by the plugin's SENSPROF_KV backend (a pure-PyTorch
# attention backend, checked on vLLM's CPU backend): each tensor as the model dtype (K only), fp8 (written as vLLM's
# CPU backend writes fp8: unit scale, toward zero) or b-bit per-token groups (int<b>_t<g>, KIVI's value layout, which
# the cache can write token by token for keys too); the plugin stores exactly sensprof's codes
PAIR_PLATFORMS = ("cpu",)
PAIR_INT = {f"int{b}_t{g}": f"int{b}_t{g}" for b in (8, 6, 5, 4, 3, 2) for g in (32, 64, 128)}
PAIR_K = {"auto": "none", "fp8_e4m3": "fp8_e4m3_rtz", "fp8_e5m2": "fp8_e5m2_rtz", **PAIR_INT}
PAIR_V = {"fp8_e4m3": "fp8_e4m3_rtz", "fp8_e5m2": "fp8_e5m2_rtz", **PAIR_INT}


def is_pair(flag: str) -> bool:
    """A per-layer dtype that stores K and V in their own formats (the plugin's backend), not one of vLLM's."""
    return flag.startswith("k:")


def pair_dtypes(gpu: str, head_dims=None) -> tuple[EngineDtype, ...]:
    """The (K, V) format pairs of the plugin's backend on `gpu` whose groups fit the model's head dims; a pair that
    is one of vLLM's own dtypes (the same fp8 for both) is left to it."""
    if gpu not in PAIR_PLATFORMS:
        return ()

    def fits(c: str) -> bool:
        g = int(c.rpartition("_t")[2]) if c.startswith("int") else 0
        return not g or all(h % min(g, h) == 0 for h in head_dims or ())

    return tuple(EngineDtype(f"k:{k}/v:{v}", ks, vs) for k, ks in PAIR_K.items() for v, vs in PAIR_V.items()
                 if not (k == v and k.startswith("fp8")) and fits(k) and fits(v))


# the formats a --target vllm profile for a pair platform measures besides vLLM's dtypes, so that `plan --per-layer`
# can store K and V in the plugin's own formats; the planner takes any other PAIR_K / PAIR_V the profile holds.
# Keys: 8-bit groups of 32 beside 6-bit values of 32 take exactly fp8's bytes (9 + 7 bits an element, K and V), so on
# a sliding-window model, where a layer's bytes must divide the largest layer's, they mix with fp8 and auto layers;
# on Gemma 3 270M that pair measured 6.5e-4 KL where fp8 measured 1.2e-2 (docs/vllm-plugin.md)
PAIR_PROFILE_K = ("int8_t32", "int8_t64", "int6_t32", "int4_t32")
PAIR_PROFILE_V = (*(f"int{b}_t64" for b in (8, 6, 5, 4, 3, 2)), "int8_t32", "int6_t32", "int4_t32")


def pair_profile_formats(gpu: str, head_dims=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(keys, values) of PAIR_PROFILE_K / PAIR_PROFILE_V that some pair the plugin serves on `gpu` stores."""
    pairs = pair_dtypes(gpu, head_dims)
    keys, values = {d.k_scheme for d in pairs}, {d.v_scheme for d in pairs}
    return tuple(k for k in PAIR_PROFILE_K if k in keys), tuple(v for v in PAIR_PROFILE_V if v in values)


def per_layer_flags(gpu: str | None) -> tuple[str, ...]:
    """Every per-layer dtype a plan for `gpu` may name: vLLM's own the plugin serves there, and the pairs."""
    return PER_LAYER_DTYPES.get(gpu, ()) + tuple(d.flag_value for d in pair_dtypes(gpu))


@dataclass(frozen=True)
class Target:
    name: str
    structure: Structure
    dtypes: tuple[EngineDtype, ...] = ()
    description: str = ""
    gpu: str | None = None  # vllm: the GPU generation the dtypes were chosen for
    pairs: frozenset | None = None  # global_kv: the (K flag, V flag) pairs allowed; None = any
    channel_order: str = "halves"  # llamacpp: the key channel order of the model's GGUF (engines/llamacpp/catalog.py)

    def allows(self, k: EngineDtype, v: EngineDtype) -> bool:
        return self.pairs is None or (k.flag_value, v.flag_value) in self.pairs

    def schemes_needed(self) -> list[str]:
        """Every scheme a profile must hold for this target to consider all its dtypes."""
        return list(dict.fromkeys(s for d in self.dtypes for s in d.schemes if s != "none"))


SGLANG_DTYPES = (
    same("auto", "none"),
    same("fp8_e4m3"),
    same("fp8_e4m3", "fp8_e4m3_cal", needs_scales=True),
    same("fp8_e5m2"),
)


def llamacpp_types(order: str = "halves") -> tuple[EngineDtype, ...]:
    """-ctk / -ctv as llama.cpp runs them (engines/llamacpp/catalog.py): rotated K with its query quantized beside
    it, in the channel order the model's GGUF holds; rotated V."""
    return (same("f16", "none"), *(EngineDtype(t, key_scheme(t, order), value_scheme(t)) for t in CACHE_TYPES))


LLAMACPP_TYPES = llamacpp_types()

# llama.cpp's CUDA flash-attention kernels (ggml/src/ggml-cuda/fattn.cu): without -DGGML_CUDA_FA_ALL_QUANTS=ON a
# build has them for same-type f16/q4_0/q8_0/bf16 and K q8_0 / V q4_0 only; a quantized K with an f16 V needs no
# flash attention (src/llama-context.cpp), so it runs on any build.
LLAMACPP_K_TYPES = CACHE_TYPES
CUDA_DEFAULT_FA_PAIRS = frozenset({("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "q8_0"), ("q8_0", "q4_0"),
                                   ("bf16", "bf16")})
LLAMACPP_BUILDS = {
    "any": None,
    "cuda-default": CUDA_DEFAULT_FA_PAIRS | {(k, "f16") for k in LLAMACPP_K_TYPES},
}

TARGETS = {
    "sensprof": Target("sensprof", "free", description="any profiled scheme per layer, K and V independent"),
    "vllm": Target("vllm", "global_skip", (),
                   "one --kv-cache-dtype (its own K and V formats), plus --kv-cache-dtype-skip-layers kept at the "
                   "model dtype"),
    "sglang": Target("sglang", "global", SGLANG_DTYPES, "one --kv-cache-dtype for K and V, no skipping"),
    "llamacpp": Target("llamacpp", "global_kv", LLAMACPP_TYPES, "one K type (-ctk) and one V type (-ctv) for all layers"),
}


def engine_dtypes(gpu: str, head_dims=None):
    """The dtypes vLLM runs on `gpu` (and, given the model's head dims, that its kernels take)."""
    from .engines.vllm.catalog import DTYPES

    out = []
    for d in DTYPES:
        if gpu not in d.gpus or any(d.head_dim_problem(h, gpu) for h in head_dims or ()):
            continue
        k, v = d.schemes_on(gpu)
        out.append(EngineDtype(d.flag_value, k, v, needs_scales=d.needs_scales, boundary_skip=d.boundary_skip))
    return tuple(out)


def get_target(name: str, vllm_gpu: str | None = None, llamacpp_build: str | None = None,
               head_dims=None, channel_order: str = "halves", per_layer: bool = False) -> Target:
    """The target as the planner sees it: vLLM's dtypes that run on `vllm_gpu` (default hopper) with the model's
    `head_dims` (per_layer: each layer its own, of PER_LAYER_DTYPES), llama.cpp's pairs that `llamacpp_build` runs,
    its keys in the GGUF's `channel_order`."""
    if per_layer and name != "vllm":
        raise SensprofError(f"--per-layer gives each vLLM layer its own dtype; target {name} has none: drop it or "
                            "use --target vllm --vllm-gpu cpu")
    try:
        target = TARGETS[name]
    except KeyError:
        raise SensprofError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None
    if vllm_gpu is not None and name != "vllm":
        raise SensprofError(f"--vllm-gpu only applies to target vllm, not {name}")
    if llamacpp_build is not None and name != "llamacpp":
        raise SensprofError(f"--llamacpp-build only applies to target llamacpp, not {name}")
    if name == "vllm":
        gpu = check_vllm_gpu(vllm_gpu or DEFAULT_VLLM_GPU)
        if not per_layer:
            return dataclasses.replace(target, dtypes=engine_dtypes(gpu, head_dims), gpu=gpu)
        if gpu not in PER_LAYER_DTYPES:
            raise SensprofError(f"--per-layer plans are served by sensprof's vLLM plugin on vLLM's CPU backend and "
                                f"on NVIDIA GPUs (CUDA), not on {GPU_NAMES.get(gpu, gpu)}: plan with --vllm-gpu "
                                f"{' or '.join(PER_LAYER_DTYPES)}, or drop --per-layer")
        spelled = {"fp8": "fp8_e4m3"}  # the plugin names each layer's dtype in full (fp8 is e4m3 in vLLM)
        dtypes = (same("auto", "none"),) + tuple(
            EngineDtype(f, PER_LAYER_K_SCHEME.get((f, gpu), d.k_scheme), d.v_scheme)
            for d in engine_dtypes(gpu, head_dims) for f in (spelled.get(d.flag_value, d.flag_value),)
            if f in PER_LAYER_DTYPES[gpu] and not d.needs_scales)
        return dataclasses.replace(target, structure="per_layer", dtypes=dtypes + pair_dtypes(gpu, head_dims), gpu=gpu,
                                   description="each layer its own KV dtype, or its K and V in their own formats, "
                                               "through sensprof's vLLM plugin")
    if name == "llamacpp" and channel_order != "halves":
        target = dataclasses.replace(target, dtypes=llamacpp_types(channel_order), channel_order=channel_order)
    if llamacpp_build is not None:
        if llamacpp_build not in LLAMACPP_BUILDS:
            raise SensprofError(f"unknown --llamacpp-build {llamacpp_build!r}; choose one of {', '.join(LLAMACPP_BUILDS)}")
        return dataclasses.replace(target, pairs=LLAMACPP_BUILDS[llamacpp_build])
    return target


def engine_dtype_for(target: Target, k_scheme: str, v_scheme: str | None = None) -> EngineDtype | None:
    for d in target.dtypes:
        if d.k_scheme == k_scheme and d.v_scheme == (v_scheme or k_scheme):
            return d
    return None


def profile_menu(schemes: str | None, target: str | None, vllm_gpu: str | None, head_dims=None,
                 k_schemes: str | None = None, v_schemes: str | None = None, channel_order: str = "halves",
                 menus: str | None = None):
    """The profile's menu: --schemes (both tensors), --k-schemes, --v-schemes, and what --target needs (both
    tensors, each scheme where it applies); the named K and V menus (--menus, default "default") where none of these
    name a tensor's."""
    from .schemes import parse_menu

    if menus is not None and target is not None and target != "sensprof":
        raise SensprofError(f"--menus chooses sensprof's own menus; target {target} profiles its engine's types: drop "
                            "--menus or --target")
    menus = menus or "default"

    both = [schemes] if schemes else []
    gpu = check_vllm_gpu(vllm_gpu or DEFAULT_VLLM_GPU) if target == "vllm" else None
    if target is not None and target != "sensprof":
        both += get_target(target, vllm_gpu, head_dims=head_dims, channel_order=channel_order).schemes_needed()
        # and the keys a per-layer plan's fp8 layers store there (TRITON_ATTN casts the query)
        both += [k for (_, g), k in PER_LAYER_K_SCHEME.items() if g == gpu]
    elif vllm_gpu is not None:
        raise SensprofError("--vllm-gpu needs --target vllm")
    pair_keys = ()
    if target == "vllm" and not schemes:  # the formats a per-layer plan may store K and V in with the plugin
        pair_keys, pair_values = pair_profile_formats(gpu, head_dims)
        v_schemes = ",".join(dict.fromkeys(filter(None, [*(v_schemes or "").split(","), *pair_values]))) or None
    menu = parse_menu(",".join(both) or None, k_schemes, v_schemes, menus)
    if pair_keys:  # keys in per-token groups, added here: parse_menu refuses them from a user's key menu
        from .schemes import get_scheme

        menu = type(menu)(tuple({s.name: s for s in (*menu.k, *map(get_scheme, pair_keys))}.values()), menu.v)
    if target == "sensprof" and (schemes or k_schemes or v_schemes):
        default = parse_menu(menus=menus)
        menu = type(menu)(tuple({s.name: s for s in (*default.k, *menu.k)}.values()),
                          tuple({s.name: s for s in (*default.v, *menu.v)}.values()))
    return menu
