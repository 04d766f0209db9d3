"""SGLang: one --kv-cache-dtype, per-layer scales through --quantization-param-path JSON.

The JSON must pass SGLang's QuantParamSchema (python/sglang/srt/model_loader/weight_utils.py), or SGLang logs
an error and silently falls back to scale 1.0: `model_type` (required, may be null; must equal the loaded
config class's model_type), `kv_cache.dtype` == "float8_e4m3fn", and `kv_cache.scaling_factor` holding
exactly tp_size ranks 0..tp-1, each with every layer 0..num_hidden_layers-1. Each TP rank reads its own map
(kv_cache_scales_loader(..., tp_rank, tp_size, ...)) and a model's load_kv_cache_scales sets that one
per-layer scale as both k_scale and v_scale; the scale is per tensor, so every rank gets the same map.
"""

from __future__ import annotations

from ..errors import SensprofError
from ..artifacts import Plan
from ..constants import FP8_E4M3_MAX

SCALED_DTYPE = "fp8_e4m3"  # the only dtype SGLang's schema loads scales for
SCHEMA_DTYPE = "float8_e4m3fn"


def sglang_argv(plan: Plan, model_path: str, scales_path: str | None = None, tp: int = 1) -> list[str]:
    check_tp(tp)
    dtype = plan.engine.kv_cache_dtype
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model_path, "--kv-cache-dtype", dtype]
    if tp > 1:
        argv += ["--tp-size", str(tp)]  # ServerArgs.tp_size (alias --tensor-parallel-size)
    if scales_path:
        argv += ["--quantization-param-path", scales_path]
    return argv


def check_tp(tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise SensprofError(f"--tp must be at least 1 (the number of GPUs SGLang shards over), got {tp!r}")


def check_scales(plan: Plan) -> None:
    dtype = plan.engine.kv_cache_dtype
    if dtype != SCALED_DTYPE:
        raise SensprofError(
            f"--scales-out writes FP8 e4m3 scales, the only kind SGLang loads, but this plan uses --kv-cache-dtype "
            f"{dtype}: drop --scales-out or re-plan with `sensprof plan PROFILE_DIR --target sglang ...` on a "
            "profile holding fp8_e4m3_cal")


def sglang_scales(plan: Plan, model_type: str | None, num_layers: int, tp: int = 1) -> dict:
    """QuantParamSchema JSON; one scale per layer serves K and V, so it is the larger (neither clips)."""
    check_tp(tp)
    check_scales(plan)
    layers = sorted(p.layer for p in plan.layers)
    if layers != list(range(num_layers)):
        raise SensprofError(
            f"SGLang needs a scale for each of the model's {num_layers} layers but the plan covers {len(layers)}; "
            "re-profile all layers and re-plan")
    scales = {}
    for p in plan.layers:
        amax = max(max(p.absmax.get("K") or [0.0]), max(p.absmax.get("V") or [0.0]))
        scales[str(p.layer)] = max(amax / FP8_E4M3_MAX, 1e-12)
    return {"model_type": model_type,
            "kv_cache": {"dtype": SCHEMA_DTYPE, "scaling_factor": {str(r): dict(scales) for r in range(tp)}}}


# ---------------------------------------------------------------- the format's entry points (export.FORMATS)


def check(plan: Plan, opts, name: str) -> None:
    if opts.scales_out:
        check_scales(plan)


def needs_weights(opts) -> bool:
    return False


def command(plan: Plan, opts, loaded, name: str, model_path: str) -> tuple[list[str], list[str], bool]:
    lines = []
    if opts.scales_out:
        from ..files import write_json
        from ..models import model_config

        cfg = model_config(name)
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # what SGLang's text model holds
        layers = getattr(cfg, "num_hidden_layers", len(plan.layers))
        write_json(opts.scales_out, sglang_scales(plan, type(cfg).model_type or cfg.model_type, layers, opts.tp))
        lines.append(f"# wrote {opts.scales_out}: per-layer KV scales for TP ranks 0..{opts.tp - 1} "
                     "(--quantization-param-path)")
    elif plan.engine.needs_scales:
        lines.append("# this plan was measured with calibrated scales: add --scales-out FILE to get them into "
                     "SGLang (without them SGLang uses scale 1.0)")
    return sglang_argv(plan, model_path, opts.scales_out, opts.tp), lines, True
