"""Profile cost: the same cells computed the naive way and the ways sensprof offers, with a time breakdown.

naive      a full forward per cell, full [tokens, vocab] fp32 logits compared (`sensprof profile --naive`)
replay     forwards start at the quantized layer; LM head and KL in vocabulary chunks, exact (the default)
replay-x2  as replay, two schemes per batched forward
sampled    as replay, KL over the top 256 tokens plus 256 tail samples per position (opt-in: --kl sampled)
screened   as replay, end to end only for the cells on each layer's bits-vs-KL hull (opt-in: --screen); the
           "screen s" column is its local-metrics passes
Each mode runs in its own process, so its peak RSS is its own. Prints seconds, the ratio to naive, the
breakdown (layers = decoder forwards, lm_head, kl), peak memory and the largest relative KL difference of each
cell vs naive and vs replay (exact).
    python benchmarks/profile_cost.py [--model smollm2-135m | tiny-256k] [--layers 0-29] [--seq-len 256] [--windows 2]
"""

import argparse
import json
import os
import subprocess
import sys
import time

MODES = {"naive": dict(replay=False, kl="materialized"), "replay": dict(replay=True, kl="exact"),
         "replay-x2": dict(replay=True, kl="exact", variants_per_pass=2),
         "sampled": dict(replay=True, kl="sampled:256"),
         "screened": dict(replay=True, kl="exact", screen=True)}


def _load(args):
    import torch

    if args.model == "tiny-256k":  # a tiny random Llama whose LM head is large: 262,144 tokens
        import transformers as tf

        cfg = tf.LlamaConfig(vocab_size=262144, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             max_position_embeddings=4096)
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg).eval()
        from sensprof.profiling.hooks import register

        register()
        ids = torch.randint(3, cfg.vocab_size, (args.windows, args.seq_len), generator=torch.Generator().manual_seed(0))
        return model, ids
    from sensprof.data import load_windows
    from sensprof.models import load_model

    loaded = load_model(args.model, device="cpu")
    ids, _, _ = load_windows(loaded.tokenizer, None, args.seq_len, args.windows)
    return loaded.model, ids


def run_one(args, mode):
    from sensprof.models import describe_layers
    from sensprof.profiling.profile import peak_memory, run_profile
    from sensprof.schemes import parse_menu
    from sensprof.specs import parse_layers

    model, ids = _load(args)
    layers = parse_layers(args.layers, len(describe_layers(model)))
    menu = parse_menu(None, args.k_schemes, args.v_schemes)
    t = time.perf_counter()
    prof = run_profile(model, ids, menu, layers=layers, progress=False, **MODES[mode])
    sec = time.perf_counter() - t
    return {"seconds": sec, "cells": len(prof.table), "cost": prof.meta["cost_s"], **peak_memory(),
            "kl": prof.table.kl.tolist(), "measured": prof.table.measured.tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default) | tiny-256k | a model id/path")
    ap.add_argument("--k-schemes", default="int4_c32,int2_c128")
    ap.add_argument("--v-schemes", default="int4_t32,int2_t64")
    ap.add_argument("--layers", default=None)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args, args.one)))
        return
    import torch

    print(f"model {args.model}, layers {args.layers or 'all'}, K {args.k_schemes}, V {args.v_schemes}, "
          f"{args.windows}x{args.seq_len} tokens, torch threads {torch.get_num_threads()}")
    runs = {}
    for mode in args.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one", mode]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        runs[mode] = json.loads(out)
        print(f"  {mode}: {runs[mode]['seconds']:.1f} s", flush=True)
    naive = runs.get("naive")
    def rel(r, ref, measured=True):
        if ref is None:
            return [float("nan")]
        return [abs(a - b) / max(abs(b), 1e-12) for a, b, m in zip(r["kl"], ref["kl"], r["measured"]) if m == measured]

    def diff(r, ref):
        return max(rel(r, ref), default=float("nan"))

    print(f"{'mode':<12}{'seconds':>9}{'s/cell':>8}{'ratio':>7}{'layers s':>10}{'lm_head s':>10}{'kl s':>8}"
          f"{'screen s':>9}{'peak RSS GiB':>13}{'max rel KL diff vs naive':>26}{'vs replay':>11}")
    for mode, r in runs.items():
        ratio = r["seconds"] / naive["seconds"] if naive else float("nan")
        c = r["cost"]
        print(f"{mode:<12}{r['seconds']:>9.1f}{r['seconds'] / r['cells']:>8.3f}{ratio:>7.2f}{c.get('layers', 0):>10.1f}"
              f"{c.get('lm_head', 0):>10.1f}{c.get('kl', 0):>8.1f}{c.get('screen', 0):>9.1f}{r['peak_rss_gib']:>13.2f}"
              f"{diff(r, naive):>26.3g}{diff(r, runs.get('replay')):>11.3g}")
    for mode, r in runs.items():
        errs = sorted(rel(r, runs.get("replay"), measured=False))
        if errs and "replay" in runs:
            print(f"{mode}: {len(r['kl']) - len(errs)} of {len(r['kl'])} cells measured end to end; the predicted "
                  f"ones' KL vs replay's: median {errs[len(errs) // 2]:.3f}, 90th percentile "
                  f"{errs[int(0.9 * (len(errs) - 1))]:.3f}, max {errs[-1]:.3f} relative")
    print(f"cells: {naive['cells'] if naive else '?'}; naive's layers s include its LM head (a full forward); "
          "max rel KL diff counts only measured cells; targets: <= 0.5 x naive on smollm2-135m, <= 0.25 x on "
          "tiny-256k")


if __name__ == "__main__":
    main()
