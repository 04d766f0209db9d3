"""`sensprof sweep`: plans over a range of budgets, and with --validate each measured beside uniform configurations
(every layer one K and one V scheme) on unseen windows: the menu's, and for target sensprof the best it stores within
each plan's memory, menus or not (sensprof.validation.baselines): the frontier the plans must beat."""

from __future__ import annotations

import os
import sys

from ..errors import SensprofError
from ..files import safe_name
from .plan import make_plan
from .selection import check_select_args
from .selection import select_measured as select_measured_plan


UNIFORM_CHOICES = ("frontier", "all", "none")


def run_sweep(profile_dir: str, *, avg_bits=(3, 3.5, 4, 4.5, 5, 6, 8), target: str = "sensprof",
              objective: str = "kl", robust: float = 0.0, vllm_gpu: str | None = None,
              llamacpp_build: str | None = None, context_len: int | None = None, validate: bool = False,
              uniform: str = "frontier", windows: int | None = None, seq_len: int | None = None,
              model_options: dict | None = None, out: str | None = None, log=print, select_measured: int = 0,
              select_seq_len: int | None = None, select_text=None):
    """Plans at each budget in `out` (default plans/sweep-<model>-<target>) and sweep.csv, each chosen by measured KL
    on `select_measured` windows as `plan --select-measured` chooses (of the user's `select_text` files, as
    `plan --select-text`; 0: the planner's plans, by prediction); with
    `validate`, each plan and the uniform configurations measured on unseen windows (uniform.csv). Returns
    (table, out)."""
    import pandas as pd

    from .budget import Budget
    from ..files import atomic_write_text, check_writable, output_lock
    from ..specs import parse_list
    from ..profiling.table import load_profile

    if uniform not in UNIFORM_CHOICES:
        raise SensprofError(f"--uniform {uniform!r} is not frontier, all or none")
    if windows is not None and windows < 1:
        raise SensprofError(f"--windows {windows} is too few; use at least 1, or leave --windows out for as many as "
                            "profiled")
    check_select_args(select_measured, select_seq_len, target)
    from ..validation.validate import read_select_text

    user_text = read_select_text(profile_dir, select_text, select_measured)  # before any plan or the model
    values = parse_list(avg_bits, "--avg-bits", float, "3,4,6")
    budgets = [Budget("avg_bits", b, context_len=context_len) for b in sorted(values)]  # refused before any plan
    profile = load_profile(profile_dir, require_complete=True)
    out = out or os.path.join("plans", f"sweep-{safe_name(profile.meta['model']['id'])}-{target}")
    check_writable(out)
    model_options = model_options or {}
    with output_lock(out):  # one writer per folder
        rows, plans, loaded = [], [], None
        for budget in budgets:
            b = budget.value
            try:
                plan = make_plan(profile_dir, target, budget, objective, None, vllm_gpu, llamacpp_build, robust)
            except SensprofError as e:
                if "infeasible" in str(e):
                    log(f"--avg-bits {b:g}: infeasible for {target}")
                    continue
                raise
            if select_measured:
                if loaded is None:  # once, for every budget's selection
                    from ..models import load_for_plan

                    loaded = load_for_plan(plan, **model_options)
                log(f"--avg-bits {b:g}:")
                plan = select_measured_plan(plan, profile_dir, budget, select_measured, select_seq_len, log=log,
                                            loaded=loaded, text=user_text)
            path = os.path.join(out, f"plan-{b:g}bits.json")
            plan.save(path)
            plans.append((path, plan))
            chosen = {"selected": plan.solver.select["chosen"]} if plan.solver.select else {}
            rows.append({"budget_avg_bits": b, "context_len": context_len, "avg_bits": plan.predicted.avg_bits,
                         "fraction_of_bf16": plan.predicted.fraction_of_bf16,
                         "predicted_damage": plan.predicted.damage, "engine": plan.engine_summary(), **chosen,
                         "plan": path})
        if not rows:
            raise SensprofError(f"every budget was infeasible for target {target}; try larger --avg-bits")
        df = pd.DataFrame(rows)
        best = float("inf")
        frontier = []
        for r in df.sort_values("avg_bits").itertuples():  # non-dominated: less damage than any cheaper plan
            frontier.append(r.predicted_damage < best - 1e-18)
            best = min(best, r.predicted_damage)
        df = df.sort_values("avg_bits").assign(frontier=frontier)
        if validate:
            df = _validate_sweep(df, profile, plans, uniform, windows, seq_len, model_options, out, log, loaded)
        atomic_write_text(os.path.join(out, "sweep.csv"), df.to_csv(index=False))
    return df, out


def _validate_sweep(df, profile, plans, which, windows, seq_len, model_options, out, log, loaded=None):
    """Measure each plan and the uniform configurations on unseen windows, and compare (compare_with_uniform)."""
    import pandas as pd

    from ..files import atomic_write_text
    from ..models import load_for_plan
    from ..report.data import config_bits, config_bits_at, near_frontier, uniform_configs
    from ..validation.validate import UNIFORM, layer_choices, measure, plan_reads, validation_windows

    template = plans[0][1]
    loaded = loaded or load_for_plan(template, **model_options)
    ids = validation_windows(template, loaded.tokenizer, windows, seq_len)
    by_path = dict(plans)
    configs = {"plan " + os.path.basename(p): by_path[p].layers for p in df.plan}
    uniform = uniform_configs(profile.table, profile.meta, every=True)
    if which == "frontier":
        uniform = near_frontier(uniform)
    elif which == "none":
        uniform = uniform.iloc[0:0]
    n = len(template.layers)
    standard = pd.DataFrame([{"config": name, "k_scheme": k, "v_scheme": v,
                              "avg_bits": config_bits(profile.meta, [(k, v)] * n), "predicted_kl": float("nan")}
                             for name, (k, v) in UNIFORM.items()])
    uniform = pd.concat([uniform, standard[~standard.config.isin(uniform.config)],
                         _baselines(df, by_path, template, loaded, ids, which, log, profile.meta)], ignore_index=True)
    uniform = uniform.drop_duplicates(["k_scheme", "v_scheme"])
    for r in uniform.itertuples():
        configs[r.config] = layer_choices(template, (r.k_scheme, r.v_scheme))
    log(f"measuring {len(df)} plans and {len(uniform)} uniform configurations on {ids.shape[0]} x {ids.shape[1]} "
        "unseen tokens")
    done = []

    def progress(name):
        done.append(name)
        print(f"  [{len(done)}/{len(configs)}] {name}", file=sys.stderr, flush=True)

    measured = measure(loaded.model, ids, configs, progress, reads=plan_reads(template))
    df = df.assign(measured_kl=[measured["plan " + os.path.basename(p)]["kl"] for p in df.plan],
                   dppl=[measured["plan " + os.path.basename(p)]["dppl"] for p in df.plan],
                   base_ppl=[measured["plan " + os.path.basename(p)]["base_ppl"] for p in df.plan])
    uniform = uniform.assign(measured_kl=[measured[c]["kl"] for c in uniform.config],
                             dppl=[measured[c]["dppl"] for c in uniform.config]).sort_values("avg_bits")
    n_tokens = int(ids.shape[1])  # what a cache of the validation length holds, full-precision tokens included
    df = df.assign(avg_bits_at_len=[config_bits_at(profile.meta, [(p.k_scheme, p.v_scheme) for p in by_path[
        path].layers], n_tokens) for path in df.plan])
    uniform = uniform.assign(avg_bits_at_len=[config_bits_at(profile.meta, [(r.k_scheme, r.v_scheme)] * n, n_tokens)
                                              for r in uniform.itertuples()])
    df = compare_with_uniform(df, uniform)
    df = compare_with_uniform(df, uniform, bits="avg_bits_at_len", suffix="_at_len")
    df = df.assign(validation_tokens=f"{ids.shape[0]}x{ids.shape[1]}")
    atomic_write_text(os.path.join(out, "uniform.csv"), uniform.to_csv(index=False))
    return df


def _baselines(df, by_path, template, loaded, ids, which, log, meta):
    """The best uniform configurations sensprof stores within each plan's memory, menus or not
    (sensprof.validation.baselines; one screen on the first window, shared by every budget)."""
    import pandas as pd

    from ..report.data import config_bits
    from ..validation.baselines import baseline_name, best_uniforms_each, plan_cost
    from ..validation.validate import plan_reads

    columns = ["config", "k_scheme", "v_scheme", "avg_bits", "predicted_kl"]
    if which == "none" or template.target != "sensprof":
        return pd.DataFrame(columns=columns)
    plans = [by_path[p] for p in df.plan]
    short = ids[:1]  # ranked at the length the sweep judges at (baselines.screen_length)
    each, _, _ = best_uniforms_each(loaded.model, short, template, [(p.budget, plan_cost(p)) for p in plans],
                                    plan_reads(template), log=log)
    n = len(template.layers)
    rows = {(c.k, c.v): {"config": baseline_name(c), "k_scheme": c.k, "v_scheme": c.v,
                         "avg_bits": config_bits(meta, [(c.k, c.v)] * n), "predicted_kl": float("nan")}
            for chosen in each for c in chosen}
    return pd.DataFrame(list(rows.values()), columns=columns)


MORE_BITS = 0.5  # "equal or more memory": uniform configurations with up to this many bits per element more


def compare_with_uniform(df, uniform, bits: str = "avg_bits", suffix: str = ""):
    """Beside each plan (measured_kl, avg_bits), two measured uniform configurations and the plan's KL as a fraction
    of theirs: the best with no more memory (`best_uniform_le`: the frontier the plan must beat) and the best with
    equal memory or up to MORE_BITS more, inclusive (`best_uniform_ge`: a handicap in the uniform's favour).
    `bits`: the memory column compared (`avg_bits_at_len`: as held at the validation length; columns get `suffix`)."""
    cols = {}
    for tag, lo, hi in (("le", -float("inf"), 0.0), ("ge", 0.0, MORE_BITS)):
        names, kls = [], []
        for r in df.itertuples():
            d = uniform[bits] - getattr(r, bits)  # bits per element the uniform configuration holds more
            pool = uniform[(d >= lo - 1e-9) & (d <= hi + 1e-9)]
            row = pool.loc[pool.measured_kl.idxmin()] if len(pool) else None
            names.append(None if row is None else row.config)
            kls.append(float("nan") if row is None else float(row.measured_kl))
        cols[f"best_uniform_{tag}{suffix}"] = names
        cols[f"best_uniform_{tag}{suffix}_kl"] = kls
        cols[f"kl_vs_uniform_{tag}{suffix}"] = [m / b if b and b > 0 else float("nan")
                                                for m, b in zip(df.measured_kl, kls)]
    return df.assign(**cols)
