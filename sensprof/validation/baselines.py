"""The uniform baselines a plan must beat, found by measurement among every uniform configuration its target can
express within the plan's memory (sensprof.planning.uniforms: the free target's every stored layout, or for a
per-layer vLLM plan every dtype the plugin serves), not only the profile's menus.

Two steps. A short screen measures each K scheme of the candidates alone (values unquantized) and each V scheme
alone, with every layer quantized, on one window of the length judged (at least 512 tokens): a few dozen
whole-model passes, shared by every pair (damage adds across K and V to first order, as the planner's sum assumes).
The `top` pairs of least summed damage are the baselines; `plan --select-measured` and `validate` then measure them
whole, beside the plan, on their own windows.
"""

from __future__ import annotations

import math

from ..artifacts import HAND_MADE, LayerPlan, Plan
from ..planning.uniforms import Uniform, candidates, per_layer_candidates, rank
from ..profiling.hooks import layers_with_rope
from .validate import layer_choices, measure

TOP = 3  # baselines measured whole beside the plan
SCREEN_TOKENS = 512  # the screen's window: long enough that 128-token groups and a 32-token residual window act


def screen_length(n: int, longest: int) -> int:
    """The screen's window for baselines judged at `n` tokens: `n` itself, or SCREEN_TOKENS where `n` is shorter,
    within `longest` (the longest window the text gives). Which uniform setting wins moves with the length (at
    1024 tokens 128-token key groups, at 4096 sinks and a residual window: they cost less there), so each length
    is ranked at its own; below a few hundred tokens a 128-token group or a residual window quantizes little or
    nothing and would screen as lossless."""
    return min(longest, max(n, SCREEN_TOKENS))


def layer_info(layers) -> list[dict]:
    """The budget's view of a plan's layers."""
    return [{"kv_heads": p.kv_heads, "head_dim": p.head_dim, "kind": p.kind, "window": p.window} for p in layers]


def plan_cost(plan: Plan) -> float:
    """What the plan's cache costs in its own budget's unit."""
    return plan.budget.layers_cost([(p.k_scheme, p.v_scheme) for p in plan.layers], layer_info(plan.layers))


def baseline_limit(plan: Plan) -> float:
    """The memory a baseline may use: the budget the plan was made for, which a user could have spent on a uniform
    setting instead (a plan often holds a few thousandths of a bit less, and the setting that defines the budget
    would otherwise never be tried), or the plan's own cost where that is more, or where its budget is nominal (a
    plan made by hand)."""
    own = plan_cost(plan)
    if plan.solver.status == HAND_MADE:
        return own
    return max(own, plan.budget.limit(layer_info(plan.layers)))


def screen(model, ids, plan: Plan, configs: list[Uniform], reads: str, log=None, known=None) -> tuple[dict, dict]:
    """({K scheme: KL}, {V scheme: KL}): each scheme of `configs` alone on every layer, measured on `ids`; those
    in `known` ({"k": {...}, "v": {...}}, a screen of the same length already made) are not measured again."""
    known = known or {"k": {}, "v": {}}
    keys = sorted({c.k for c in configs} - {"none"} - set(known["k"]))
    values = sorted({c.v for c in configs} - {"none"} - set(known["v"]))
    runs: dict[str, list[LayerPlan]] = {}
    for k in keys:
        runs[f"K {k}"] = layer_choices(plan, (k, "none"))
    for v in values:
        runs[f"V {v}"] = layer_choices(plan, ("none", v))
    if log:
        log(f"baselines: screening {len(keys)} key and {len(values)} value schemes of {len(configs)} uniform "
            f"configurations on {ids.shape[0]} x {ids.shape[1]} tokens"
            + (f" (the plan's selection screened {len(known['k']) + len(known['v'])})" if known["k"] or known["v"]
               else ""))
    measured = measure(model, ids, runs, reads=reads) if runs else {}
    k_damage = {**known["k"], **{k: measured[f"K {k}"]["kl"] for k in keys}}
    v_damage = {**known["v"], **{v: measured[f"V {v}"]["kl"] for v in values}}
    return k_damage, v_damage


def recorded_screen(plan: Plan, tokens: int) -> dict | None:
    """The screen `plan --select-measured` recorded (solver.select.uniform_screen), where it was made at `tokens` on
    the profile's text (validate then screens only what it lacks)."""
    chosen = plan.solver.select or {}
    screen_ = chosen.get("uniform_screen")
    if not screen_ or chosen.get("text") or int(screen_.get("tokens", 0)) != tokens:
        return None
    return {"k": dict(screen_["k"]), "v": dict(screen_["v"])}


def best_uniforms(model, ids, plan: Plan, budget=None, limit: float | None = None, reads: str = "streaming",
                  top: int = TOP, log=None, known=None) -> tuple[list[Uniform], dict, dict]:
    """(the `top` baselines, K screen, V screen) within `budget` (default the plan's) and `limit` (default the
    budget's limit; validate passes the plan's own cost)."""
    budget = budget or plan.budget
    (chosen,), k_damage, v_damage = best_uniforms_each(model, ids, plan, [(budget, limit)], reads, top, log, known)
    return chosen, k_damage, v_damage


def best_uniforms_each(model, ids, template: Plan, bounds, reads: str = "streaming", top: int = TOP, log=None,
                       known=None):
    """([the `top` baselines of each (budget, limit) in `bounds`], K screen, V screen): one screen of every scheme
    any of them can use (a sweep's budgets share it)."""
    pre_rope = all(layers_with_rope(model))
    found = [baseline_candidates(template, budget, limit, pre_rope) for budget, limit in bounds]
    k_damage, v_damage = screen(model, ids, template, [c for each in found for c in each], reads, log, known)

    def best(configs):
        ranked = rank(configs, k_damage, v_damage, len(configs))
        return [c for c in ranked if math.isfinite(k_damage.get(c.k, 0.0) + v_damage.get(c.v, 0.0))][:top]

    return [best(each) for each in found], k_damage, v_damage


def baseline_candidates(plan: Plan, budget, limit: float | None = None, pre_rope: bool = False) -> list[Uniform]:
    """What a uniform baseline of this plan may be: for a per-layer vLLM plan each dtype the plugin serves on its
    platform, alone on every layer (vLLM's own and the K/V pairs); otherwise every configuration the free target
    stores (sensprof.planning.uniforms), keys before RoPE among them with `pre_rope` (every layer has RoPE)."""
    layers = layer_info(plan.layers)
    if plan.layer_dtypes:
        from ..targets import get_target

        tgt = get_target("vllm", plan.engine.vllm_gpu, head_dims={p.head_dim for p in plan.layers}, per_layer=True)
        return per_layer_candidates(tgt.dtypes, budget, layers, limit)
    return candidates(budget, layers, limit, pre_rope)


def baseline_name(c: Uniform) -> str:
    return f"best uniform {c.label}"


def baseline_configs(plan: Plan, chosen: list[Uniform]) -> dict[str, list[LayerPlan]]:
    """{name: layers} of each baseline, named as validate and the selection print them."""
    return {baseline_name(c): layer_choices(plan, (c.k, c.v)) for c in chosen}
