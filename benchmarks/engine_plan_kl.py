"""Plans served by a running engine alone (no emulation beside it): the KL each measures at a length, beside what
`sensprof plan` / `export` print for it there (sensprof.planning.prediction). For lengths where `sensprof validate
--engine`, which also runs sensprof's emulation in several draws, does not fit the time (4096 tokens on 2 cores).

    python benchmarks/engine_plan_kl.py --engine vllm|llamacpp --seq-len N [--windows W] PLAN [PLAN ...]

Every plan is served in one engine job on the same windows: those `sensprof validate` draws for the first plan
that --select-measured chose (else the first plan), which leave out the profile's windows and that selection's.
The plans must share one profile's windows and at most one selection. llama.cpp: also its numerics floor (its f32
cache along a quantized cache's path). Prints a Markdown table; --out writes it as CSV.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

from sensprof.artifacts import load_plan
from sensprof.engines.run.python import find_engine_python
from sensprof.errors import SensprofError
from sensprof.models import load_for_plan
from sensprof.planning.prediction import for_plan, kl_sum
from sensprof.validation.validate import validation_windows
from sensprof.validation.validate_engine import (LLAMACPP_BASELINE, LLAMACPP_FLOOR, VLLM_BASELINE, engine_measurements,
                                                 llamacpp_run, vllm_run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--engine", choices=("vllm", "llamacpp"), required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.time()
    torch.set_grad_enabled(False)
    plans = {os.path.splitext(os.path.basename(p))[0]: load_plan(p) for p in args.plans}
    slots = {tuple(p.profile.window_slots or ()) for p in plans.values()}
    chosen = [p for p in plans.values() if p.solver.select]
    if len(slots) != 1 or len(chosen) > 1:
        raise SensprofError("these plans do not share one profile's windows and at most one selection; run them apart")
    first = chosen[0] if chosen else next(iter(plans.values()))
    loaded = load_for_plan(first, None, "cpu", "float32", None, False)
    ids = validation_windows(first, loaded.tokenizer, args.windows, args.seq_len)
    if args.engine == "vllm":
        runs = [VLLM_BASELINE, *(vllm_run(p, "cpu", name) for name, p in plans.items())]
    else:
        runs = [LLAMACPP_BASELINE, LLAMACPP_FLOOR, *(llamacpp_run(p, name) for name, p in plans.items())]
    work = tempfile.mkdtemp(prefix="sensprof-plan-kl-")  # the engine's log: kept only if the engine fails
    eng = engine_measurements(args.engine, find_engine_python(args.engine), loaded, ids, runs,
                              os.path.join(work, "engine.log"))
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    floor = float(eng[LLAMACPP_FLOOR.name].kl.mean()) if args.engine == "llamacpp" else None
    for name, p in plans.items():
        kl = float(eng[name].kl.mean())
        pred = for_plan(p, args.seq_len)
        rows.append({"plan": name, "engine": args.engine, "seq_len": args.seq_len, "windows": int(ids.shape[0]),
                     "per_layer_sum": kl_sum(p), "engine_kl": kl, "engine_floor_kl": floor,
                     "printed_now": pred.kl if pred else float("nan")})
    print(f"{args.engine}, {ids.shape[0]} x {args.seq_len} unseen tokens" +
          (f"; llama.cpp's floor {floor:.3e}" if floor is not None else ""))
    print("| plan | per-layer KL sum | engine KL | engine / sum | printed now | engine / printed now |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['plan']} | {r['per_layer_sum']:.3e} | {r['engine_kl']:.3e} | "
              f"{r['engine_kl'] / r['per_layer_sum']:.2f} | {r['printed_now']:.3e} | "
              f"{r['engine_kl'] / r['printed_now']:.2f} |")
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
