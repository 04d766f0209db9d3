"""Do the profile's cells hold on other text? Each layer's K (or V) quantized alone with each of a few schemes, measured
on windows of each kind of text given (the mixture's kinds, --text files), beside what the profile measured. A plan
trades one layer's damage against another's by the profile's figures; where a kind of text reorders them, the trade
the plan made does not hold there.

    python benchmarks/cell_transfer.py PROFILE PLAN --tensor K --schemes int2_c64_r32_s4,int3_c64_r32_s4 \
        [--text NAME=FILE ...] [--kinds prose,code,records] [--layers 0,5,11] [--seq-len 1024] [--windows 2] \
        [--out cells.csv]

PLAN is any plan made from PROFILE: the model, the read regime and the layers' shapes come from it. Texts and
windows as benchmarks/plans_by_kind.py takes and draws them (its seed). Prints, per layer, each scheme's KL on each
kind and the step between the first two schemes over the profile's step (the figure a plan's trade rests on).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import pandas as pd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("plan")
    ap.add_argument("--tensor", choices=["K", "V"], default="K")
    ap.add_argument("--schemes", required=True, help="comma-separated schemes the profile measured")
    ap.add_argument("--text", action="append", default=[], metavar="NAME=FILE", help="another kind: a text file")
    ap.add_argument("--kinds", default="prose,code,records", help="the mixture's kinds to measure, comma-separated")
    ap.add_argument("--layers", default=None, help="comma-separated layers (default: all)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from plans_by_kind import SEED, kinds_and_files
    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.validation.validate import measure, plan_profile, plan_reads

    plan = load_plan(args.plan)
    profile = plan_profile(plan, args.profile)
    schemes = args.schemes.split(",")
    layers = [int(x) for x in args.layers.split(",")] if args.layers else list(range(len(plan.layers)))
    texts = kinds_and_files(args.kinds, args.text)
    cells = profile.table[profile.table.tensor == args.tensor].set_index(["layer", "scheme"]).kl
    missing = [(i, s) for i in layers for s in schemes if (i, s) not in cells.index]
    if missing:  # before the model is loaded and any window measured
        raise SystemExit(f"the profile has no {args.tensor} {missing[0][1]} cell for layer {missing[0][0]}; pass "
                         "--schemes it measured and --layers below its layer count")
    profiled = {(i, s): float(cells[(i, s)]) for i in layers for s in schemes}

    field = "k_scheme" if args.tensor == "K" else "v_scheme"
    bare = [dataclasses.replace(p, k_scheme="none", v_scheme="none") for p in plan.layers]
    configs = {}
    for i in layers:
        for s in schemes:
            one = list(bare)
            one[i] = dataclasses.replace(one[i], **{field: s})
            configs[(i, s)] = one
    loaded = load_for_profile(plan, profile.meta)
    rows = []
    for kind, body in texts.items():
        t0 = time.time()
        ids = text_windows(loaded.tokenizer, body, kind, args.seq_len, args.windows, SEED)[0]
        m = measure(loaded.model, ids, {f"{i} {s}": c for (i, s), c in configs.items()}, reads=plan_reads(plan))
        for i, s in configs:
            rows.append({"kind": kind, "layer": i, "tensor": args.tensor, "scheme": s, "kl": m[f"{i} {s}"]["kl"],
                         "profile_kl": profiled[(i, s)], "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
        print(f"{kind}: {len(configs)} cells on {ids.shape[0]} x {ids.shape[1]} tokens ({time.time() - t0:.0f} s)",
              flush=True)
    df = pd.DataFrame(rows)
    if len(schemes) > 1:  # the step a plan trades: first scheme over second, on each kind, over the profile's step
        a, b = schemes[:2]
        wide = df.pivot_table(index="layer", columns=["kind", "scheme"], values="kl")
        steps = pd.DataFrame({kind: wide[(kind, a)] - wide[(kind, b)] for kind in texts})
        own = pd.Series({i: profiled[(i, a)] - profiled[(i, b)] for i in layers})
        print(f"\n{args.tensor} {a} - {b}, per layer: the profile's step, then each kind's over it")
        print(pd.concat([own.rename("profile"), steps.div(own, axis=0)], axis=1).to_string(
            float_format=lambda x: f"{x:.3g}"))
    out = args.out or "cell_transfer.csv"
    atomic_write_text(out, df.to_csv(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
