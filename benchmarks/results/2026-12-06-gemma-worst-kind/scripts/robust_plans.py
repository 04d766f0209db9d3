# As run: python robust_plans.py PROFILE AVG_BITS CONTEXT_LEN STAT OUT.json
# The planner's plan (`sensprof plan --select-measured 0`: the same pricing, budget and solver) with each cell's
# damage the STAT of its KL over the profile's windows (windows.csv) instead of the mean: "median", or "trim1" (the
# mean without the cell's worst window). A few positions of a few windows carry most of some cells' mean and do not
# repeat from run to run (README); a statistic that a single window cannot move ranks the cells on what does.
import sys

import numpy as np

from sensprof.planning.budget import budget_from_args
from sensprof.planning.plan import build_plan, priced_table
from sensprof.planning.planner import plan, problem_from_table
from sensprof.profiling.table import load_profile
from sensprof.targets import get_target

profile_dir, bits, context, stat, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
profile = load_profile(profile_dir, require_complete=True)
layers = profile.meta["layers"]
tgt = get_target("sensprof", head_dims={x["head_dim"] for x in layers})
budget = budget_from_args(bits, None, None, None, None, context)
table, pricing = priced_table(profile, "sensprof", tgt, context)
measured = profile.table.set_index(["layer", "tensor", "scheme"]).kl
robust = {}
for (layer, tensor, scheme), rows in profile.windows.groupby(["layer", "tensor", "scheme"]):
    kl = np.sort(rows.kl.to_numpy())
    robust[(int(layer), str(tensor), str(scheme))] = float(np.median(kl) if stat == "median" else kl[:-1].mean())
table = table.copy()
for i, r in table.iterrows():
    cell = (int(r.layer), str(r.tensor), str(r.scheme))
    if cell in robust and measured.loc[cell] > 0:  # priced as the mean was: the pricing scales a cell's mean
        table.at[i, "kl"] = r.kl * robust[cell] / measured.loc[cell]
solution = plan(problem_from_table(table, layers), tgt, budget)
result = build_plan(profile, solution, "sensprof", "kl", budget, pricing, table)
result.save(out)
print(f"{stat}: predicted {solution.damage:.3e} (the cells' {stat} over windows); wrote {out}")
