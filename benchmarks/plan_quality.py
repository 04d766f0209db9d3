"""Issue 25's targets, measured: at each budget, the plan's KL against the best uniform configuration with no more
memory, on text neither the profile nor the selection saw, at the profile's length and at 4x it, with the cache
read as the target reads it. Prints one table per length and writes a CSV.

    python benchmarks/plan_quality.py PROFILE_DIR [--avg-bits 3,4,5] [--select 2] [--lengths 256,1024]
                                      [--windows 2] [--uniform-top 5] [--context-len N] [--model M]
                                      [--out results.csv]
                                      [--text FILE] [--plans-out DIR | --plans-from DIR]

For each budget it plans twice: the priced plan (`sensprof plan`, damage priced at the serving length, default
4096 tokens) and the plan chosen by measurement (`plan --select-measured N`). The uniform configurations measured
are, at every budget, those within it that the priced profile predicts best (--uniform-top) plus the one that spends
the most memory, and (target sensprof) the uniform baselines of every configuration sensprof stores within each
budget (sensprof.validation.baselines: `uniform K / V` rows, --no-baselines leaves them out); with --text, the
windows are of that text (text of another kind than the profile's); "best uniform" is the lowest measured KL among those with no more memory (long-context bits, the
planner's budget unit; with --context-len N, bits held at N tokens, as `plan --context-len N` prices them) than the
plan. Targets (issue 25): plan / best uniform <= 0.5 at 4x the profile's length,
never above 1.0; measured / predicted (the profile priced at that length, times the joint factor a selected plan
measured on the selection's windows, as validate predicts it) in 0.8-1.25.

With `--target vllm` (a profile made with `--target vllm`: every cached token read quantized, the `all` regime) the
plans are vLLM's (one dtype, plus the layers to skip) and the uniform configurations are vLLM's dtypes alone, each
with only the layers vLLM itself keeps (what `sensprof validate` shows beside a vLLM plan); `--select N` chooses
among the plan, its other-objective plans and those dtypes alone by measured KL (`plan --target vllm
--select-measured N`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--avg-bits", default="3,4,5")
    ap.add_argument("--select", type=int, default=2, help="windows for --select-measured (0: skip)")
    ap.add_argument("--select-seq-len", type=int, default=None,
                    help="tokens per selection window (default: plan's, 4x the profile's within the serving length)")
    ap.add_argument("--lengths", default=None, help="validation lengths (default: the profile's and 4x it)")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--uniform-top", type=int, default=5)
    ap.add_argument("--unpriced", action="store_true",
                    help="also plan with the damage as the profile measured it (at its own window: the planner before "
                         "sensprof.planning.pricing), memory priced alike")
    ap.add_argument("--context-len", type=int, default=None, metavar="N",
                    help="the serving length (plan --context-len N): budgets are bits held at N tokens, sinks and "
                         "recent tokens counted, and every plan and uniform setting is compared in that unit")
    ap.add_argument("--target", default="sensprof", choices=["sensprof", "vllm"])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--text", action="append", default=None, metavar="FILE",
                    help="judge on windows of this text (files, folders, JSONL) instead of the profile's unseen ones: "
                         "text of another kind than the profile's")
    ap.add_argument("--no-baselines", action="store_true",
                    help="sensprof target: leave out the uniform baselines of every configuration sensprof stores "
                         "(sensprof.validation.baselines), keeping the menus' candidates only")
    ap.add_argument("--plans-out", default=None, metavar="DIR",
                    help="also write each plan made here (<kind>-<budget>bits.json), to validate at other lengths")
    ap.add_argument("--plans-from", default=None, metavar="DIR",
                    help="judge the plans an earlier run wrote with --plans-out instead of making them (no selection)")
    args = ap.parse_args()

    from sensprof.planning.budget import Budget
    from sensprof.models import load_model
    from sensprof.planning.plan import make_plan, priced_table
    from sensprof.planning.planner import problem_from_table
    from sensprof.planning.pricing import priced_at
    from sensprof.planning.selection import select_measured, uniform_candidates
    from sensprof.profiling.table import load_profile, summed_damage
    from sensprof.targets import get_target
    from sensprof.validation.validate import layer_choices, measure, plan_reads, reference_configs, validation_windows

    t0 = time.time()
    profile = load_profile(args.profile, require_complete=True)
    meta = profile.meta
    own = int(meta["settings"]["seq_len"])
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [own, 4 * own]
    loaded = load_model(args.model or meta["model"]["id"], args.device)
    budgets = [float(x) for x in args.avg_bits.split(",")]
    plans, uniforms = {}, {}
    if args.target != "sensprof":
        args.unpriced = False
    for b in budgets:
        budget = Budget("avg_bits", b, context_len=args.context_len)
        if args.plans_from:  # the plans an earlier run made (--plans-out), judged again, e.g. at another length
            from sensprof.artifacts import load_plan

            for kind in ("priced", "unpriced", "selected"):
                path = os.path.join(args.plans_from, f"{kind}-{b:g}bits.json")
                if os.path.exists(path):
                    plans[(b, kind)] = load_plan(path)
            if (b, "priced") not in plans:
                sys.exit(f"--plans-from {args.plans_from}: no priced-{b:g}bits.json; run with --plans-out first")
            args.unpriced = False
        else:
            plans[(b, "priced")] = make_plan(args.profile, args.target, budget,
                                             vllm_gpu=meta.get("settings", {}).get("vllm_gpu"))
        priced = plans[(b, "priced")]
        if args.target != "sensprof":
            for name, layer_plans in reference_configs(priced).items():
                if name.startswith(f"{args.target} ") and "heuristic" not in name:
                    uniforms[name] = [(q.k_scheme, q.v_scheme) for q in layer_plans]
            if args.select and not args.plans_from:
                plans[(b, "selected")] = select_measured(priced, args.profile, budget, args.select,
                                                         args.select_seq_len, log=print, loaded=loaded)
            continue
        if args.unpriced:
            from sensprof.planning.plan import build_plan
            from sensprof.planning.planner import plan as solve

            table, pricing = priced_table(profile, "sensprof", get_target("sensprof"), own)  # scale 1: as measured
            solution = solve(problem_from_table(table, meta["layers"], "kl"), get_target("sensprof"), budget)
            plans[(b, "unpriced")] = build_plan(profile, solution, "sensprof", "kl", budget, pricing, table)
        if args.select and not args.plans_from:
            chosen = select_measured(priced, args.profile, budget, args.select, args.select_seq_len, log=print,
                                     loaded=loaded)
            plans[(b, "selected")] = chosen
        table, _ = priced_table(profile, "sensprof", get_target("sensprof"), None)
        problem = problem_from_table(table, meta["layers"], "kl")
        uniforms.update(uniform_candidates(problem, budget, meta["layers"], top=args.uniform_top))
    if args.plans_out:
        os.makedirs(args.plans_out, exist_ok=True)
        for (b, kind), p in plans.items():
            p.save(os.path.join(args.plans_out, f"{kind}-{b:g}bits.json"))
    template = plans.get((budgets[0], "selected")) if args.select else None
    template = template or plans[(budgets[0], "priced")]
    reads = plan_reads(template)
    text = None
    if args.text:
        from sensprof.validation.validate import read_user_text

        text = read_user_text(template.profile.settings.get("text_digest"), args.text)
    if args.target == "sensprof" and not args.no_baselines:  # every uniform configuration sensprof stores
        from sensprof.validation.baselines import best_uniforms_each, screen_length

        short = validation_windows(template, loaded.tokenizer, 1, screen_length(own, max(lengths)), text)
        bounds = [(Budget("avg_bits", b, context_len=args.context_len), None) for b in budgets]
        each, _, _ = best_uniforms_each(loaded.model, short, template, bounds, reads, log=print)
        uniforms.update({c.name: (c.k, c.v) for chosen in each for c in chosen})
    layers = meta["layers"]

    def per_layer(pair):  # one (K, V) pair for every layer, or a list of pairs
        return pair if isinstance(pair, list) else [pair] * len(layers)

    unit = Budget("avg_bits", 16, context_len=args.context_len)  # only its pricing is used: bits held at N tokens

    def bits(pairs):
        return unit.layers_cost(pairs, layers) / unit.elements(layers)

    rows = []
    for n in lengths:
        # the windows validate judges a selected plan on: neither the profile's nor the selection's
        ids = validation_windows(template, loaded.tokenizer, args.windows, n, text)
        configs, alias, seen = {}, {}, {}
        named = [(f"{kind} plan {b:g}", p.layers) for (b, kind), p in plans.items()]
        named += [(name, layer_choices(template, pair)) for name, pair in uniforms.items()]
        for name, layer_plans in named:  # each distinct configuration measured once
            key = tuple((q.k_scheme, q.v_scheme) for q in layer_plans)
            alias[name] = seen.setdefault(key, name)
            if alias[name] == name:
                configs[name] = layer_plans
        print(f"\n{len(configs)} configurations on {ids.shape[0]} x {ids.shape[1]} unseen tokens, read {reads}",
              flush=True)
        measured = measure(loaded.model, ids, configs, lambda name: print(f"  {name}", file=sys.stderr, flush=True),
                           reads=reads)
        measured = {name: measured[alias[name]] for name in alias}
        at = priced_at(profile.table, meta.get("reads", "streaming"), own, n, meta["layers"])
        uni = pd.DataFrame([{"config": name, "avg_bits": bits(per_layer(pair)), "kl": measured[name]["kl"]}
                            for name, pair in uniforms.items()])
        for (b, kind), p in plans.items():
            pairs = [(q.k_scheme, q.v_scheme) for q in p.layers]
            mine = bits(pairs)
            pool = uni[uni.avg_bits <= mine + 1e-9]
            best = pool.loc[pool.kl.idxmin()] if len(pool) else None
            kl = measured[f"{kind} plan {b:g}"]["kl"]
            pred = summed_damage(at, pairs, "kl")
            joint = p.predicted.joint_factor_at(n)  # what validate predicts: the selection's joint factor
            sel = p.solver.select or {}
            rows.append({"model": meta["model"]["id"], "seq_len": n, "windows": int(ids.shape[0]), "budget": b,
                         "plan": kind, "avg_bits": mine,
                         "measured_kl": kl, "predicted_kl": pred * (joint or 1.0),
                         "measured_over_predicted": kl / (pred * (joint or 1.0)),
                         "predicted_sum_kl": pred, "joint_factor": joint,
                         "best_uniform_le": None if best is None else best.config,
                         "best_uniform_le_bits": None if best is None else best.avg_bits,
                         "best_uniform_le_kl": None if best is None else best.kl,
                         "plan_over_uniform": None if best is None else kl / best.kl,
                         "chosen": sel.get("chosen", ""), "uniform_won": sel.get("uniform_won", "")})
        for name in uni.sort_values("avg_bits").config:
            r = uni[uni.config == name].iloc[0]
            rows.append({"model": meta["model"]["id"], "seq_len": n, "windows": int(ids.shape[0]), "budget": None,
                         "plan": name,
                         "avg_bits": r.avg_bits, "measured_kl": r.kl,
                         "predicted_kl": summed_damage(at, per_layer(uniforms[name]), "kl")})
    df = pd.DataFrame(rows).assign(reads=reads)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    pd.set_option("display.max_colwidth", 40)
    for n, g in df.groupby("seq_len"):
        print(f"\n== {n} tokens ==")
        print(g.drop(columns=["model", "seq_len", "windows"]).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    out = args.out or os.path.join(args.profile, "plan_quality.csv")
    df.to_csv(out, index=False)
    print(f"\nwrote {out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
