# As run: python window_ratios.py [PROFILE] (default PW), beside plans.sh's folders: each plan's predicted KL on each
# profile window over the profile's best uniform setting in the budget there (worst_plans.py's reference), and how
# much of each cell's nine-window sum its largest window carries -> window_ratios.csv, printed.
import json
import sys

import pandas as pd

from sensprof.planning.budget import budget_from_args
from sensprof.planning.plan import priced_table
from sensprof.planning.planner import _cost, problem_from_table, runtime_format
from sensprof.profiling.table import load_profile
from sensprof.targets import get_target

p = load_profile(sys.argv[1] if len(sys.argv) > 1 else "PW")
layers = p.meta["layers"]
table, _ = priced_table(p, "sensprof", get_target("sensprof", head_dims={x["head_dim"] for x in layers}), 1024)
problem = problem_from_table(table, layers)
measured = p.table.set_index(["layer", "tensor", "scheme"]).kl
win = {}
for (layer, tensor, scheme), rows in p.windows.groupby(["layer", "tensor", "scheme"]):
    cell = (int(layer), str(tensor), str(scheme))
    scale = problem.damage[cell] / measured.loc[cell] if measured.loc[cell] > 0 else 1.0
    win[cell] = dict(zip(rows.window.astype(int), scale * rows.kl.astype(float)))
n = len(next(iter(win.values())))


def on(pairs, w):
    return sum(win[(i, t, s)][w] for i, pair in enumerate(pairs) for t, s in zip("KV", pair))


out = []
for bits, at in ((4, 4.992), (6, 6.825)):
    budget = budget_from_args(at, None, None, None, None, 1024)
    opts = {t: [s for s in problem.options[t] if runtime_format(s)] for t in "KV"}
    fits = [(sum(problem.damage[(i, "K", k)] + problem.damage[(i, "V", v)] for i in range(len(layers))), k, v)
            for k in opts["K"] for v in opts["V"]
            if sum(_cost(budget, x, k) + _cost(budget, x, v) for x in layers) <= budget.limit(layers) * (1 + 1e-9)]
    _, k, v = min(fits)
    for objective in ("mean", "window", "kind"):
        plan = json.load(open(f"plans-{objective}/gemma3-270m-{bits}bits.json"))
        pairs = [(x["k_scheme"], x["v_scheme"]) for x in plan["layers"]]
        ratios = [on(pairs, w) / on([(k, v)] * len(layers), w) for w in range(n)]
        out.append({"bits": bits, "objective": objective, "uniform": f"{k}/{v}", "worst": max(ratios),
                    "mean": sum(ratios) / n, **{f"window_{w}": r for w, r in enumerate(ratios)}})
df = pd.DataFrame(out)
df.to_csv("window_ratios.csv", index=False, float_format="%.4f")
print(df.round(3).to_string(index=False))
g = p.windows.groupby(["layer", "tensor", "scheme"]).kl
share = g.max() / g.sum()
print(f"{len(share)} cells: the largest window carries a median {share.median():.2f} of a cell's sum over the windows, "
      f"more than half in {(share > 0.5).sum()}")
