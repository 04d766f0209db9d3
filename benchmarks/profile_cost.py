"""Replay vs naive: the same profile cells computed both ways on smollm2-135m.

Prints both wall times, their ratio and the largest difference between the two tables.
    python benchmarks/profile_cost.py [--layers 0-29] [--schemes q4_0] [--seq-len 256] [--windows 2]
"""

import argparse
import time

import torch


def main():
    from sensprof.api import load_windows
    from sensprof.models import describe_layers, load_model
    from sensprof.profile import run_profile
    from sensprof.schemes import parse_schemes
    from sensprof.table import parse_layers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--schemes", default="q4_0,int4_c32")
    ap.add_argument("--layers", default=None)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--variants-per-pass", type=int, default=2,
                    help="also time replay with this many schemes batched per forward")
    args = ap.parse_args()

    loaded = load_model(args.model, device="cpu")
    layers = parse_layers(args.layers, len(describe_layers(loaded.model)))
    ids, name, digest = load_windows(loaded.tokenizer, None, args.seq_len, args.windows)
    schemes = parse_schemes(args.schemes)
    print(f"model {args.model}, {len(layers)} layers, schemes {args.schemes}, {args.windows}x{args.seq_len} tokens, "
          f"torch threads {torch.get_num_threads()}")

    def timed(**kw):
        t = time.perf_counter()
        p = run_profile(loaded.model, ids, schemes, layers=layers, progress=False, **kw)
        return time.perf_counter() - t, p.table

    runs = {"naive": timed(replay=False), "replay": timed(replay=True)}
    if args.variants_per_pass > 1:
        runs[f"replay, {args.variants_per_pass} variants/pass"] = timed(replay=True,
                                                                      variants_per_pass=args.variants_per_pass)
    naive_s, naive_t = runs["naive"]
    cells = len(naive_t)
    for label, (sec, table) in runs.items():
        diff = max((table[c] - naive_t[c]).abs().max() for c in ("kl", "dnll", "attn_kl", "out_rel_l2"))
        print(f"{label:<28} {sec:8.1f} s  {sec / cells:6.2f} s/cell  ratio to naive {sec / naive_s:5.2f}  "
              f"max |diff| vs naive {diff:.3g}")
    print(f"cells: {cells}; target: replay <= 0.5 x naive")


if __name__ == "__main__":
    main()
