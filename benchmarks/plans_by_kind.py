"""Selected plans against uniform settings of the same memory, on each kind of text separately: the built-in mixture's
three kinds (prose, code, records: sensprof.corpus.kind_passages, each kind's passages joined) and any --text, each
with its paired standard error and the bits per element each configuration holds at the measured length. Does a plan
chosen on the mixture hold on every kind it mixes, and on a kind it does not hold?

    python benchmarks/plans_by_kind.py PROFILE PLANS_DIR --bits 3,4,5,6 \
        --uniforms int3_c64_r32_s4/int2_t64_r32_s4,int4_c64_r32_s4/int3_t64_r32_s4,... [--text NAME=FILE ...] \
        [--kinds prose,code,records] [--seq-len 1024] [--windows 2] [--out by-kind.csv]
    python benchmarks/plans_by_kind.py PROFILE --plan 3=A.json --plan 3=B.json --plan 4=C.json \
        --uniforms 3=K/V+K/V,4=K/V --kinds "" --text html=FILE --windows 8 --out judged.csv

PLANS_DIR holds <model>-selected-<b>bits.json or selected-<b>bits.json per budget (a results folder's plans/, or
benchmarks/plan_quality.py --plans-out), or --plan B=FILE names each plan and its budget (repeat it: several plans a
budget); --uniforms gives the K/V pairs of each budget, in the order of --bits or as B=PAIRS, several joined by "+"
(each plan is measured against every pair of its budget, and the best of them is printed); --kinds names the
mixture's kinds to measure ("" for none: the --text ones only). Each kind gets --windows windows of --seq-len tokens
(seed 12345), every configuration measured with all layers quantized at once, read as the plan reads; bits held are
plan.held_avg_bits at --seq-len (each layer weighed by the tokens it holds: a sliding-window layer its window). The
lead is counted in the standard errors plan_lead uses (selection.paired_standard_error: the paired per-position KL
difference over 8 contiguous blocks a window). The kinds' windows are drawn from all of each kind's passages, so they
may hold passages of the profile's own windows (the mixture holds a third of each kind's passages).
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


def budgets(args) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({budget: plan files}, {budget: uniform K/V pairs}) from PLANS_DIR and --bits, or --plan, and --uniforms."""
    plans: dict[str, list[str]] = {}
    for item in args.plan:
        b, sep, path = item.partition("=")
        if not sep or not path:
            raise SystemExit(f"--plan {item!r}: give B=FILE, e.g. --plan 4=plans/gemma3-270m-4bits.json")
        plans.setdefault(b, []).append(path)
    bits = args.bits.split(",") if args.bits else list(plans)
    uniforms: dict[str, list[str]] = {}
    items = args.uniforms.split(",")
    if all("=" in item for item in items):
        for item in items:
            b, _, pairs = item.partition("=")
            uniforms.setdefault(b, []).extend(pairs.split("+"))
    elif len(items) == len(bits) and not any("=" in item for item in items):
        uniforms = {b: item.split("+") for b, item in zip(bits, items)}
    else:
        raise SystemExit("--uniforms takes the K/V pairs of each budget of --bits in order, or B=PAIRS for each")
    missing = [b for b in (plans or bits) if b not in uniforms]
    if missing:
        raise SystemExit(f"--uniforms names no pair for the {', '.join(missing)}-bit budget")
    return plans, uniforms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("plans_dir", nargs="?")
    ap.add_argument("--plan", action="append", default=[], metavar="B=FILE", help="a plan and its budget (repeat)")
    ap.add_argument("--bits", default="", help="the budgets of PLANS_DIR's plans, comma-separated")
    ap.add_argument("--uniforms", required=True, help="K/V pairs per budget: in the order of --bits, or B=PAIRS; "
                    "several joined by +")
    ap.add_argument("--text", action="append", default=[], metavar="NAME=FILE", help="another kind: a text file")
    ap.add_argument("--kinds", default="prose,code,records", help="the mixture's kinds to measure, comma-separated")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if bool(args.plans_dir) == bool(args.plan) or (args.plans_dir and not args.bits):
        raise SystemExit("give PLANS_DIR with --bits, or --plan B=FILE for each plan")

    from sensprof.artifacts import load_plan
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.plan import held_avg_bits
    from sensprof.planning.selection import paired_standard_error
    from sensprof.profiling.table import load_profile
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    plan_files, uniforms = budgets(args)
    meta = load_profile(args.profile, require_complete=True).meta
    if args.plans_dir:
        plan_files = {b: [plan_file(args.plans_dir, b, meta["model"]["id"])] for b in args.bits.split(",")}
    plans = {(b, path): load_plan(path) for b, paths in plan_files.items() for path in paths}
    first = next(iter(plans.values()))
    loaded = load_for_profile(first, meta)
    named = {f"{b} {path}": list(p.layers) for (b, path), p in plans.items()}
    for b in plan_files:
        for pair in uniforms[b]:
            named[f"{b} {pair}"] = layer_choices(first, tuple(pair.split("/")))
    held = {name: held_avg_bits(layers, args.seq_len) for name, layers in named.items()}
    texts = kinds_and_files(args.kinds, args.text)
    rows = []
    for kind, body in texts.items():
        t0 = time.time()
        ids = text_windows(loaded.tokenizer, body, kind, args.seq_len, args.windows, SEED)[0]
        m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
        for (b, path) in plans:
            p, mine = m[f"{b} {path}"], []
            for pair in uniforms[b]:
                u = m[f"{b} {pair}"]
                se = paired_standard_error(p["kl_tokens"] - u["kl_tokens"])[0]
                mine.append({"model": meta["model"]["id"], "kind": kind, "bits": float(b), "plan": path,
                             "plan_kl": p["kl"], "uniform": pair, "uniform_kl": u["kl"],
                             "plan_over_uniform": p["kl"] / u["kl"],
                             "lead_in_standard_errors": (u["kl"] - p["kl"]) / se,
                             "plan_bits_held": held[f"{b} {path}"], "uniform_bits_held": held[f"{b} {pair}"],
                             "windows": int(ids.shape[0]), "seq_len": int(ids.shape[1])})
            rows += mine
            best = min(mine, key=lambda r: r["uniform_kl"])
            print(f"{kind:8} {b} bits {os.path.basename(path)}: plan {best['plan_kl']:.3e} "
                  f"({best['plan_bits_held']:.4f} bits held), best uniform {best['uniform']} {best['uniform_kl']:.3e} "
                  f"({best['uniform_bits_held']:.4f}): x{best['plan_over_uniform']:.3f}, "
                  f"lead {best['lead_in_standard_errors']:+.1f} SE ({time.time() - t0:.0f} s)", flush=True)
    df = pd.DataFrame(rows)
    out = args.out or os.path.join(args.plans_dir or ".", "by-kind.csv")
    atomic_write_text(out, df.to_csv(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
