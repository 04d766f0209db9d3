"""SGLang: one --kv-cache-dtype, per-layer scales through --quantization-param-path JSON."""

from __future__ import annotations

from ..plan import Plan

TORCH_DTYPE_NAMES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
E5M2_MAX = 57344.0


def sglang_argv(plan: Plan, model_path: str, scales_path: str | None = None) -> list[str]:
    dtype = plan.engine.get("kv_cache_dtype", "auto")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model_path, "--kv-cache-dtype", dtype]
    if scales_path and dtype != "auto":
        argv += ["--quantization-param-path", scales_path]
    return argv


def sglang_scales(plan: Plan) -> dict:
    """{"kv_cache": {"dtype", "scaling_factor": {tp_rank: {layer: scale}}}}; one scale per layer serves
    K and V, so it is the larger of the two (no clipping of either)."""
    dtype = plan.engine.get("kv_cache_dtype", "fp8_e4m3")
    fmax = E5M2_MAX if dtype == "fp8_e5m2" else 448.0
    scales = {}
    for p in plan.layers:
        amax = max(max(p.absmax.get("K") or [0.0]), max(p.absmax.get("V") or [0.0]))
        scales[str(p.layer)] = max(amax / fmax, 1e-12)
    return {"kv_cache": {"dtype": TORCH_DTYPE_NAMES.get(dtype, dtype), "scaling_factor": {"0": scales}}}
