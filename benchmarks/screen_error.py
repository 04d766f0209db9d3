"""What --screen costs in accuracy: a screened profile against an exact one of the same model, text and menus.

Prints the predicted cells' KL error (relative to the exact profile's measured KL) and, at each budget, the
planner's choice from each table priced with the exact table's KL: the regret is how much more summed exact
damage the screened table's plan has than the exact table's plan (0% when both choose alike). Needs no model.
    python benchmarks/screen_error.py EXACT_PROFILE SCREENED_PROFILE [--avg-bits 3,3.5,4,4.5,5,6,8]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from sensprof.planning.budget import budget_from_args
    from sensprof.planning.plan import make_plan
    from sensprof.profiling.table import load_profile, summed_damage

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exact")
    ap.add_argument("screened")
    ap.add_argument("--avg-bits", default="3,3.5,4,4.5,5,6,8")
    args = ap.parse_args()
    exact, screened = load_profile(args.exact), load_profile(args.screened)
    keys = ["layer", "tensor", "scheme"]
    t = exact.table.merge(screened.table, on=keys, suffixes=("", "_s"))
    if len(t) != len(exact.table) or len(t) != len(screened.table):
        sys.exit("the two profiles do not hold the same cells; profile the same layers and menus")
    pred = t[~t.measured_s]
    rel = ((pred.kl_s - pred.kl).abs() / pred.kl.clip(lower=1e-12)).sort_values().to_numpy()
    measured = t[t.measured_s]
    same = ((measured.kl_s - measured.kl).abs() / measured.kl.clip(lower=1e-12)).max()
    print(f"{len(measured)} of {len(t)} cells measured end to end (largest relative difference from the exact "
          f"profile {same:.2g}); the {len(pred)} predicted: median relative KL error {rel[len(rel) // 2]:.3f}, "
          f"90th percentile {rel[int(0.9 * (len(rel) - 1))]:.3f}, max {rel[-1]:.3f}")
    print(f"{'avg bits':>8}{'exact plan':>12}{'screened plan':>15}{'regret':>8}{'choices differ':>16}")
    for bits in [float(b) for b in args.avg_bits.split(",")]:
        plans = [make_plan(p, "sensprof", budget_from_args(avg_bits=bits)) for p in (args.exact, args.screened)]
        sums = [summed_damage(exact.table, [(p.k_scheme, p.v_scheme) for p in plan.layers]) for plan in plans]
        differ = sum(a != b for p, q in zip(*(pl.layers for pl in plans))
                     for a, b in ((p.k_scheme, q.k_scheme), (p.v_scheme, q.v_scheme)))
        print(f"{bits:>8g}{sums[0]:>12.4e}{sums[1]:>15.4e}{100 * (sums[1] / sums[0] - 1):>7.1f}%{differ:>16}")


if __name__ == "__main__":
    main()
