"""The example plans' printed predictions against what was measured: one row per recorded check of a plan in plans/
(sensprof/planning/prediction_checks.csv), the figure printed before this rule and now, and the bands each kind of
engine gets. No model is loaded.

    python benchmarks/printed_predictions.py

Before: what `validate` printed for the plan at that length (an engine's table: the plan's sum; validate's own:
times the joint factor); now: sensprof.planning.prediction, which plan, export and validate print.
"""

from __future__ import annotations

import os

from sensprof.artifacts import load_plan
from sensprof.planning import prediction as P

ROOT = os.path.join(os.path.dirname(__file__), "..")


def main() -> None:
    checks = P.read_checks()
    print("| plan | measured by | tokens (windows) | measured KL | printed before | measured / before | printed now "
          "| measured / now |")
    print("|---|---|---|---|---|---|---|---|")
    for c in checks:
        path = os.path.join(ROOT, "plans", c.id + ".json")
        if c.per_layer_sum is None or not os.path.exists(path):
            continue
        plan = load_plan(path)
        before = (plan.predicted.damage if c.kind in ("vllm-cpu", "llamacpp")
                  else c.per_layer_sum * (plan.predicted.joint_factor_at(c.seq_len) or 1.0))
        now = P.for_plan(plan, c.seq_len, c.per_layer_sum).kl
        print(f"| `{c.id}` | {P.KINDS[c.kind].split(' (')[0]} | {c.seq_len} ({c.windows}) | {c.measured_kl:.2e} | "
              f"{before:.2e} | {c.measured_kl / before:.2f} | {now:.2e} | **{c.measured_kl / now:.2f}** |")
    pairs = P.growth_pairs(checks)
    print(f"\ngrowth exponent in the all regime: every kind's {P.growth_exponent(checks):.3f} "
          f"({sum(map(len, pairs.values()))} pairs); " + ", ".join(
              f"{P.KINDS[k].split(' (')[0]} {P.growth_exponent(checks, k):.3f} ({len(v)} pairs)"
              for k, v in pairs.items()) + f" (a kind's own from {P.MIN_PAIRS} pairs)")
    models = sorted({c.model for c in checks})
    print("per model, where it has as many: " + ", ".join(
        f"{m} on {P.KINDS[k].split(' (')[0]} {P.growth_exponent(checks, k, m):.3f} ({len(v)} pairs)"
        for m in models for k, v in P.growth_pairs(checks, m).items() if len(v) >= P.MIN_PAIRS) + "\n")
    print("| kind | plans | checks | tokens | measured / printed |")
    print("|---|---|---|---|---|")
    for kind, label in P.KINDS.items():
        for selected in (False, True):
            b = P.band(checks, kind, selected)
            if b is not None and b.same_selection:
                print(f"| {label} | {'chosen by measurement' if selected else 'chosen by prediction'} | {b.count} | "
                      f"{'/'.join(map(str, b.lengths))} | {b.lo:.2f}-{b.hi:.2f} |")


if __name__ == "__main__":
    main()
