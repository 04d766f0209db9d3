"""Plans made from menus with and without keys before RoPE, each also with its keys moved before RoPE, against the
best uniform settings known and their twins before RoPE, on the README table's judged windows.

    python judge.py --plan LABEL@B=PLAN.json ... --uniforms B=K/V ... [--seq-len 1024] [--windows 8] --out judged.csv

As ../../2026-12-07-pre-rope-baselines/scripts/judge.py (the same windows: IDLE's help.html, seed 12345; every layer
quantized at once, read as the plan reads), with several plans a budget, each named by its label."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import pandas as pd

SEED = 12345


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, metavar="LABEL@B=FILE")
    ap.add_argument("--uniforms", action="append", required=True, metavar="B=K/V")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import idlelib

    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.plan import held_avg_bits
    from sensprof.planning.selection import paired_standard_error
    from sensprof.planning.uniforms import before_rope
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    plans = {}  # budget -> {label: plan}
    for item in args.plan:
        key, path = item.split("=", 1)
        label, b = key.split("@")
        plans.setdefault(b, {})[label] = load_plan(path)
    uniforms = dict(item.split("=", 1) for item in args.uniforms)
    first = next(iter(next(iter(plans.values())).values()))
    loaded = load_for_profile(first, {"model": {"id": first.model_id}})
    named, uniform_names = {}, {}
    for b, by_label in plans.items():
        for label, plan in by_label.items():
            named[f"{b} {label}"] = list(plan.layers)
            named[f"{b} {label}, keys moved before RoPE"] = [dataclasses.replace(p, k_scheme=before_rope(p.k_scheme))
                                                            for p in plan.layers]
        k, v = uniforms[b].split("/")
        uniform_names[b] = [f"{b} {k}/{v}", f"{b} {before_rope(k)}/{v}"]
        for name, key in zip(uniform_names[b], (k, before_rope(k))):
            named[name] = layer_choices(first, (key, v))
    held = {name: held_avg_bits(layers, args.seq_len) for name, layers in named.items()}
    path = os.path.join(os.path.dirname(idlelib.__file__), "help.html")
    with open(path, encoding="utf-8") as f:
        ids = text_windows(loaded.tokenizer, f.read(), "html", args.seq_len, args.windows, SEED)[0]
    t0 = time.time()
    m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
    rows = []
    for b, by_label in plans.items():
        best = min(uniform_names[b], key=lambda n: m[n]["kl"])
        configs = [f"{b} {label}{tail}" for label in by_label for tail in ("", ", keys moved before RoPE")]
        for config in configs + uniform_names[b]:
            se = paired_standard_error(m[config]["kl_tokens"] - m[best]["kl_tokens"])[0]
            rows.append({"model": first.model_id, "bits": float(b), "config": config.split(" ", 1)[1],
                         "kl": m[config]["kl"], "bits_held": held[config], "best_uniform": best.split(" ", 1)[1],
                         "over_best_uniform": m[config]["kl"] / m[best]["kl"],
                         "lead_in_standard_errors": (m[best]["kl"] - m[config]["kl"]) / se if se else 0.0,
                         "pre_rope_layers": sum("_pre" in q.k_scheme for q in named[config]),
                         "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
            r = rows[-1]
            print(f"{b} bits {r['config']:60s} KL {r['kl']:.4e} ({r['bits_held']:.3f} bits held, "
                  f"{r['pre_rope_layers']} layers' keys before RoPE) x{r['over_best_uniform']:.3f} of "
                  f"{r['best_uniform']}", flush=True)
    print(f"{time.time() - t0:.0f} s")
    atomic_write_text(args.out, pd.DataFrame(rows).to_csv(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
