"""vLLM: `vllm serve MODEL --kv-cache-dtype D [--kv-cache-dtype-skip-layers ...]`, gated by version."""

from __future__ import annotations

from ..errors import SensprofError
from ..plan import Plan

SKIP_FLAG_SINCE = (0, 19)  # --kv-cache-dtype-skip-layers first released about v0.19
CALCULATE_SCALES_REMOVED = (0, 30)  # --calculate-kv-scales: deprecated 2026-03, removed 2026-07
DEFAULT_VERSION = "0.33.0"
VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                  "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                  "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
                  "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
PER_TOKEN_HEAD_SINCE = (0, 30)


def parse_version(text: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in text.strip().lstrip("v").split(".")[:3])
    except ValueError:
        parts = ()
    if len(parts) < 2:
        raise SensprofError(f"unknown vLLM version {text!r}; pass it as X.Y or X.Y.Z, e.g. --vllm-version 0.33.0")
    return parts


def skip_tokens(plan: Plan) -> list[str]:
    """Layer indices, with `sliding_window` standing for exactly the skipped sliding layers when that
    covers every sliding layer of the model."""
    skipped = list(plan.engine.get("skip_layers") or [])
    sliding = [p.layer for p in plan.layers if p.kind == "sliding"]
    if sliding and set(sliding) <= set(skipped):
        rest = [i for i in skipped if i not in sliding]
        return ["sliding_window"] + [str(i) for i in rest]
    return [str(i) for i in skipped]


def vllm_argv(plan: Plan, model_path: str, version: str = DEFAULT_VERSION) -> list[str]:
    v = parse_version(version)
    dtype = plan.engine.get("kv_cache_dtype", "auto")
    if dtype not in VLLM_KV_DTYPES:
        raise SensprofError(f"the plan's KV dtype {dtype!r} is not one vLLM accepts; re-plan with --target vllm")
    if dtype.endswith("_per_token_head") and v < PER_TOKEN_HEAD_SINCE:
        raise SensprofError(f"--kv-cache-dtype {dtype} needs vLLM >= 0.30; pass a newer --vllm-version or "
                            "re-plan with fp8 only")
    argv = ["vllm", "serve", model_path, "--kv-cache-dtype", dtype]
    skip = skip_tokens(plan) if dtype != "auto" else []
    if skip:
        if v < SKIP_FLAG_SINCE:
            raise SensprofError(
                f"the plan keeps layers {' '.join(skip)} at the model dtype, but vLLM {version} has no "
                "--kv-cache-dtype-skip-layers (added in 0.19): pass --vllm-version 0.19 or later, or re-plan with "
                "--num-skip 0")
        argv += ["--kv-cache-dtype-skip-layers", *skip]
    return argv
