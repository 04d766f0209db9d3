"""llama.cpp: one K cache type (-ctk) and one V cache type (-ctv) for all layers.

Facts from llama.cpp's source:
- src/llama-context.cpp (llama_init_from_model): a quantized V cache needs flash attention: `-fa auto` (the
  default) turns it on, `-fa off` fails ("V cache quantization requires flash_attn"). A quantized K cache with
  an f16 V runs without it (K is read as is; V would need a transpose that block formats cannot do).
- ggml/src/ggml-cuda/fattn.cu: without -DGGML_CUDA_FA_ALL_QUANTS=ON (ggml/CMakeLists.txt, default OFF) the
  CUDA FA kernels exist only for K == V of f16/q4_0/q8_0/bf16 plus the mixed pair K q8_0 / V q4_0; any other
  pair aborts under `-fa on` (BEST_FATTN_KERNEL_NONE) and makes `-fa auto` fall back to attention without FA,
  which a quantized V cannot use.
"""

from __future__ import annotations

from ..errors import SensprofError
from ..artifacts import Plan
from ..targets import CUDA_DEFAULT_FA_PAIRS as CUDA_DEFAULT_PAIRS
from ..targets import LLAMACPP_BUILDS

UNQUANTIZED = ("f16", "f32", "bf16")
BUILDS = tuple(LLAMACPP_BUILDS)
CUDA_FA_OPTION = "-DGGML_CUDA_FA_ALL_QUANTS=ON"


def allowed_pairs(build: str) -> set[tuple[str, str]] | None:
    """(K, V) pairs a llama.cpp build serves (targets.LLAMACPP_BUILDS); None = any (CPU/Metal, or CUDA built with
    all FA quants). cuda-default: the FA pairs, plus a quantized K with an f16 V (no FA needed, -fa auto)."""
    if build not in LLAMACPP_BUILDS:
        raise SensprofError(f"unknown llama.cpp build {build!r}; choose one of {', '.join(BUILDS)}")
    pairs = LLAMACPP_BUILDS[build]
    return None if pairs is None else set(pairs)


def llamacpp_argv(plan: Plan, model_path: str) -> list[str]:
    k, v = cache_types(plan)
    argv = ["llama-server", "-m", model_path, "-ctk", k, "-ctv", v]
    if v not in UNQUANTIZED:
        argv += ["-fa", "on"]  # a quantized V cache needs flash attention; say so rather than rely on auto
    return argv


def cache_types(plan: Plan) -> tuple[str, str]:
    return plan.engine.cache_type_k, plan.engine.cache_type_v


def build_comments(plan: Plan) -> list[str]:
    """What build the pair needs, so a CUDA user learns it before the server aborts."""
    k, v = cache_types(plan)
    if (k, v) in CUDA_DEFAULT_PAIRS or (k, v) == ("f16", "f16"):
        return []
    if v in UNQUANTIZED:
        return [f"# K {k} with an unquantized V runs without flash attention on any build; a CUDA build uses FA "
                f"for it only when compiled with {CUDA_FA_OPTION} (leave -fa at its default, auto)"]
    return [f"# -ctk {k} -ctv {v} with flash attention on CUDA needs llama.cpp built with cmake {CUDA_FA_OPTION} "
            "(a default CUDA build has FA kernels only for same-type f16/q8_0/q4_0 and K q8_0 / V q4_0)"]


# ---------------------------------------------------------------- the format's entry points (export.FORMATS)


def check(plan: Plan, opts, name: str) -> None:
    return None


def needs_weights(opts) -> bool:
    return False


def floor_comment(plan: Plan) -> list[str]:
    """The damage llama.cpp adds beyond what its cache stores: its matmuls round their inputs, and those roundings
    carry any change on (engines/llamacpp/numerics.py); the plan is priced on the float32 model, which has none."""
    if cache_types(plan) == ("f16", "f16"):
        return []
    return ["# llama.cpp adds a floor of its own with any quantized cache (its matmuls round their inputs, which "
            "carries any change on); `sensprof validate PLAN --engine llamacpp` measures it and emulates it "
            "(docs/engines.md)"]


def command(plan: Plan, opts, loaded, name: str, model_path: str) -> tuple[list[str], list[str], bool]:
    return llamacpp_argv(plan, model_path), build_comments(plan) + floor_comment(plan), True
