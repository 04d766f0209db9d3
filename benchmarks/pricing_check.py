"""How well the profile, priced at a longer length, predicts the uniform configurations measured there: measured /
predicted for each uniform configuration in a plan_quality.py CSV, with the profile unscaled, priced by
sensprof.planning.pricing (the share of positions that read something quantized) and by an alternative (the mean share of
each query's past that is quantized). No model is loaded.

    python benchmarks/pricing_check.py PROFILE_DIR PLAN_QUALITY_CSV [--seq-len 1024]
"""

import argparse
from functools import lru_cache

import numpy as np
import pandas as pd

from sensprof.memory import quantized_token_count
from sensprof.planning.pricing import scale
from sensprof.schemes import get_scheme
from sensprof.profiling.table import load_profile


@lru_cache(None)
def past_share(name: str, n: int) -> float:
    s = get_scheme(name)
    return sum(quantized_token_count(s, t + 1) / (t + 1) for t in range(n)) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("csv")
    ap.add_argument("--seq-len", type=int, default=1024)
    args = ap.parse_args()
    prof = load_profile(args.profile)
    own = int(prof.meta["settings"]["seq_len"])
    reads = prof.meta.get("reads", "streaming")
    kl = prof.table.groupby(["tensor", "scheme"]).kl.sum()
    df = pd.read_csv(args.csv)
    df = df[(df.seq_len == args.seq_len) & df.budget.isna()]
    rows = []
    for r in df.itertuples():
        k, v = r.plan.removeprefix("uniform ").split(" / ")
        unscaled = kl[("K", k)] + kl[("V", v)]
        moved = kl[("K", k)] * scale(k, reads, own, args.seq_len) + kl[("V", v)] * scale(v, reads, own, args.seq_len)
        share = (kl[("K", k)] * past_share(k, args.seq_len) / past_share(k, own)
                 + kl[("V", v)] * past_share(v, args.seq_len) / past_share(v, own))
        rows.append({"config": r.plan, "measured_kl": r.measured_kl, "unscaled": r.measured_kl / unscaled,
                     "pricing": r.measured_kl / moved, "past_share": r.measured_kl / share})
    out = pd.DataFrame(rows)
    print(f"measured / predicted at {args.seq_len} tokens ({own}-token profile, read {reads}):")
    print(out.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    logs = np.log(out[["unscaled", "pricing", "past_share"]])
    print("geometric mean: " + ", ".join(f"{c} {np.exp(logs[c].mean()):.2f}" for c in logs))
    print("sd of log:      " + ", ".join(f"{c} {logs[c].std():.2f}" for c in logs))
    inside = ((out[["unscaled", "pricing", "past_share"]] >= 0.8) & (out[["unscaled", "pricing", "past_share"]] <= 1.25))
    print("in 0.8-1.25:    " + ", ".join(f"{c} {int(inside[c].sum())}/{len(out)}" for c in inside))


if __name__ == "__main__":
    main()
