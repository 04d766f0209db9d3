"""What the built-in mixture changes in a profile: the same layers profiled on each kind of its text alone (pydoc
prose, standard-library code, Unicode records) and on the mixture, cell by cell.

    python benchmarks/corpus_kinds.py [--model smollm2-135m] [--layers 0,15,29] [--windows 2] [--seq-len 256]
                                      [--out results.md]

Prints, per kind: the geometric mean of its cells' KL over the mixture's; how Keys weigh against Values (mean key KL
over mean value KL at the same bits: what decides a plan's K/V split); the rank correlation of its cells with the
mixture's; and how often the scheme the kind finds best for a layer's tensor at a bit level is the mixture's.
Every profile uses the default menus and windows, as `sensprof profile` would; the kinds' texts are written to a
temporary folder, removed after.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile


def kind_texts() -> dict[str, str]:
    """Each kind of the mixture whole (records at a stride of about 450,000 characters: more than the mixture takes,
    so that windows of records alone do not repeat the mixture's), from the passages the mixture interleaves."""
    from sensprof import corpus

    return corpus.kind_texts(record_chars=450_000)


def summarise(tables: dict, ref: str = "mix") -> list[dict]:
    import pandas as pd

    from sensprof.schemes import get_scheme

    key = ["layer", "tensor", "scheme"]
    for t in tables.values():  # the code width (int4 whatever its group), so schemes of one width compete
        t["width"] = [get_scheme(s).bits for s in t.scheme]
        t["tensor"] = t.tensor.str.upper()
    base = tables[ref].set_index(key)["kl"]
    rows = []
    for kind, t in tables.items():
        kl = t.set_index(key)["kl"].reindex(base.index)
        both = pd.DataFrame({"k": kl, "m": base}).dropna()
        both = both[(both.k > 0) & (both.m > 0)]
        ratio = math.exp((both.k.apply(math.log) - both.m.apply(math.log)).mean())
        rank = both.k.rank().corr(both.m.rank())
        t4 = t[t.width.between(4, 5)]
        kv = t4[t4.tensor == "K"].kl.mean() / t4[t4.tensor == "V"].kl.mean()
        same = total = 0
        for (layer, tensor, width), g in t.groupby(["layer", "tensor", "width"]):
            r = tables[ref]
            h = r[(r.layer == layer) & (r.tensor == tensor) & (r.width == width)]
            if len(g) > 1 and len(h) == len(g):
                total += 1
                same += g.loc[g.kl.idxmin(), "scheme"] == h.loc[h.kl.idxmin(), "scheme"]
        rows.append({"kind": kind, "cells": len(both), "kl_over_mix": ratio, "k_over_v_4_5bits": kv,
                     "rank_corr_with_mix": rank, "best_scheme_same_as_mix": f"{same}/{total}"})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", default="0,15,29")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from sensprof import api
    from sensprof.files import atomic_write_text
    from sensprof.models import load_model

    loaded = load_model(args.model, device="cpu")
    tables = {}
    with tempfile.TemporaryDirectory(prefix="sensprof-kinds-") as tmp:
        for kind, body in [*kind_texts().items(), ("mix", None)]:
            text = None
            if body is not None:
                text = [os.path.join(tmp, f"{kind}.txt")]
                with open(text[0], "w", encoding="utf-8") as f:
                    f.write(body)
            p = api.profile(loaded.model, tokenizer=loaded.tokenizer, text=text, seq_len=args.seq_len,
                            windows=args.windows, layers=args.layers, out_dir=os.path.join(tmp, kind), device="cpu",
                            progress=False)
            tables[kind] = p.table
            print(f"{kind}: {len(p.table)} cells, mean KL {p.table.kl.mean():.3e}", file=sys.stderr)
    rows = summarise(tables)
    lines = [f"`python benchmarks/corpus_kinds.py --model {args.model} --layers {args.layers} --windows {args.windows} "
             f"--seq-len {args.seq_len}`", "",
             "| kind | cells | KL / mixture's (geometric mean) | mean K KL / mean V KL (4-5 bits) | rank corr. with "
             "mixture | best scheme = mixture's |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['cells']} | {r['kl_over_mix']:.2f} | {r['k_over_v_4_5bits']:.2f} | "
              f"{r['rank_corr_with_mix']:.3f} | {r['best_scheme_same_as_mix']} |" for r in rows]
    print("\n".join(lines))
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
