"""validate's search for the best uniform settings (sensprof.validation.baselines: every uniform configuration the
runtime stores within the plan's memory, keys before RoPE now among them; each scheme screened alone on one window,
the `top` pairs of least summed KL), then those pairs beside the plan with its keys moved before RoPE on the judged
windows.

    python screen_best.py --plan B=PLAN.json ... [--seq-len 1024] [--windows 8] [--top 3] --out best.csv

The screen runs on the first of the judged windows (validate screens on the first of its own)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import pandas as pd

sys.path.insert(0, os.path.dirname(__file__))
from judge import SEED, pre_keys  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, metavar="B=FILE")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import idlelib

    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.selection import paired_standard_error
    from sensprof.validation.baselines import baseline_limit, best_uniforms_each
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    plans = {b: load_plan(path) for b, path in (item.split("=", 1) for item in args.plan)}
    first = next(iter(plans.values()))
    loaded = load_for_profile(first, {"model": {"id": first.model_id}})
    path = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
    with open(path, encoding="utf-8") as f:
        ids = text_windows(loaded.tokenizer, f.read(), "html", args.seq_len, args.windows, SEED)[0]
    t0 = time.time()
    bounds = [(p.budget, baseline_limit(p)) for p in plans.values()]
    each, k_screen, v_screen = best_uniforms_each(loaded.model, ids[:1], first, bounds, plan_reads(first),
                                                  args.top, log=print)
    print(f"screened {len(k_screen)} key and {len(v_screen)} value schemes in {time.time() - t0:.0f} s", flush=True)
    named = {}
    for (b, plan), chosen in zip(plans.items(), each):
        named[f"{b} plan, keys before RoPE"] = [dataclasses.replace(p, k_scheme=pre_keys(p.k_scheme))
                                               for p in plan.layers]
        for c in chosen:
            named[f"{b} {c.k}/{c.v}"] = layer_choices(first, (c.k, c.v))
    t1 = time.time()
    m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
    rows = []
    for (b, plan), chosen in zip(plans.items(), each):
        mine = f"{b} plan, keys before RoPE"
        for c in chosen:
            u = f"{b} {c.k}/{c.v}"
            se = paired_standard_error(m[mine]["kl_tokens"] - m[u]["kl_tokens"])[0]
            rows.append({"model": first.model_id, "bits": float(b), "uniform": f"{c.k}/{c.v}",
                         "screened": k_screen.get(c.k, 0.0) + v_screen.get(c.v, 0.0), "uniform_kl": m[u]["kl"],
                         "plan_pre_kl": m[mine]["kl"], "plan_pre_over_uniform": m[mine]["kl"] / m[u]["kl"],
                         "lead_in_standard_errors": (m[u]["kl"] - m[mine]["kl"]) / se,
                         "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
            r = rows[-1]
            print(f"{b} bits: {r['uniform']:42s} KL {r['uniform_kl']:.4e}; the plan with keys before RoPE "
                  f"{r['plan_pre_kl']:.4e}, x{r['plan_pre_over_uniform']:.3f} (lead {r['lead_in_standard_errors']:+.1f} SE)",
                  flush=True)
    print(f"measured in {time.time() - t1:.0f} s")
    atomic_write_text(args.out, pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(args.out.replace(".csv", "-screen.csv"), pd.DataFrame(
        [{"tensor": "K", "scheme": k, "kl": x} for k, x in sorted(k_screen.items())]
        + [{"tensor": "V", "scheme": v, "kl": x} for v, x in sorted(v_screen.items())]).to_csv(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
