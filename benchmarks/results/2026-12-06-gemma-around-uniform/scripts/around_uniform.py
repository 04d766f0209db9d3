"""Cells measured around a uniform setting instead of around the unquantized model: every layer at the uniform K/V
pair U but one tensor of one layer at another scheme, the whole model quantized at once, read as the plan reads. A
plan is then the integer program's best set of swaps from U under U's own memory: the damage it sums is each swap's
KL minus U's, measured where the plan will operate (with the other layers already quantized), not where the
per-layer profile measures it (with them exact). Does that linearisation pick plans that hold better than the
profile's, on text of another kind?

    python benchmarks/results/2026-12-06-gemma-around-uniform/scripts/around_uniform.py PROFILE TEMPLATE_PLAN --uniform int5_c128/int3_t32_r32_s4 \
        --k int4_c128,int6_c128,int4_c64,int5_c64 --v int2_t32_r32_s4,int4_t32_r32_s4,int3_t64_r32_s4 \
        --windows 3 --seq-len 1024 --out FOLDER [--rounds 2]

PROFILE gives the model (its meta.json) and TEMPLATE_PLAN the layers' shapes, calibration and read regime; the
windows are the built-in mixture's (seed 0, as a profile takes them). FOLDER gets cells-<round>.csv (each swap's KL,
per window, and the bits per element it adds or frees at --seq-len) and plan-<round>.json; with --rounds 2 the second
round measures the same swaps around the first round's plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import pandas as pd


def swaps(layers, k_options, v_options):
    """{(layer, tensor, scheme): the configuration with that one change} for every scheme not already there."""
    out = {}
    for i, p in enumerate(layers):
        for tensor, options, field in (("K", k_options, "k_scheme"), ("V", v_options, "v_scheme")):
            for s in options:
                if s != getattr(p, field):
                    changed = list(layers)
                    changed[i] = dataclasses.replace(p, **{field: s})
                    out[(p.layer, tensor, s)] = changed
    return out


def solve(cells: pd.DataFrame, base_layers, budget_bits: float):
    """The set of swaps (at most one a tensor) of least summed KL change whose bits held stay within budget_bits."""
    import pulp

    from sensprof.planning.plan import held_avg_bits

    base_bits = held_avg_bits(base_layers, SEQ_LEN)
    prob = pulp.LpProblem("around", pulp.LpMinimize)
    x = {r.Index: pulp.LpVariable(f"x{r.Index}", cat="Binary") for r in cells.itertuples()}
    prob += pulp.lpSum(x[i] * cells.at[i, "dkl"] for i in x)
    prob += pulp.lpSum(x[i] * cells.at[i, "dbits"] for i in x) <= budget_bits - base_bits
    for _, group in cells.groupby(["layer", "tensor"]):
        prob += pulp.lpSum(x[i] for i in group.index) <= 1
    prob.solve(pulp.PULP_CBC_CMD(msg=False))
    chosen = cells.loc[[i for i in x if x[i].value() > 0.5]]
    layers = list(base_layers)
    for r in chosen.itertuples():
        field = "k_scheme" if r.tensor == "K" else "v_scheme"
        layers[r.layer] = dataclasses.replace(layers[r.layer], **{field: r.scheme})
    return layers, chosen


SEQ_LEN = 1024


def main():
    global SEQ_LEN
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("template")
    ap.add_argument("--uniform", required=True, help="K/V: the setting every layer starts from")
    ap.add_argument("--k", required=True, help="key schemes a layer may move to, comma-separated")
    ap.add_argument("--v", required=True, help="value schemes a layer may move to, comma-separated")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    SEQ_LEN = args.seq_len

    from sensprof.artifacts import load_plan
    from sensprof.corpus import builtin_corpus
    from sensprof.data import text_windows
    from sensprof.files import atomic_write_text
    from sensprof.models import load_for_profile
    from sensprof.planning.plan import held_avg_bits
    from sensprof.profiling.table import load_profile
    from sensprof.validation.validate import layer_choices, measure, plan_reads

    os.makedirs(args.out, exist_ok=True)
    meta = load_profile(args.profile, require_complete=True).meta
    template = load_plan(args.template)
    loaded = load_for_profile(template, meta)
    ids = text_windows(loaded.tokenizer, builtin_corpus(), "mix", args.seq_len, args.windows, args.seed)[0]
    uniform = layer_choices(template, tuple(args.uniform.split("/")))
    budget = held_avg_bits(uniform, args.seq_len)
    base = uniform
    k_options = [s for s in args.k.split(",") if s] + [uniform[0].k_scheme]
    v_options = [s for s in args.v.split(",") if s] + [uniform[0].v_scheme]
    for rnd in range(1, args.rounds + 1):
        t0 = time.time()
        configs = {"base": base} | {f"{l} {t} {s}": c for (l, t, s), c in swaps(base, k_options, v_options).items()}
        done = [0]

        def progress(name):
            done[0] += 1
            if done[0] % 20 == 0:
                print(f"  round {rnd}: {done[0]} / {len(configs)} ({time.time() - t0:.0f} s)", flush=True)

        m = measure(loaded.model, ids, configs, progress=progress, per_token=True, reads=plan_reads(template))
        base_kl, base_bits = m["base"]["kl"], held_avg_bits(base, args.seq_len)
        rows = []
        for name, layers in configs.items():
            if name == "base":
                continue
            layer, tensor, scheme = name.split(" ")
            per_window = m[name]["kl_tokens"].mean(dim=-1) if hasattr(m[name]["kl_tokens"], "mean") else None
            rows.append({"layer": int(layer), "tensor": tensor, "scheme": scheme, "kl": m[name]["kl"],
                         "dkl": m[name]["kl"] - base_kl, "dbits": held_avg_bits(layers, args.seq_len) - base_bits,
                         **({f"kl_w{w}": float(v) for w, v in enumerate(per_window)} if per_window is not None
                            else {})})
        cells = pd.DataFrame(rows)
        atomic_write_text(os.path.join(args.out, f"cells-{rnd}.csv"), cells.to_csv(index=False))
        layers, chosen = solve(cells, base, budget)
        plan = template.replace(layers=tuple(layers))
        path = os.path.join(args.out, f"plan-{rnd}.json")
        plan.save(path)
        print(f"round {rnd}: base KL {base_kl:.4e} ({base_bits:.4f} bits), {len(chosen)} swaps, predicted "
              f"{base_kl + chosen['dkl'].sum():.4e}, {held_avg_bits(layers, args.seq_len):.4f} bits held "
              f"(budget {budget:.4f}), {time.time() - t0:.0f} s -> {path}", flush=True)
        base = layers


if __name__ == "__main__":
    main()
