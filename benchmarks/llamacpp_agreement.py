"""llama.cpp beside sensprof's emulation on any GGUF model: the check tests/engines/test_engine_agreement.py runs on
the default model, for a second model (or any), printing one row per -ctk/-ctv pair.

    python benchmarks/llamacpp_agreement.py MODEL.gguf [--pairs q8_0/q8_0,q4_0/q4_0] [--seq-len 384] [--windows 2]

Needs llama.cpp's environment (tools/engines/install.sh). Each pair is run in llama.cpp (with its baseline and its
floor, sensprof/validation/validate_engine.py) and emulated with the schemes the llamacpp target prices it with (the key
channel order from the model's class), in llama.cpp's numerics (the GGUF's matmul input rounding, --draws draws)
and in float32."""

from __future__ import annotations

import argparse
import time

import torch

from sensprof.data import PYDOC_NAME, load_windows
from sensprof.validation.engine_checks import LLAMACPP_PAIRS, llamacpp_runs
from sensprof.engines.llamacpp.catalog import channel_order
from sensprof.engines.run.python import find_engine_python
from sensprof.models import load_model
from sensprof.validation.validate_engine import LLAMACPP_DRAWS, compare_with_engine

PAIRS = ",".join(f"{k}/{v}" for k, v in LLAMACPP_PAIRS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pairs", default=PAIRS)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--draws", type=int, default=LLAMACPP_DRAWS)
    ap.add_argument("--out", default=None, help="also write every row's figures to this CSV")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_grad_enabled(False)
    loaded = load_model(args.model, device="cpu")
    model = loaded.model
    order = channel_order(type(model).__name__)
    ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=args.seq_len, windows=args.windows, seed=args.seed, builtin=PYDOC_NAME)
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")]
    runs = llamacpp_runs(args.model, model, pairs)
    rows = compare_with_engine("llamacpp", find_engine_python("llamacpp"), loaded, ids, runs, "llamacpp_agreement.log",
                               draws=args.draws)
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"{type(model).__name__}, key order {order}, {args.windows} x {args.seq_len} tokens (seed {args.seed}); "
          f"llama.cpp's floor: KL {rows[0]['engine_floor_kl']:.3e}, dNLL {rows[0]['engine_floor_dnll']:+.4f}")
    print("| -ctk / -ctv | llama.cpp KL | emulated KL, float32 | llama.cpp / float32 | emulated KL, llama.cpp's "
          "numerics (draws' SD) | llama.cpp / emulated (± SE) | dNLL engine - (float32 emulation + floor) (± noise) | agrees |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['config']}` | {r['engine_kl']:.3e} | {r['float_emulated_kl']:.3e} | {r['raw_kl_ratio']:.2f} | "
              f"{r['emulated_kl']:.3e} ({r['emulated_kl_draw_sd'] / r['emulated_kl']:.0%}) | "
              f"{r['kl_ratio']:.2f} ± {r['kl_ratio_se']:.2f} | {r['dnll_diff']:+.4f} ± {r['dnll_noise']:.4f} | "
              f"{'yes' if r['agrees'] else 'no'} |")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
