"""How often the engine checks raise a false alarm: the engine test's configurations (sensprof/validation/engine_checks.py)
judged on several independent trials of unseen windows, each trial a whole test's rows judged at once, with the
bounds of sensprof/validation/validate_engine.py (family-wise, the emulation's draw spread counted) and with the rule before
issue 36 (KL within 15%, ΔNLL within 2 SE of the paired difference). A deliberately wrong emulation (round to
nearest on vLLM's CPU backend; K and V swapped for llama.cpp) is judged on the same engine runs: how often the
bounds still catch it.

    python benchmarks/engine_false_alarms.py vllm|llamacpp [--model smollm2-135m] [--trials 4] [--seq-len 384]
        [--windows 2] [--skip 1,10,19] [--out rows.csv]

One engine job runs every trial's windows; the emulation runs per trial (its draws' spread is each trial's own).
Needs the engine's environment (tools/engines/install.sh)."""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from sensprof.data import PYDOC_NAME, load_windows
from sensprof.validation.engine_checks import llamacpp_runs, vllm_cpu_runs
from sensprof.engines.run.python import find_engine_python
from sensprof.models import load_model
from sensprof.profiling.profile import kv_absmax
from sensprof.validation.validate_engine import (KL_REL_TOL, agreement, agreement_rows, emulated_damage, engine_gguf,
                                      engine_measurements)


def _windows(damage, rows: slice):
    return dataclasses.replace(damage, kl=damage.kl[rows], dnll=damage.dnll[rows], base_nll=damage.base_nll[rows])


def _old_rule(r: dict) -> bool:
    """The agreement before issue 36: KL within 15%, mean dNLL within 2 SE of the paired difference."""
    return abs(r["kl_ratio"] - 1) <= KL_REL_TOL and abs(r["dnll_diff"]) <= 2 * r["dnll_diff_se"] and r["corr_agrees"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=["vllm", "llamacpp"])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--windows", type=int, default=2, help="windows per trial (the engine test's 2)")
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--seed", type=int, default=11, help="of the windows (the engine test reads seed 7)")
    ap.add_argument("--skip", default="1,10,19", help="vLLM: layers kept in the skip configurations")
    ap.add_argument("--out", default=None, help="also write every row's figures to this CSV")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_grad_enabled(False)
    loaded = load_model(args.model, device="cpu", dtype="float32")
    model = loaded.model
    n = args.trials * args.windows
    ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=args.seq_len, windows=n, seed=args.seed, builtin=PYDOC_NAME)
    engine = find_engine_python(args.engine)
    if args.engine == "vllm":
        cal_ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=256, windows=2, seed=0, builtin=PYDOC_NAME)
        absmax = kv_absmax(model, cal_ids)
        skip = tuple(int(x) for x in args.skip.split(",") if x)
        runs = vllm_cpu_runs(args.model, model, absmax, skip)
        wrong_runs = vllm_cpu_runs(args.model, model, absmax, skip, round_to_nearest=True)
        gguf = None
    else:
        runs = llamacpp_runs(args.model, model)
        wrong_runs = None
        gguf = engine_gguf("llamacpp", runs)
    eng = engine_measurements(args.engine, engine, loaded, ids, runs, f"engine_false_alarms.{args.engine}.log")
    print(f"{args.engine} ({engine.version}), {args.model}, {args.trials} trials x {args.windows} x {args.seq_len} "
          f"tokens (seed {args.seed}); engine runs done at {time.time() - t0:.0f} s", flush=True)
    all_rows = []
    for t in range(args.trials):
        part = slice(t * args.windows, (t + 1) * args.windows)
        trial_ids = ids[part]
        eng_t = {k: _windows(v, part) for k, v in eng.items()}
        emu = emulated_damage(loaded, trial_ids, runs, gguf=gguf)
        rows = agreement_rows(engine, runs, trial_ids, eng_t, emu)
        if wrong_runs is not None:
            wrong_emu = emulated_damage(loaded, trial_ids, wrong_runs)
            wrong = agreement_rows(engine, wrong_runs, trial_ids, eng_t, wrong_emu)
        else:
            floor = eng_t["engine floor"]
            wrong = [{"config": name, **agreement(eng_t[name], emu["/".join(reversed(name.split("/")))], floor,
                                                  family=len(rows))} for name in ("q8_0/q4_0", "q4_0/q8_0")]
        for r in rows:
            all_rows.append({"trial": t, "kind": "emulation", "old_rule_agrees": _old_rule(r), **r})
        for r in wrong:
            all_rows.append({"trial": t, "kind": "wrong emulation", "old_rule_agrees": _old_rule(r), **r})
        for r in rows + wrong:
            kind = "wrong " if r in wrong else ""
            print(f"trial {t} {kind}{r['config']:<14} KL x{r['kl_ratio']:.2f} (bound {r['kl_bound']:.2f}) dNLL diff "
                  f"{r['dnll_diff']:+.4f} +- {r['dnll_noise']:.4f} (z {r['z']:.2f}; paired SE {r['dnll_diff_se']:.4f}, "
                  f"draws' SD {r['emulated_dnll_draw_sd']:.4f}) corr {r['dnll_corr']:.2f} -> "
                  f"{'agrees' if r['agrees'] else 'OUT'} (old rule: {'agrees' if _old_rule(r) else 'OUT'})",
                  flush=True)
    import pandas as pd

    df = pd.DataFrame(all_rows)
    if args.out:
        df.to_csv(args.out, index=False)
    right, wrong = df[df.kind == "emulation"], df[df.kind == "wrong emulation"]
    per_trial = right.groupby("trial")
    print(f"false alarms (the emulation): {int((~right.agrees).sum())}/{len(right)} rows, "
          f"{int((~per_trial.agrees.all()).sum())}/{args.trials} trials; old rule: "
          f"{int((~right.old_rule_agrees).sum())}/{len(right)} rows, "
          f"{int((~per_trial.old_rule_agrees.all()).sum())}/{args.trials} trials")
    print(f"caught (the wrong emulation): {int((~wrong.agrees).sum())}/{len(wrong)} rows; old rule "
          f"{int((~wrong.old_rule_agrees).sum())}/{len(wrong)}")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
