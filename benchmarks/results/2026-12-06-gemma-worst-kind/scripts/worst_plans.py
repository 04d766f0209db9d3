# As run: python worst_plans.py PROFILE AVG_BITS CONTEXT_LEN GROUP OUT.json
# A plan for the worst kind of text the profile read, instead of for their mean: among the choices within the budget,
# the one whose largest ratio, over groups of profile windows, of its summed KL on that group to the best uniform
# setting's summed KL on the same group is smallest (ties broken by the mean ratio). GROUP: "window" (each window its
# own group) or "kind" (windows grouped by the kind in their file's name, kinds/<i><part>-<kind>.txt). Uses the
# profile's windows.csv (each cell's KL on each window); the uniform setting is the profile's best in the budget by
# the mean, the planner's own pricing and budget throughout (sensprof.planning), so only the objective differs from
# `sensprof plan --select-measured 0` (and its last polish, single-cell moves that lower the mean, is not run).
import os
import sys
import time
import warnings

import pulp

from sensprof.planning.budget import budget_from_args
from sensprof.planning.plan import build_plan, priced_table
from sensprof.planning.planner import NONE, Solution, _cost, _solve, problem_from_table, runtime_format
from sensprof.profiling.table import load_profile
from sensprof.targets import get_target

profile_dir, bits, context, group, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
profile = load_profile(profile_dir, require_complete=True)
assert profile.windows is not None, "the profile has no windows.csv"
layers = profile.meta["layers"]
tgt = get_target("sensprof", head_dims={x["head_dim"] for x in layers})
budget = budget_from_args(bits, None, None, None, None, context)
table, pricing = priced_table(profile, "sensprof", tgt, context)
problem = problem_from_table(table, layers)
limit = budget.limit(layers)

# each window's KL, priced as the mean was (the pricing scales a cell's mean; its windows scale alike)
measured = profile.table.set_index(["layer", "tensor", "scheme"]).kl
n_windows = int(profile.windows.window.max()) + 1
files = profile.meta.get("text_files") or []
if group == "kind":
    names = [os.path.basename(f).split("-", 1)[1].rsplit(".", 1)[0] for f in files]
    assert len(names) == n_windows, (names, n_windows)
    groups = {k: [w for w in range(n_windows) if names[w] == k] for k in dict.fromkeys(names)}
else:
    groups = {f"w{w}": [w] for w in range(n_windows)}
by_cell = {}
for (layer, tensor, scheme), rows in profile.windows.groupby(["layer", "tensor", "scheme"]):
    cell = (int(layer), str(tensor), str(scheme))
    if cell not in problem.damage:
        continue
    scale = problem.damage[cell] / measured.loc[cell] if measured.loc[cell] > 0 else 1.0
    kl = dict(zip(rows.window.astype(int), rows.kl.astype(float)))
    by_cell[cell] = {g: scale * sum(kl[w] for w in ws) / len(ws) for g, ws in groups.items()}

opts = {t: [s for s in problem.options[t] if runtime_format(s)] for t in ("K", "V")}


def summed(choices, g=None):
    return sum((by_cell[(i, t, s)][g] if g else problem.damage[(i, t, s)]) for i, (k, v) in enumerate(choices)
               for t, s in (("K", k), ("V", v)) if s != NONE)


# the best uniform setting in the budget, by the mean (what the plan is judged against)
uniforms = []
for k in opts["K"]:
    for v in opts["V"]:
        cost = sum(_cost(budget, layer, k) + _cost(budget, layer, v) for layer in layers)
        if cost <= limit * (1 + 1e-9):
            uniforms.append((summed([(k, v)] * len(layers)), k, v))
_, uk, uv = min(uniforms)
reference = {g: summed([(uk, uv)] * len(layers), g) for g in groups}
print(f"reference uniform {uk} / {uv}: " + ", ".join(f"{g} {r:.3e}" for g, r in reference.items()))

t0 = time.perf_counter()
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    prob = pulp.LpProblem("worst_group", pulp.LpMinimize)
    x = {(i, t, s): pulp.LpVariable(f"x_{i}_{t}_{j}", cat="Binary")
         for i in range(len(layers)) for t in ("K", "V") for j, s in enumerate(opts[t])}
    worst = pulp.LpVariable("worst", lowBound=0)
    ratio = {g: pulp.lpSum(by_cell[c][g] / reference[g] * v for c, v in x.items()) for g in groups}
    prob += worst + 1e-3 * pulp.lpSum(ratio.values()) / len(groups)
    for g in groups:
        prob += ratio[g] <= worst
    for i in range(len(layers)):
        for t in ("K", "V"):
            prob += pulp.lpSum(x[(i, t, s)] for s in opts[t]) == 1
    prob += pulp.lpSum(_cost(budget, layers[i], s) / limit * v for (i, t, s), v in x.items()) <= 1 + 1e-9
    status, elapsed = _solve(prob, t0)
assert status == "Optimal", status
pick = {(i, t): s for (i, t, s), v in x.items() if v.value() > 0.5}
choices = [(pick[(i, "K")], pick[(i, "V")]) for i in range(len(layers))]
cost = sum(_cost(budget, layers[i], k) + _cost(budget, layers[i], v) for i, (k, v) in enumerate(choices))
solution = Solution(choices, {}, status, elapsed, summed(choices), cost, limit)
plan = build_plan(profile, solution, "sensprof", "kl", budget, pricing, table)
plan.save(out)
print("plan / uniform by group: " + ", ".join(f"{g} {summed(choices, g) / reference[g]:.3f}" for g in groups)
      + f"; mean KL {summed(choices) / summed([(uk, uv)] * len(layers)):.3f} of the uniform's; wrote {out}")
