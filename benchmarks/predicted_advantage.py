"""How much a profile itself says a per-layer plan can beat uniform settings: the plan's predicted KL over the
best predicted uniform configuration with no more memory, both priced at a validation length. When this ratio is
above issue 25's 0.5 target, no planner fed this profile can meet it however well its predictions hold; when it is
below and the measured ratio (benchmarks/plan_quality.py) is not, the predictions are what fall short.

    python benchmarks/predicted_advantage.py PROFILE_DIR [--avg-bits 3,3.5,4,4.5,5,6] [--length 1024]
                                             [--context-len N] [--out results.csv]

Plans are made as `sensprof plan --select-measured 0` makes them (damage priced at the serving length,
--context-len, default the planner's). Every uniform configuration of the profile's menus (one K and one V scheme
for every layer) that the runtime can hold is priced alike; "best" is the lowest predicted with no more long-context
bits than the plan. Loads no model: seconds.
"""

from __future__ import annotations

import argparse
import os

import pandas as pd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--avg-bits", default="3,3.5,4,4.5,5,6")
    ap.add_argument("--length", type=int, default=None, help="validation length (default 4x the profile's)")
    ap.add_argument("--context-len", type=int, default=None, help="the serving length the plan is priced at")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from sensprof.planning.budget import Budget
    from sensprof.files import atomic_write_text
    from sensprof.planning.plan import make_plan
    from sensprof.planning.planner import runtime_format
    from sensprof.planning.pricing import priced_at
    from sensprof.report.data import config_bits, uniform_configs
    from sensprof.profiling.table import load_profile, summed_damage

    profile = load_profile(args.profile, require_complete=True)
    meta = profile.meta
    own = int(meta["settings"]["seq_len"])
    n = args.length or 4 * own
    at = priced_at(profile.table, meta.get("reads", "streaming"), own, n, meta["layers"])
    uniform = uniform_configs(at, meta, every=True)
    held = [runtime_format(k) and runtime_format(v) and d == d  # NaN: a cell the profile lacks on some layer
            for k, v, d in zip(uniform.k_scheme, uniform.v_scheme, uniform.predicted_kl)]
    uniform = uniform[held]
    rows = []
    for b in (float(x) for x in args.avg_bits.split(",")):
        plan = make_plan(args.profile, "sensprof", Budget("avg_bits", b, args.context_len))
        pairs = [(q.k_scheme, q.v_scheme) for q in plan.layers]
        mine, pred = config_bits(meta, pairs), summed_damage(at, pairs, "kl")
        pool = uniform[uniform.avg_bits <= mine + 1e-9]
        best = pool.loc[pool.predicted_kl.idxmin()]
        rows.append({"model": meta["model"]["id"], "length": n, "budget": b, "plan_avg_bits": round(mine, 4),
                     "plan_predicted_kl": pred, "best_uniform": f"{best.k_scheme} / {best.v_scheme}",
                     "best_uniform_avg_bits": round(best.avg_bits, 4), "best_uniform_predicted_kl": best.predicted_kl,
                     "predicted_plan_over_uniform": round(pred / best.predicted_kl, 3)})
    df = pd.DataFrame(rows)
    print(f"{meta['model']['id']}: predicted at {n} tokens (the profile priced there), read "
          f"{meta.get('reads', 'streaming')}")
    print(df.drop(columns=["model", "length"]).to_string(index=False))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        atomic_write_text(args.out, df.to_csv(index=False))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
