"""Selected plans against a uniform setting of the same memory, on each kind of text separately: the built-in mixture's
three kinds (prose, code, records: sensprof.corpus.kind_passages, each kind's passages joined) and any --text, each
with its paired standard error. Does a plan chosen on the mixture hold on every kind it mixes, and on a kind it
does not hold?

    python benchmarks/plans_by_kind.py PROFILE PLANS_DIR --bits 3,4,5,6 \
        --uniforms int3_c64_r32_s4/int2_t64_r32_s4,int4_c64_r32_s4/int3_t64_r32_s4,... [--text NAME=FILE ...] \
        [--kinds prose,code,records] [--seq-len 1024] [--windows 2] [--out by-kind.csv]

PLANS_DIR holds <model>-selected-<b>bits.json or selected-<b>bits.json per budget (a results folder's plans/, or
benchmarks/plan_quality.py --plans-out); --uniforms gives one K/V pair per budget, in the order of --bits; --kinds
names the mixture's kinds to measure ("" for none: the --text ones only). Each kind gets --windows windows of
--seq-len tokens (seed 12345), every configuration measured with all layers quantized at once, read as the plan
reads. The lead is counted in the standard errors plan_lead uses (selection.paired_standard_error: the paired
per-position KL difference over 8 contiguous blocks a window). The kinds' windows are drawn from all of each kind's
passages, so they may hold passages of the profile's own windows (the mixture holds a third of each kind's passages).
"""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd

SEED = 12345


def kinds_and_files(kinds: str, files: list[str]) -> dict[str, str]:
    """{name: text}: the mixture's comma-separated `kinds`, then each NAME=FILE of `files`."""
    from sensprof.corpus import kind_texts
    from sensprof.errors import SensprofError

    try:
        texts = kind_texts(k for k in kinds.split(",") if k)
    except SensprofError as e:
        raise SystemExit(str(e)) from None
    for item in files:
        name, path = item.split("=", 1)
        with open(path, encoding="utf-8") as f:
            texts[name] = f.read()
    return texts


def plan_file(folder: str, bits: str, model: str) -> str:
    """<model>-selected-<bits>bits.json in `folder` (a results folder's plans/), else selected-<bits>bits.json."""
    for name in (f"{model}-selected-{bits}bits.json", f"selected-{bits}bits.json"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise SystemExit(f"{folder} holds neither {model}-selected-{bits}bits.json nor selected-{bits}bits.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("plans_dir")
    ap.add_argument("--bits", required=True)
    ap.add_argument("--uniforms", required=True, help="K/V per budget, comma-separated, in the order of --bits")
    ap.add_argument("--text", action="append", default=[], metavar="NAME=FILE", help="another kind: a text file")
    ap.add_argument("--kinds", default="prose,code,records", help="the mixture's kinds to measure, comma-separated")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.selection import paired_standard_error
    from sensprof.profiling.table import load_profile
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    bits, pairs = args.bits.split(","), args.uniforms.split(",")
    if len(bits) != len(pairs):
        raise SystemExit("--uniforms takes one K/V pair per budget of --bits")
    meta = load_profile(args.profile, require_complete=True).meta
    plans = {b: load_plan(plan_file(args.plans_dir, b, meta["model"]["id"])) for b in bits}
    first = plans[bits[0]]
    loaded = load_for_profile(first, meta)
    configs = {}
    for b, pair in zip(bits, pairs):
        k, v = pair.split("/")
        configs[(b, "plan")] = list(plans[b].layers)
        configs[(b, pair)] = layer_choices(first, (k, v))
    named = {f"{b} {name}": layers for (b, name), layers in configs.items()}
    texts = kinds_and_files(args.kinds, args.text)
    rows = []
    for kind, body in texts.items():
        t0 = time.time()
        ids = text_windows(loaded.tokenizer, body, kind, args.seq_len, args.windows, SEED)[0]
        m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
        for b, pair in zip(bits, pairs):
            p, u = m[f"{b} plan"], m[f"{b} {pair}"]
            se = paired_standard_error(p["kl_tokens"] - u["kl_tokens"])[0]
            rows.append({"model": meta["model"]["id"], "kind": kind, "bits": float(b), "plan_kl": p["kl"],
                         "uniform": pair, "uniform_kl": u["kl"], "plan_over_uniform": p["kl"] / u["kl"],
                         "lead_in_standard_errors": (u["kl"] - p["kl"]) / se, "windows": int(ids.shape[0]),
                         "seq_len": int(ids.shape[1])})
            r = rows[-1]
            print(f"{kind:8} {b} bits: plan {r['plan_kl']:.3e}, {pair} {r['uniform_kl']:.3e}: "
                  f"x{r['plan_over_uniform']:.3f}, lead {r['lead_in_standard_errors']:+.1f} SE "
                  f"({time.time() - t0:.0f} s)", flush=True)
    df = pd.DataFrame(rows)
    out = args.out or os.path.join(args.plans_dir, "by-kind.csv")
    atomic_write_text(out, df.to_csv(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
