"""From a solved program to a plan (sensprof.artifacts.Plan): each layer's schemes, damage, calibration, and the
storage the plan is predicted to cost (for vLLM, its pool too: the exporter reads the same vllm_layers)."""

from __future__ import annotations

import dataclasses
import sys

from ..artifacts import LayerPlan, Plan, Predicted, SolverRecord, engine_settings, now, predicted_summary, profile_ref
from ..constants import GIB
from ..errors import SensprofError
from ..engines.vllm import facts
from ..memory import MODEL_BITS
from .budget import Budget

PROFILE_KEYS = ("settings", "window_slots", "text_files", "text")  # what a plan keeps of its profile's meta.json


def held_avg_bits(layers, n_tokens: int) -> float:
    """Average bits per element the plan's cache holds after n_tokens, as Budget(context_len=n_tokens) prices it:
    sinks, residual windows and incomplete groups at 16 bits, each layer weighed by the tokens it holds (a
    sliding-window layer its window)."""
    at = Budget("avg_bits", MODEL_BITS, context_len=n_tokens)  # only its pricing is used, not its value
    shapes = [{"kv_heads": p.kv_heads, "head_dim": p.head_dim, "kind": getattr(p, "kind", None),
               "window": getattr(p, "window", None)} for p in layers]
    return at.layers_cost([(p.k_scheme, p.v_scheme) for p in layers], shapes) / at.elements(shapes)


def build_plan(profile, solution, target: str, objective: str, budget, pricing=None, table=None) -> Plan:
    """`table`: the profile's table as the planner priced it (sensprof.pricing; default the measured one), whose
    damage each layer records; `pricing`: how it was priced."""
    meta = profile.meta
    table = profile.table if table is None else table
    layers = []
    for info, (k, v) in zip(meta["layers"], solution.choices):
        i = info["index"]
        layers.append(LayerPlan(
            layer=i, kind=info["kind"], window=info["window"], kv_heads=info["kv_heads"], head_dim=info["head_dim"],
            k_scheme=k, v_scheme=v, k_damage=0.0 if k == "none" else _damage(table, i, "K", k, objective),
            v_damage=0.0 if v == "none" else _damage(table, i, "V", v, objective),
            absmax=profile.calibration.get(str(i), {})))
    predicted = {"damage": solution.damage, "objective": objective, "budget_used": solution.cost,
                 "budget_limit": solution.limit, **predicted_summary(layers)}
    if pricing is not None:
        predicted["pricing"] = pricing.to_json()
    n = getattr(budget, "context_len", None)
    if n:  # what a cache of that length holds, full-precision tokens included (the budget priced this)
        predicted["context_len"] = n
        predicted["avg_bits_at_context"] = held_avg_bits(layers, n)
    fp = meta["model"]["fingerprint"]
    return Plan(
        model_id=meta["model"]["id"], model_fingerprint=fp, target=target, objective=objective, budget=budget,
        layers=tuple(layers), engine=solution.engine if not isinstance(solution.engine, dict) else engine_settings(target, solution.engine), predicted=Predicted(**predicted),
        solver=SolverRecord(name="PuLP CBC", status=solution.status, time_s=solution.solve_time_s),
        profile=profile_ref({"path": profile.path, **{k: meta.get(k) for k in PROFILE_KEYS}}, fp),
        created=now())


def _damage(table, layer, tensor, scheme, objective) -> float:
    from ..profiling.table import OBJECTIVES

    t = table
    row = t[(t.layer == layer) & (t.tensor == tensor) & (t.scheme == scheme)]
    return float(row[OBJECTIVES[objective]].iloc[0])


def priced_table(profile, target: str, tgt, context_len: int | None):
    """(the profile's usable cells priced for the target's reads at the serving length, Pricing): sensprof.pricing."""
    from .pricing import price
    from .planner import runtime_format
    from ..profiling.table import length_profiles, usable_cells

    table = usable_cells(profile)
    usable = ({s for s in table.scheme if runtime_format(s)} if tgt.structure == "free"
              else set(tgt.schemes_needed()))
    shorter = {n: p.table for n, p in length_profiles(profile).items()
               if n < int(profile.meta["settings"]["seq_len"])} if profile.path else {}
    return price(table, profile.meta, target, context_len, shorter, usable)


def make_plan(profile_dir: str, target: str, budget, objective: str = "kl", num_skip=None, vllm_gpu=None,
              llamacpp_build=None, robust: float = 0.0, per_layer: bool = False) -> Plan:
    from .planner import plan, problem_from_table
    from ..profiling.table import load_profile
    from ..targets import get_target, llamacpp_channel_order

    get_target(target, vllm_gpu, llamacpp_build, per_layer=per_layer)  # a bad option fails before the profile is read
    if per_layer and num_skip is not None:
        raise SensprofError("--num-skip counts the layers a one-dtype plan keeps; --per-layer gives every layer its "
                            "own dtype: drop one of them")
    profile = load_profile(profile_dir, require_complete=True)
    tgt = get_target(target, vllm_gpu, llamacpp_build, {layer["head_dim"] for layer in profile.meta["layers"]},
                     llamacpp_channel_order(profile.meta["model"].get("class")), per_layer=per_layer)
    context = budget.context_len
    if budget.kind == "serving":  # damage priced at the longest request vLLM serves, which the model's positions cap
        limit = profile.meta.get("max_positions")
        context = min(budget.max_model_len, int(limit)) if limit else budget.max_model_len
    table, pricing = priced_table(profile, target, tgt, context)
    problem = problem_from_table(table, profile.meta["layers"], objective, robust)
    solution = plan(problem, tgt, budget, num_skip)
    result = build_plan(profile, solution, target, objective, budget, pricing, table)
    if per_layer:  # the plugin checks the served model's class against the one profiled
        result = result.replace(engine=dataclasses.replace(result.engine, architecture=profile.meta["model"].get("class")))
    if robust:
        result = result.replace(solver=dataclasses.replace(result.solver, robust=robust))
    if target == "vllm" and budget.kind == "serving":
        result = with_vllm_pool(result, budget)
    return result


def vllm_layers(plan: Plan) -> list[tuple]:
    """(dtype, kv_heads, head_dim, sliding window) per layer, as vLLM allocates them (facts.plan_pool)."""
    dtype = plan.engine.kv_cache_dtype
    if dtype not in facts.DTYPES:
        return []
    skipped = set(plan.engine.skip_layers or [])
    own = plan.layer_dtypes  # a per-layer plan: each layer's, as served
    try:
        layers = [(own[p.layer] if own else "auto" if p.layer in skipped else dtype, p.kv_heads, p.head_dim,
                   p.window if p.kind == "sliding" else None) for p in plan.layers]
        facts.plan_pool(layers)
    except (KeyError, ValueError):
        return []
    return layers


def with_vllm_pool(plan: Plan, budget) -> Plan:
    """The planner prices each layer's own bytes; vLLM's pool also aligns block sizes and pads pages when skipped
    and quantized layers share it (hybrid sliding-window models). Record what vLLM would need and say if it is more."""
    layers = vllm_layers(plan)
    if not layers:
        return plan
    pool = facts.plan_pool(layers, block_size=facts.default_block_size(plan.engine.vllm_gpu))
    need = pool.blocks_per_request(budget.max_model_len) * budget.max_num_seqs * pool.bytes_per_block
    plan = plan.replace(predicted=dataclasses.replace(plan.predicted, vllm_pool_bytes=need))
    if need > budget.value * GIB:
        print(f"sensprof: note: vLLM's pool needs {need / GIB:.4g} GiB for this plan ({budget.max_num_seqs} x "
              f"{budget.max_model_len} tokens, its block alignment and page padding included), more than "
              f"--gpu-mem-gib {budget.value:g}; give vLLM that much, or plan with a smaller --gpu-mem-gib",
              file=sys.stderr)
    return plan
