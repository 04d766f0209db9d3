"""Plans against their best uniform settings and those settings' twins with keys stored before RoPE (`_pre`), and
each plan with its keys moved before RoPE (same memory), on the README table's judged windows.

    python judge.py --plan B=PLAN.json ... --uniforms B=K/V ... [--seq-len 1024] [--windows 8] --out judged.csv

Every configuration is measured with all layers quantized at once, read as the plan reads, on --windows windows of
IDLE's help.html (seed 12345: the README table's windows); the lead is plan_lead's paired standard error."""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd

SEED = 12345


def pre_keys(name: str) -> str:
    """The key scheme stored before RoPE: `_pre` after the base (the name grammar's order), per-channel integers only."""
    from sensprof.schemes import get_scheme

    s = get_scheme(name)
    if name == "none" or s.pre_rope or s.format != "int" or s.granularity != "channel":
        return name
    base = name.split("_r")[0].split("_s")[0] if (s.residual or s.sink) else name
    return base + "_pre" + name[len(base):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, metavar="B=FILE")
    ap.add_argument("--uniforms", action="append", required=True, metavar="B=K/V")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import dataclasses
    import idlelib

    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.plan import held_avg_bits
    from sensprof.planning.selection import paired_standard_error
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    plans = {b: load_plan(path) for b, path in (item.split("=", 1) for item in args.plan)}
    uniforms = dict(item.split("=", 1) for item in args.uniforms)
    first = next(iter(plans.values()))
    loaded = load_for_profile(first, {"model": {"id": first.model_id}})
    named = {}
    for b, plan in plans.items():
        k, v = uniforms[b].split("/")
        named[f"{b} plan"] = list(plan.layers)
        named[f"{b} plan, keys before RoPE"] = [dataclasses.replace(p, k_scheme=pre_keys(p.k_scheme))
                                               for p in plan.layers]
        named[f"{b} {k}/{v}"] = layer_choices(first, (k, v))
        named[f"{b} {pre_keys(k)}/{v}"] = layer_choices(first, (pre_keys(k), v))
    held = {name: held_avg_bits(layers, args.seq_len) for name, layers in named.items()}
    path = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
    with open(path, encoding="utf-8") as f:
        ids = text_windows(loaded.tokenizer, f.read(), "html", args.seq_len, args.windows, SEED)[0]
    t0 = time.time()
    m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
    rows = []
    for b in plans:
        k, v = uniforms[b].split("/")
        known, pre = f"{b} {k}/{v}", f"{b} {pre_keys(k)}/{v}"
        best = min((known, pre), key=lambda n: m[n]["kl"])
        for config in (f"{b} plan", f"{b} plan, keys before RoPE", known, pre):
            se = paired_standard_error(m[config]["kl_tokens"] - m[best]["kl_tokens"])[0]
            rows.append({"model": first.model_id, "bits": float(b), "config": config.split(" ", 1)[1],
                         "kl": m[config]["kl"], "bits_held": held[config], "best_uniform": best.split(" ", 1)[1],
                         "over_best_uniform": m[config]["kl"] / m[best]["kl"],
                         "over_known_uniform": m[config]["kl"] / m[known]["kl"],
                         "lead_in_standard_errors": (m[best]["kl"] - m[config]["kl"]) / se if se else 0.0,
                         "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
            r = rows[-1]
            print(f"{b} bits {r['config']:42s} KL {r['kl']:.4e} ({r['bits_held']:.3f} bits held) "
                  f"x{r['over_best_uniform']:.3f} of {r['best_uniform']}, x{r['over_known_uniform']:.3f} of {known}",
                  flush=True)
    print(f"{time.time() - t0:.0f} s")
    atomic_write_text(args.out, pd.DataFrame(rows).to_csv(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
