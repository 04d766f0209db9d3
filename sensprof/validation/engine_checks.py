"""The configurations an engine check runs, as plans with the schemes sensprof emulates them with: every KV dtype
vLLM's CPU backend serves (with every layer quantized, and with fragile layers kept) and llama.cpp's cache pairs.
The engine tests (tests/engines/test_engine_agreement.py) and the agreement benchmarks run these same lists, and
a deliberately wrong emulation of each (round to nearest where vLLM's CPU backend rounds toward zero; K and V types
swapped for llama.cpp) shows that the agreement bounds still catch a real disagreement."""

from __future__ import annotations

import dataclasses

from ..artifacts import LayerPlan, LlamacppSettings, Plan, VllmSettings, engine_settings
from .validate_engine import LLAMACPP_BASELINE, LLAMACPP_FLOOR, VLLM_BASELINE, EngineRun, llamacpp_run, vllm_run

# (name, --kv-cache-dtype, scheme, checkpoint scales)
VLLM_CPU_CONFIGS = (("fp8", "fp8", "fp8_e4m3_rtz", False), ("fp8 cal", "fp8", "fp8_e4m3_cal_rtz", True),
                    ("fp8_e5m2", "fp8_e5m2", "fp8_e5m2_rtz", False))
LLAMACPP_PAIRS = (("q8_0", "q8_0"), ("q5_1", "q5_1"), ("q5_0", "q5_0"), ("q4_1", "q4_1"), ("q4_0", "q4_0"),
                  ("q8_0", "q4_0"), ("q4_0", "q8_0"))


def uniform_plan(model_id: str, model, k: str, v: str, skip=(), absmax=None) -> Plan:
    """A hand-made plan: (k, v) on every layer but `skip`, with each layer's calibration from `absmax`."""
    from ..models import describe_layers, fingerprint

    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, "none" if i.index in skip else k,
                        "none" if i.index in skip else v, 0.0, 0.0, absmax[i.index] if absmax else {})
              for i in describe_layers(model)]
    return Plan.hand_made(model_id, fingerprint(model), layers)


def vllm_cpu_runs(model_id: str, model, absmax, skip=(), round_to_nearest: bool = False) -> list[EngineRun]:
    """vLLM's baseline, then each VLLM_CPU_CONFIGS dtype on every layer and (with `skip`) with those layers kept.
    round_to_nearest: emulated with the GPUs' rounding, which the CPU backend does not do (a wrong emulation)."""
    runs = [VLLM_BASELINE]
    for name, dtype, scheme, scaled in VLLM_CPU_CONFIGS:
        emulated = _rounded(scheme, round_to_nearest)
        for kept in ((), tuple(skip)) if skip else ((),):
            settings = VllmSettings(needs_scales=scaled, kv_cache_dtype=dtype, k_scheme=emulated, v_scheme=emulated,
                                    skip_layers=kept, vllm_gpu="cpu")
            plan = uniform_plan(model_id, model, emulated, emulated, kept, absmax).replace(target="vllm",
                                                                                           engine=settings)
            runs.append(vllm_run(plan, "cpu", name + (" skip" if kept else "")))
    return runs


def vllm_cpu_mixed_run(model_id: str, model, skip=(), round_to_nearest: bool = False) -> EngineRun:
    """A per-layer plan for sensprof's vLLM plugin mixing every dtype it serves on the CPU backend: `skip` layers
    auto, the rest fp8_e4m3 and fp8_e5m2 in turn (emulated with the CPU's rounding toward zero, or, as a wrong
    emulation, round to nearest)."""
    return _per_layer_run(model_id, model, skip, ("fp8_e4m3", "fp8_e5m2"), "per-layer mix",
                          lambda d: (_rounded(d.k_scheme, round_to_nearest), _rounded(d.v_scheme, round_to_nearest)))


# a per-layer plan whose layers keep K and V in their own formats (the plugin's SENSPROF_KV backend) beside one of
# vLLM's own dtypes, in turn over the layers not kept at the model dtype
ASYM_CYCLE = ("k:fp8_e4m3/v:int4_t64", "k:auto/v:int3_t64", "fp8_e4m3", "k:fp8_e5m2/v:int5_t32")


def vllm_cpu_asym_run(model_id: str, model, skip=(), swap: bool = False) -> EngineRun:
    """A per-layer plan for sensprof's vLLM plugin with Keys and Values in their own formats (ASYM_CYCLE in turn,
    `skip` layers auto), emulated with the schemes the per-layer target prices each with; swap: K and V schemes
    exchanged in the emulation (a wrong one; the engine serves the plan as named)."""
    return _per_layer_run(model_id, model, skip, ASYM_CYCLE, "per-layer K/V",
                          lambda d: (d.v_scheme, d.k_scheme) if swap else d.schemes)


def _per_layer_run(model_id: str, model, skip, cycle, name: str, emulated) -> EngineRun:
    """`skip` layers auto, the rest the per-layer target's dtypes named in `cycle` in turn, served as exported and
    emulated with `emulated(dtype)` -> (K scheme, V scheme)."""
    from ..planning.planner import per_layer_engine
    from ..targets import get_target

    by_flag = {d.flag_value: d for d in get_target("vllm", "cpu", per_layer=True).dtypes}
    base = uniform_plan(model_id, model, "none", "none")
    pick = [by_flag["auto" if i in skip else cycle[i % len(cycle)]] for i in range(len(base.layers))]
    settings = engine_settings("vllm", per_layer_engine(pick, "cpu") | {"architecture": type(model).__name__})
    layers = [dataclasses.replace(p, k_scheme=k, v_scheme=v)
              for p, (k, v) in zip(base.layers, map(emulated, pick))]
    return vllm_run(base.replace(target="vllm", engine=settings, layers=layers), "cpu", name)


def _rounded(scheme: str, round_to_nearest: bool) -> str:
    return scheme.removesuffix("_rtz") if round_to_nearest else scheme


def llamacpp_runs(model_id: str, model, pairs=LLAMACPP_PAIRS, swap: bool = False) -> list[EngineRun]:
    """llama.cpp's baseline and floor, then each -ctk/-ctv pair with the schemes the llamacpp target prices it with
    (keys in the GGUF's channel order). swap: each pair emulated with its K and V types exchanged (a wrong
    emulation; the run keeps the engine's name and settings)."""
    from ..engines.llamacpp.catalog import channel_order, key_scheme, value_scheme

    order = channel_order(type(model).__name__)
    runs = [LLAMACPP_BASELINE, LLAMACPP_FLOOR]
    for k, v in pairs:
        ek, ev = (v, k) if swap else (k, v)
        plan = uniform_plan(model_id, model, key_scheme(ek, order), value_scheme(ev)).replace(
            target="llamacpp", engine=LlamacppSettings(cache_type_k=k, cache_type_v=v, channel_order=order))
        runs.append(llamacpp_run(plan, f"{k}/{v}"))
    return runs
