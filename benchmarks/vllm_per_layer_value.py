"""What a per-layer vLLM plan (sensprof's plugin) buys, measured in vLLM's CPU backend itself: for each budget, the
per-layer plan (`plan --per-layer`: each layer auto, fp8 or its K and V in their own formats), the one-dtype +
skipped-layers plan of the same budget (what vLLM takes without the plugin), and every single vLLM dtype that fits
(fp8 e4m3, e4m3 with checkpoint scales, e5m2 on every layer), and every dtype the plugin serves alone on every
layer (vLLM's own and the K/V pairs, e.g. `k:int8_t32/v:int6_t32`: the undominated ones that fit some budget,
sensprof.planning.uniforms.per_layer_candidates, none pruned by a screen), all served by the engine on the same unseen
windows, read as vLLM reads (every token quantized, the current one too).

    python benchmarks/vllm_per_layer_value.py PROFILE --avg-bits 6,8,10 --seq-len 1024 [--windows 2] [--out F.csv]
    python benchmarks/vllm_per_layer_value.py PROFILE --vllm-gpu hopper --avg-bits 5,6,7,8 ...

PROFILE: a `sensprof profile --target vllm --vllm-gpu cpu` profile (it measures the KIVI values the pairs use).
Needs vLLM's CPU environment with sensprof's plugin (tools/engines/install.sh). With --vllm-gpu GPU (a `sensprof
profile --target vllm --vllm-gpu GPU` profile) the plans are for that GPU, where the plugin builds every layer on
TRITON_ATTN, and every configuration is measured in sensprof's emulation of vLLM 0.33's GPU formats (golden-checked
against vLLM's own code, tools/vllm_golden), every token read quantized: no engine runs, and the singles are every
dtype vLLM runs there (TurboQuant with the layers it keeps). Plans are made by predicted damage
(--select-measured 0), so that this script, not the plan's own selection, does the measuring. Prints one row per
configuration and, per budget, the per-layer plan's engine KL over the best single dtype's, over the one-dtype
plan's and over the best uniform one's of no more memory (--no-uniforms leaves those out).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time

import torch

from sensprof import api
from sensprof.artifacts import load_plan, predicted_summary
from sensprof.data import load_windows
from sensprof.engines.run.python import find_engine_python
from sensprof.errors import SensprofError
from sensprof.models import fingerprint, load_model
from sensprof.profiling.profile import kv_absmax
from sensprof.validation.engine_checks import vllm_cpu_runs
from sensprof.validation.validate_engine import VLLM_BASELINE, engine_measurements, vllm_run

SINGLE_BITS = 8.0  # every dtype vLLM's CPU backend runs on every layer stores 8 bits an element


def _plan(profile: str, bits: float, per_layer: bool, out: str, gpu: str = "cpu"):
    try:
        api.plan(profile, avg_bits=bits, target="vllm", vllm_gpu=gpu, per_layer=per_layer, select_measured=0,
                 out=out, log=lambda *a, **k: None)
    except SensprofError as e:  # a budget below every one-dtype plan's smallest
        print(f"# {bits:g} bits, {'per-layer' if per_layer else 'one dtype + skip'}: {e}")
        return None
    return load_plan(out)


def _uniform_plans(plans: dict, budgets: list[float], gpu: str = "cpu") -> list:
    """Every dtype the plugin serves alone on every layer that is undominated within some budget, one plan each."""
    from sensprof.planning.selection import per_layer_uniform_plan
    from sensprof.planning.uniforms import per_layer_candidates
    from sensprof.targets import get_target
    from sensprof.validation.baselines import layer_info

    template = next(p for (_, per_layer), p in plans.items() if per_layer)
    layers = layer_info(template.layers)
    tgt = get_target("vllm", gpu, head_dims={x["head_dim"] for x in layers}, per_layer=True)
    found = {}
    for b in budgets:
        budget = dataclasses.replace(template.budget, value=b)
        try:
            each = per_layer_candidates(tgt.dtypes, budget, layers)
        except SensprofError:
            continue
        found.update({c.flag: c for c in each})
    none = {"k": {}, "v": {}}  # measured only: no damage is predicted
    return [(c.name, per_layer_uniform_plan(template, c, {}, none)) for c in found.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--avg-bits", default="6,8,10")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11, help="window seed (the profile's windows are seed 0)")
    ap.add_argument("--out", default=None, help="also write the rows to this CSV")
    ap.add_argument("--no-uniforms", action="store_true", help="serve no dtype of the plugin's alone on every layer")
    ap.add_argument("--vllm-gpu", default="cpu", help="the platform planned for: cpu (served in vLLM's CPU backend) "
                    "or an NVIDIA GPU (hopper, blackwell, ampere: measured in sensprof's emulation)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sensprof-value-")  # the plans and vLLM's log: kept only if the run fails
    measure(args, work) if args.vllm_gpu == "cpu" else measure_emulated(args, work)
    shutil.rmtree(work, ignore_errors=True)


def _make_plans(args, work: str) -> tuple[list[float], dict]:
    budgets = [float(b) for b in args.avg_bits.split(",")]
    plans = {}
    for b in budgets:
        for per_layer in (True, False):
            p = _plan(args.profile, b, per_layer, os.path.join(work, f"{b:g}-{per_layer}.json"), args.vllm_gpu)
            if p is not None:
                plans[(b, per_layer)] = p
    return budgets, plans


def _plan_name(b: float, per_layer: bool) -> str:
    return f"{b:g} bits {'per-layer' if per_layer else 'one dtype + skip'}"


def _layers_note(plan) -> str:
    dtypes = plan.layer_dtypes
    return " ".join(dtypes) if dtypes else plan.engine.kv_cache_dtype + (
        f" skip {list(plan.engine.skip_layers)}" if plan.engine.skip_layers else "")


def _counted(note: str) -> str:
    """Each layer's dtype, as counts where there are many: 'int4_per_token_head x24, fp8_e4m3 x6'."""
    words = note.split()
    if len(words) <= 4 or any(c in note for c in "(["):  # one dtype, its skipped or kept layers named
        return note
    counts = {w: words.count(w) for w in dict.fromkeys(words)}
    return ", ".join(f"{w} x{c}" for w, c in sorted(counts.items(), key=lambda x: -x[1]))


def measure_emulated(args, work: str) -> None:
    """The GPU's plans and dtypes in sensprof's emulation, all configurations on the same windows in one pass each."""
    from sensprof.planning.plan import predicted_summary
    from sensprof.targets import get_target
    from sensprof.validation.validate import engine_dtype_alone, measure as measure_configs

    t0 = time.time()
    torch.set_grad_enabled(False)
    budgets, plans = _make_plans(args, work)
    one = next((p for (_, per_layer), p in plans.items() if not per_layer), None)
    if one is None:
        raise SystemExit("no one-dtype plan fits any of these budgets: raise --avg-bits")
    loaded = load_model(one.model_id, device="cpu", dtype="float32")
    one.check_model(fingerprint(loaded.model), one.model_id)
    ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=args.seq_len, windows=args.windows, seed=args.seed)
    # every dtype vLLM runs on this GPU alone (with the layers it keeps itself), with the profile's calibration
    singles, notes = {}, {}
    for d in get_target("vllm", args.vllm_gpu, head_dims={p.head_dim for p in one.layers}).dtypes:
        name = f"vllm {d.flag_value}{' with scales' if d.needs_scales else ''}"
        forced = d.forced_skips(len(one.layers))
        singles[name] = engine_dtype_alone(one, d)
        notes[name] = d.flag_value + (f" (vLLM keeps layers {' '.join(map(str, forced))})" if forced else "")
    configs = dict(singles)
    for (b, per_layer), p in plans.items():
        configs[_plan_name(b, per_layer)] = list(p.layers)
        notes[_plan_name(b, per_layer)] = _layers_note(p)
    uniforms = [] if args.no_uniforms else _uniform_plans(plans, budgets, args.vllm_gpu)
    for name, p in uniforms:
        configs[name] = list(p.layers)
        notes[name] = _layers_note(p)
    measured = measure_configs(loaded.model, ids, configs, reads="all")
    kl = {name: float(m["kl"]) for name, m in measured.items()}
    bits = {name: predicted_summary(layers)["avg_bits"] for name, layers in configs.items()}
    print(f"{one.model_id}, {args.windows} x {args.seq_len} tokens (seed {args.seed}), sensprof's emulation of vLLM "
          f"0.33 on {args.vllm_gpu} (per-layer plans: every layer on TRITON_ATTN), every token read from the cache")
    print("| config | bits/element | emulated KL | layers |")
    print("|---|---|---|---|")
    for name in configs:
        print(f"| {name} | {bits[name]:.2f} | {kl[name]:.3e} | {_counted(notes[name])} |")
    print("\n| budget | per-layer KL | / best single dtype | / one dtype + skip | / best uniform of the plugin's |")
    print("|---|---|---|---|---|")
    for b in budgets:
        per = kl.get(_plan_name(b, True))
        if per is None:
            continue
        one_kl = kl.get(_plan_name(b, False))
        fits = [(kl[n], notes[n]) for n in singles if bits[n] <= b + 1e-9]
        single = f"{per / min(fits)[0]:.2f} ({min(fits)[1]})" if fits else "none fits"
        fits_u = [(kl[n], n) for n, _ in uniforms if bits[n] <= b + 1e-9]
        best = f"{per / min(fits_u)[0]:.2f} ({min(fits_u)[1]})" if fits_u else "none fits"
        print(f"| {b:g} | {per:.3e} | {single} | {f'{per / one_kl:.2f}' if one_kl else 'none fits'} | {best} |")
    if args.out:
        import pandas as pd

        pd.DataFrame([{"config": n, "avg_bits": bits[n], "emulated_kl": kl[n], "layers": notes[n]}
                      for n in configs]).to_csv(args.out, index=False)
    print(f"{time.time() - t0:.0f} s")


def measure(args, work: str) -> None:
    t0 = time.time()
    torch.set_grad_enabled(False)
    budgets, plans = _make_plans(args, work)
    any_plan = next(iter(plans.values()))
    loaded = load_model(any_plan.model_id, device="cpu", dtype="float32")
    any_plan.check_model(fingerprint(loaded.model), any_plan.model_id)
    ids, _, _ = load_windows(loaded.tokenizer, None, seq_len=args.seq_len, windows=args.windows, seed=args.seed)
    cal, _, _ = load_windows(loaded.tokenizer, None, seq_len=256, windows=2, seed=0)
    singles = vllm_cpu_runs(any_plan.model_id, loaded.model, kv_absmax(loaded.model, cal))[1:]
    runs = [VLLM_BASELINE, *singles]
    for (b, per_layer), p in plans.items():
        runs.append(vllm_run(p, "cpu", _plan_name(b, per_layer)))
    uniforms = [] if args.no_uniforms else [vllm_run(p, "cpu", name) for name, p in _uniform_plans(plans, budgets)]
    runs += uniforms
    eng = engine_measurements("vllm", find_engine_python("vllm"), loaded, ids, runs,
                              os.path.join(work, "vllm.log"))
    kl = {r.name: float(eng[r.name].kl.mean()) for r in runs[1:]}
    bits = {r.name: SINGLE_BITS if r in singles else predicted_summary(r.plan.layers)["avg_bits"] for r in runs[1:]}
    rows = [{"config": r.name, "avg_bits": bits[r.name], "engine_kl": kl[r.name], "layers": _layers_note(r.plan)}
            for r in runs[1:]]
    print(f"{any_plan.model_id}, {args.windows} x {args.seq_len} tokens (seed {args.seed}), vLLM's CPU backend, "
          f"every token read from the cache")
    print("| config | bits/element | engine KL |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['avg_bits']:.2f} | {r['engine_kl']:.3e} |")
    best_single = min((kl[r.name], r.name) for r in singles)
    print("\n| budget | per-layer KL | / best single dtype | / one dtype + skip | / best uniform of the plugin's |")
    print("|---|---|---|---|---|")
    for b in budgets:
        per = kl.get(f"{b:g} bits per-layer")
        one = kl.get(f"{b:g} bits one dtype + skip")
        if per is None:
            continue
        single = f"{per / best_single[0]:.2f} ({best_single[1]})" if b >= SINGLE_BITS else "none fits"
        fits = [(kl[r.name], r.name) for r in uniforms if bits[r.name] <= b + 1e-9]
        best = f"{per / min(fits)[0]:.2f} ({min(fits)[1]})" if fits else ("not served" if args.no_uniforms
                                                                           else "none fits")
        print(f"| {b:g} | {per:.3e} | {single} | {f'{per / one:.2f}' if one else 'none fits'} | {best} |")
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
