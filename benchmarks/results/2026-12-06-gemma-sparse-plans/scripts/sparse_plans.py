"""Plans that change at most M of the 2 x layers (K, V) choices of the best uniform setting known at their budget.

    python sparse_plans.py PROFILE OUT_DIR [--m 4,8,16] [--bits 4,6]

A free plan changes most layers, each change chosen on cells read on a few windows, so the planner favours the
cells that read low by chance there. Anchored to the uniform setting, it keeps only the M changes worth most on
the profile's cells (the trust region `plan --refine` uses: sensprof.planning.planner.plan(near=...)). The budgets
are the earlier folders' (what int<b>_c64_r32_s4 / int<b-1>_t64_r32_s4 holds at 1024 tokens, rounded down), the
anchors the best uniform setting known at each (the README table's row for Gemma 3 270M at 1024 tokens).
Writes OUT_DIR/gemma3-270m-<b>bits-m<M>.json and a line per plan: its predicted sum, and the uniform setting's.
"""
import argparse
import os

from sensprof.planning.budget import budget_from_args
from sensprof.planning.plan import build_plan, priced_table
from sensprof.planning.planner import plan as solve, problem_from_table
from sensprof.profiling.table import load_profile
from sensprof.targets import get_target

BUDGETS = {3: 4.076, 4: 4.992, 5: 5.909, 6: 6.825}
ANCHORS = {3: ("int4_c128", "int2_t32_r32_s4"), 4: ("int5_c128", "int3_t32_r32_s4"),
           5: ("int6_c64", "int4_t64_r32_s4"), 6: ("int6_c64_r32_s4", "int5_t64_r32_s4")}

ap = argparse.ArgumentParser()
ap.add_argument("profile")
ap.add_argument("out")
ap.add_argument("--m", default="4,8,16")
ap.add_argument("--bits", default="4,6")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
profile = load_profile(args.profile, require_complete=True)
layers = profile.meta["layers"]
target = get_target("sensprof", None, None, {layer["head_dim"] for layer in layers})
table, pricing = priced_table(profile, "sensprof", target, 1024)  # every budget is priced at 1024 tokens
problem = problem_from_table(table, layers, "kl", 0.0)
for b in map(int, args.bits.split(",")):
    budget = budget_from_args(avg_bits=BUDGETS[b], context_len=1024)
    anchor = [ANCHORS[b]] * len(layers)
    uniform = sum(problem.cell(i, "K", ANCHORS[b][0]) + problem.cell(i, "V", ANCHORS[b][1]) for i in range(len(layers)))
    for m in map(int, args.m.split(",")):
        solution = solve(problem, target, budget, near=(anchor, m))
        result = build_plan(profile, solution, "sensprof", "kl", budget, pricing, table)
        path = os.path.join(args.out, f"gemma3-270m-{b}bits-m{m}.json")
        result.save(path)
        changed = sum(a != c for row, ref in zip(solution.choices, anchor) for a, c in zip(row, ref))
        print(f"{b} bits, M {m}: {changed} choices changed, predicted {solution.damage:.4g} "
              f"(uniform {uniform:.4g}, {solution.damage / uniform:.3f}x) -> {path}")
