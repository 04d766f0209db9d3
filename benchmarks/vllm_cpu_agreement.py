"""vLLM's CPU backend beside sensprof's emulation on any model: the check tests/engines/test_engine_agreement.py runs
on the default model, for a second model (or any), printing one row per configuration.

    python benchmarks/vllm_cpu_agreement.py MODEL --skip 4,5 [--seq-len 384] [--windows 2] [--out rows.csv]
    python benchmarks/vllm_cpu_agreement.py MODEL --mix-only [--out rows.csv]

--mix (or --mix-only, without the dtypes alone): also a per-layer mix served through sensprof's vLLM plugin, every
third layer `auto` and the others `fp8_e4m3` and `fp8_e5m2` in turn (engine_checks.vllm_cpu_mixed_run; on Gemma 3
270M vLLM pads nothing in it: buckets of 6, 9 and 3 layers, groups of 3).

Needs vLLM's CPU environment (tools/engines/install.sh). Every fp8 dtype vLLM's CPU backend runs (`fp8`, `fp8`
with checkpoint scales calibrated on other windows, `fp8_e5m2`), each with every layer quantized and with the
`--skip` layers kept unquantized, is run in vLLM from a float32 checkpoint of the very weights sensprof loaded and
emulated with the schemes the vllm target prices it with (sensprof/validation/engine_checks.py; the bounds:
sensprof/validation/validate_engine.py, agreement())."""

from __future__ import annotations

import argparse
import time

import torch

from sensprof.data import PYDOC_NAME, load_windows
from sensprof.validation.engine_checks import vllm_cpu_mixed_run, vllm_cpu_runs
from sensprof.engines.run.python import find_engine_python
from sensprof.models import describe_layers, load_model
from sensprof.profiling.profile import kv_absmax
from sensprof.validation.validate_engine import VLLM_BASELINE, compare_with_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--skip", default="", help="layers kept unquantized in the skip configurations, e.g. 4,5")
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None, help="also write every row's figures to this CSV")
    ap.add_argument("--mix", action="store_true", help="also a per-layer mix through sensprof's plugin")
    ap.add_argument("--mix-only", action="store_true", help="the per-layer mix only")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_grad_enabled(False)
    loaded = load_model(args.model, device="cpu", dtype="float32")
    model = loaded.model
    ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=args.seq_len, windows=args.windows, seed=args.seed, builtin=PYDOC_NAME)
    cal_ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=256, windows=2, seed=0, builtin=PYDOC_NAME)
    absmax = kv_absmax(model, cal_ids)
    skip = tuple(int(x) for x in args.skip.split(",") if x)
    runs = [VLLM_BASELINE] if args.mix_only else vllm_cpu_runs(args.model, model, absmax, skip)
    if args.mix or args.mix_only:
        runs.append(vllm_cpu_mixed_run(args.model, model, tuple(range(0, len(describe_layers(model)), 3))))
    rows = compare_with_engine("vllm", find_engine_python("vllm"), loaded, ids, runs, "vllm_cpu_agreement.log")
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"{type(model).__name__}, {args.windows} x {args.seq_len} tokens (seed {args.seed}), skip {list(skip)}; "
          f"engine {rows[0]['engine']}")
    print("| config | engine KL | emulated KL | engine / emulated (± SE) | dNLL engine - emulation (± noise) | "
          "per-token dNLL corr (demanded) | agrees |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['engine_kl']:.3e} | {r['emulated_kl']:.3e} | {r['kl_ratio']:.2f} ± "
              f"{r['kl_ratio_se']:.2f} | {r['dnll_diff']:+.4f} ± {r['dnll_noise']:.4f} | {r['dnll_corr']:.2f} "
              f"({'yes' if r['corr_applies'] else 'no'}) | {'yes' if r['agrees'] else 'no'} |")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
