"""`plan --refine N`: correct the planner's additive damage model where it decides something.

The planner sums per-layer damage measured one cell at a time; with many layers quantized at once, damage
compounds (int2 keys everywhere: 16% more KL than the sum on the default model). Each round measures the whole
plan, then each cell next to the decision boundary (a layer's chosen scheme swapped for the neighbouring cheaper
or dearer one of its tensor's menu) with the rest of the plan applied; the swap's measured change in joint KL
becomes that cell's cost relative to the chosen one, and the planner solves again with at most a bounded number of
choices changed (halved while the new plan measures worse). Rounds stop when no bound gives a lower measured KL.
Measured on the profile's own windows; validate on others.
"""

from __future__ import annotations

import dataclasses
import os

from ..errors import SensprofError
from ..files import check_recorded_files
from ..artifacts import Plan
from .plan import build_plan, priced_table
from ..schemes import get_scheme
from ..profiling.screen import pareto_front


def _neighbours(problem, budget, layer: dict, i: int, tensor: str, chosen: str, options: list[str]) -> list[str]:
    """The schemes next to `chosen` on this cell's (cost, damage) lower envelope: one cheaper, one dearer."""
    cost = {s: budget.cost(get_scheme(s), layer) for s in options}
    env = pareto_front(options, cost, {s: problem.cell(i, tensor, s) for s in options})
    cheaper = [s for s in env if cost[s] < cost[chosen] and s != chosen]
    dearer = [s for s in env if cost[s] > cost[chosen] and s != chosen]
    return ([cheaper[-1]] if cheaper else []) + ([dearer[0]] if dearer else [])


def refine_plan(plan: Plan, profile_dir: str, budget, rounds: int, device: str = "auto", log=print,
                dtype: str | None = None, device_map: str | None = None, trust_remote_code: bool = False,
                model: str | None = None) -> Plan:
    from ..data import select_windows
    from ..models import load_for_profile
    from .planner import NONE, plan as solve, problem_from_table
    from ..profiling.table import load_profile
    from ..targets import get_target
    from ..validation.validate import layer_choices, measure

    if plan.target != "sensprof":
        raise SensprofError(f"--refine re-plans per-layer choices; target {plan.target} chooses one dtype for all "
                            "layers: drop --refine or use --target sensprof")
    profile = load_profile(profile_dir, require_complete=True)
    meta = profile.meta
    files = meta.get("text_files")
    missing = [f for f in files or [] if not os.path.exists(f)]
    if missing:
        raise SensprofError(f"--refine re-runs the profile's text, but {missing[0]!r} is gone; restore it or drop "
                            "--refine")
    check_recorded_files(meta.get("text_files"), [profile_dir, "."], "the profile's text", ", or drop --refine")
    loaded = load_for_profile(plan, meta, model, device, dtype, device_map, trust_remote_code)
    settings = meta["settings"]
    ids, _, digest, _ = select_windows(loaded.tokenizer, files, settings["seq_len"], settings["windows"],
                                       settings["seed"], builtin=settings.get("text"))
    if settings.get("text_digest") and digest != settings["text_digest"]:  # the windows would not be the profiled ones
        what = ", ".join(map(repr, files or [])) or "the built-in corpus"
        raise SensprofError(f"--refine re-runs the profile's text, but {what} is not the text that was profiled "
                            f"(digest {digest} now, {settings['text_digest']} in meta.json); restore that text or "
                            "drop --refine")
    robust = plan.solver.robust
    target = get_target("sensprof")
    pricing = plan.predicted.pricing or {}
    table, priced = priced_table(profile, "sensprof", target, pricing.get("context_len") or plan.budget.context_len)
    problem = problem_from_table(table, meta["layers"], plan.objective, robust)

    def joint(layer_plans):
        return measure(loaded.model, ids, {"plan": layer_plans})["plan"]["kl"]

    best, best_kl = plan, joint(plan.layers)
    history = [{"round": 0, "measured_kl": best_kl, "predicted": plan.predicted.damage, "cells_measured": 0,
                "changed": 0}]
    log(f"refine round 0: measured KL {best_kl:.4g} (predicted {plan.predicted.damage:.4g})")
    for r in range(1, rounds + 1):
        choices = [(p.k_scheme, p.v_scheme) for p in best.layers]
        swaps = []
        for i, layer in enumerate(meta["layers"]):
            for t, tensor in enumerate(("K", "V")):
                chosen = choices[i][t]
                opts = [s for s in problem.options[tensor]] + [NONE]
                for alt in _neighbours(problem, budget, layer, i, tensor, chosen, opts):
                    pairs = list(choices)
                    pairs[i] = (alt, pairs[i][1]) if tensor == "K" else (pairs[i][0], alt)
                    swaps.append((i, tensor, chosen, alt, layer_choices(best, pairs)))
        measured = measure(loaded.model, ids, {f"{i}{tensor}{alt}": lp for i, tensor, _, alt, lp in swaps})
        for i, tensor, chosen, alt, _ in swaps:  # the swap's effect on the joint KL, in context
            delta = measured[f"{i}{tensor}{alt}"]["kl"] - best_kl
            if alt != NONE:
                problem.damage[(i, tensor, alt)] = problem.cell(i, tensor, chosen) + delta
        # A trust region: the in-context costs hold near the plan they were measured around, so at most `bound`
        # choices change; when the new plan measures worse, the bound is halved and the program solved again.
        bound, improved = max(1, len(swaps) // 8), False
        while bound >= 1:
            solution = solve(problem, target, budget, near=(choices, bound))
            candidate = build_plan(profile, solution, plan.target, plan.objective, budget, priced, table)
            changed = sum(a != b for p, q in zip(best.layers, candidate.layers)
                          for a, b in ((p.k_scheme, q.k_scheme), (p.v_scheme, q.v_scheme)))
            kl = joint(candidate.layers) if changed else best_kl
            history.append({"round": r, "bound": bound, "measured_kl": kl, "predicted": solution.damage,
                            "cells_measured": len(swaps), "changed": changed})
            log(f"refine round {r}: {len(swaps)} boundary cells measured in context, {changed} choices changed "
                f"(at most {bound}), measured KL {kl:.4g}")
            if changed and kl < best_kl:
                best, best_kl, improved = candidate, kl, True
                break
            if not changed:
                break
            bound //= 2
        if not improved:
            break
    return best.replace(solver=dataclasses.replace(best.solver, refine=tuple(history), robust=robust))
