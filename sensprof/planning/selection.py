"""`plan --select-measured N`: the final choice made by measurement, never by prediction alone.

The planner's plan is one of several candidates: plans at the same budget from other objectives and robustness
settings (for target `sensprof` each also with sinks and recent tokens kept, and with its keys stored before RoPE),
and the strongest uniform configurations that cost no more memory under the same budget. For target
`sensprof` those are found among every uniform configuration its runtime stores within the budget, the profile's
menus or not (sensprof.validation.baselines: each scheme alone screened on one of the selection's windows, at the
length it judges at, the three best pairs by summed KL); for `vllm`, whose plans are one dtype plus layers kept
unquantized, each vLLM dtype alone (with only the boundary layers vLLM itself keeps). Targets that take one type
for every layer (SGLang, llama.cpp) have nothing to choose between. Each is measured with every layer quantized at
once, read as the target reads its cache, on N windows of the profile's text that the profile did not use, at a longer length than the profile's
(default 4x it, within the serving length), drawn with their own seed; the plan records their slots, and
`validate` leaves them out, so the windows a user judges the plan on are neither the profile's nor these. The
candidate with the lowest measured KL is the plan, unless it is a plan whose lead over the best uniform configuration
is within one standard error of the paired difference (`plan_lead`: a plan is fitted to the profile's text, a uniform
configuration to nothing); if the choice is a uniform configuration, the plan says so (`solver.select.uniform_won`)
and is that configuration.
"""

from __future__ import annotations

import dataclasses
import math
import os

from ..errors import SensprofError
from ..files import check_recorded_files
from ..artifacts import Plan, uniform_verdict
from ..schemes import get_scheme

SELECT_SEED_OFFSET = 2  # the profile's windows use its seed, validate's seed + 1, these seed + 2
UNIFORM_CHOICES = ("all", "menus")  # --select-uniforms: every configuration sensprof stores, or the menus'
UNIFORM_CANDIDATES = 3  # uniform configurations the priced profile predicts best (plus the richest one)
SELECTABLE = ("sensprof", "vllm")  # targets whose plans can differ from a uniform setting
DEFAULT_SELECT_WINDOWS = 2  # plan's default: a plan is never kept on its prediction alone
LEAD_BLOCKS_PER_WINDOW = 8  # plan_lead's blocks: 128 positions each in a 1024-token window


def default_select_windows(target: str, num_skip) -> int:
    """Windows `plan` measures its candidates on when the user does not say: none where there is nothing to choose
    (one type for every layer) or the user fixed the number of kept layers (--num-skip)."""
    return DEFAULT_SELECT_WINDOWS if target in SELECTABLE and num_skip is None else 0


def check_select_args(windows: int, seq_len: int | None, target: str) -> None:
    """--select-measured N and --select-seq-len T, refused before any solving or loading."""
    if windows and target not in SELECTABLE:
        raise SensprofError(f"--select-measured chooses among per-layer plans and uniform configurations; target "
                            f"{target} takes one type for every layer: drop --select-measured or use "
                            "--target sensprof or vllm")
    if windows < 0 or (seq_len is not None and seq_len < 2):
        raise SensprofError("--select-measured N takes a number of windows (e.g. 2) and --select-seq-len a length of "
                            "at least 2 tokens")
    if seq_len is not None and not windows:
        raise SensprofError("--select-seq-len needs --select-measured N")


def select_or_explain(plan: Plan, profile_dir: str, budget, windows: int, seq_len: int | None, defaulted: bool,
                      **options) -> Plan:
    """select_measured(); when the user did not ask for it (the default), a refusal also names the way out."""
    try:
        return select_measured(plan, profile_dir, budget, windows, seq_len, **options)
    except SensprofError as e:
        if not defaulted or "--select-measured 0" in str(e):
            raise
        raise SensprofError(f"{e} (or pass --select-measured 0 to plan by predicted damage alone, without the "
                            "model)") from None


def selection_windows(tokenizer, plan: Plan, windows: int, seq_len: int):
    """(ids, slots): windows of the profile's text that overlap no profiled window."""
    from ..data import SELECT_FLAGS, bos_prefix, overlapping_slots, select_windows

    settings = plan.profile.settings
    prefix = len(bos_prefix(tokenizer))
    exclude = overlapping_slots(set(plan.profile.window_slots or []), settings["seq_len"] - prefix, seq_len - prefix)
    ids, _, _, slots = select_windows(tokenizer, plan.profile.text_files, seq_len, windows,
                                      settings["seed"] + SELECT_SEED_OFFSET, exclude, SELECT_FLAGS,
                                      builtin=settings.get("text"))
    return ids, slots


def uniform_candidates(problem, budget, layers: list[dict], plan_pairs=None, top: int = UNIFORM_CANDIDATES):
    """{name: (K, V)}: the uniform configurations of the menus within the budget that the (priced) problem predicts
    best, and the one that spends the most memory (the best predicted of those)."""
    from .planner import runtime_format

    limit = budget.limit(layers)
    pool = []
    for k in problem.options["K"]:
        for v in problem.options["V"]:
            if not (runtime_format(k) and runtime_format(v)):
                continue
            cost = sum(budget.cost(get_scheme(k), layer) + budget.cost(get_scheme(v), layer) for layer in layers)
            if cost > limit * (1 + 1e-9):
                continue
            damage = sum(problem.cell(i, "K", k) + problem.cell(i, "V", v) for i in range(len(layers)))
            pool.append((damage, -cost, k, v))
    pool.sort()
    chosen = pool[:top]
    if pool:
        richest = min(pool, key=lambda x: (x[1], x[0]))
        if richest not in chosen:
            chosen.append(richest)
    return {f"uniform {k} / {v}": (k, v) for _, _, k, v in chosen}


def engine_uniform_plans(profile, problem, tgt, budget, objective: str, pricing, table) -> dict[str, Plan]:
    """{name: Plan}: each dtype of a one-dtype-plus-skips target (vLLM) alone, with only the layers the engine
    itself keeps, where it fits the budget."""
    from .plan import build_plan, with_vllm_pool
    from .planner import plan as solve

    out = {}
    for d in tgt.dtypes:
        if d.k_scheme == "none" or d.k_scheme not in problem.options["K"] or d.v_scheme not in problem.options["V"]:
            continue
        alone = dataclasses.replace(tgt, dtypes=tuple(x for x in tgt.dtypes if x.k_scheme == "none" or x == d))
        try:
            solution = solve(problem, alone, budget, num_skip=0)
        except SensprofError:  # does not fit the budget
            continue
        result = build_plan(profile, solution, tgt.name, objective, budget, pricing, table)
        if budget.kind == "serving":
            result = with_vllm_pool(result, budget)
        schemes = d.k_scheme if d.k_scheme == d.v_scheme else f"{d.k_scheme} / {d.v_scheme}"
        out[f"uniform vllm {d.flag_value} ({schemes})"] = result  # two fp8 dtypes differ by their scales
    return out


def _keeping_recent(plan: Plan, problem, budget, layers: list[dict]) -> Plan | None:
    """The plan with every grouped integer scheme keeping 4 sink tokens and 32 recent ones in full precision
    (uniforms.keep_recent: what the best uniform baselines do), if that fits the budget and changes anything; each
    layer's damage is the profile's cell of its new scheme, else of the old one (an upper bound: kept tokens only
    remove error)."""
    from .uniforms import keep_recent

    new = [dataclasses.replace(p, k_scheme=keep_recent(p.k_scheme), v_scheme=keep_recent(p.v_scheme),
                               k_damage=_cell(problem, p.layer, "K", keep_recent(p.k_scheme), p.k_damage, True),
                               v_damage=_cell(problem, p.layer, "V", keep_recent(p.v_scheme), p.v_damage, True))
           for p in plan.layers]
    if all((p.k_scheme, p.v_scheme) == (q.k_scheme, q.v_scheme) for p, q in zip(new, plan.layers)):
        return None
    cost = budget.layers_cost([(p.k_scheme, p.v_scheme) for p in new], layers)
    if cost > budget.limit(layers) * (1 + 1e-9):
        return None
    return _with_layers(plan, new, budget_used=cost)


def _with_layers(plan: Plan, new: list, **predicted) -> Plan:
    """The plan with layers `new`, its prediction summed and summarised again from them (`predicted`: fields set
    besides, such as the budget used)."""
    from .plan import held_avg_bits, predicted_summary

    summary = {k: v for k, v in predicted_summary(new).items() if k in {f.name for f in dataclasses.fields(
        plan.predicted)}}
    if plan.predicted.context_len:
        summary["avg_bits_at_context"] = held_avg_bits(new, plan.predicted.context_len)
    return plan.replace(layers=tuple(new), predicted=dataclasses.replace(
        plan.predicted, damage=sum(p.k_damage + p.v_damage for p in new), **predicted, **summary))


def _keys_before_rope(plan: Plan, problem, rope: list[bool]) -> Plan | None:
    """The plan with every per-channel integer key moved before RoPE on the layers that have RoPE (uniforms.before_rope:
    KVQuant's keys, in the same memory), if that changes anything. Every layer's damage is read again from `problem`
    (KL cells, whatever the candidate's objective, as _keeping_recent does), a moved key's from its new scheme's cell,
    else its twin's after RoPE (uniforms.bounded_scheme: an estimate, which the measurement here and the joint factor
    correct): on both real models' HTML windows the plans measured 0.69-0.91x their KL with keys after RoPE, where the
    uniform settings gained 0.87-1.02x (docs/plan-quality.md)."""
    from .uniforms import before_rope

    keys = [before_rope(p.k_scheme) if rope[p.layer] else p.k_scheme for p in plan.layers]
    if keys == [p.k_scheme for p in plan.layers]:
        return None
    return _with_layers(plan, [dataclasses.replace(
        p, k_scheme=k, k_damage=_cell(problem, p.layer, "K", k, p.k_damage, True),
        v_damage=_cell(problem, p.layer, "V", p.v_scheme, p.v_damage, True)) for p, k in zip(plan.layers, keys)])


def per_layer_uniform_plan(plan: Plan, c, cells: dict, screened: dict) -> Plan:
    """The per-layer vLLM plan that gives every layer the dtype of uniform configuration `c` (a Uniform with its
    flag), each layer's damage its cell in `cells` ({(layer, "K"|"V", scheme): KL}, the profile's), else its
    scheme's screen ({"k": {scheme: KL}, "v": ...}) shared equally by the layers."""
    from .plan import held_avg_bits, predicted_summary
    from .planner import per_layer_engine
    from ..targets import EngineDtype

    n = len(plan.layers)
    layers = tuple(dataclasses.replace(
        p, k_scheme=c.k, v_scheme=c.v,
        k_damage=0.0 if c.k == "none" else cells.get((p.layer, "K", c.k), screened["k"].get(c.k, 0.0) / n),
        v_damage=0.0 if c.v == "none" else cells.get((p.layer, "V", c.v), screened["v"].get(c.v, 0.0) / n))
        for p in plan.layers)
    settings = per_layer_engine([EngineDtype(c.flag, c.k, c.v)] * n, plan.engine.vllm_gpu)
    engine = dataclasses.replace(plan.engine, **{k: tuple(v) if isinstance(v, list) else v
                                                 for k, v in settings.items()})
    at = plan.predicted.context_len
    predicted = dataclasses.replace(plan.predicted, damage=sum(p.k_damage + p.v_damage for p in layers),
                                    budget_used=c.cost, **predicted_summary(layers),
                                    **({"avg_bits_at_context": held_avg_bits(layers, at)} if at else {}))
    return plan.replace(layers=layers, engine=engine, predicted=predicted)


def _screened_uniforms(model, ids, plan: Plan, budget, log):
    """(the best uniform baselines within the budget, the screen that ranked them as the plan records it): each K
    and V scheme of the plan's target alone on the first window (sensprof.validation.baselines)."""
    from ..validation.baselines import best_uniforms
    from ..validation.validate import plan_reads

    short = ids[:1]  # ranked at the length the selection judges at (baselines.screen_length)
    chosen, k_screen, v_screen = best_uniforms(model, short, plan, budget, reads=plan_reads(plan), log=log)
    return chosen, {"tokens": int(short.shape[1]), "k": k_screen, "v": v_screen}


def _finite(x: float) -> float | None:
    """A number for the plan file (which holds no NaN): None where the profile cannot predict it."""
    return x if math.isfinite(x) else None


def _cell(problem, layer: int, tensor: str, scheme: str, missing: float = math.nan, upper_bound: bool = False) -> float:
    """The profile's damage for a cell, `missing` where the profile did not measure that scheme (a uniform baseline
    from outside its menus); with upper_bound, an `_r32_s4` scheme it lacks reads its base scheme's cell
    (uniforms.kept_recent_base: how a plan given sinks and recent tokens is priced)."""
    from .uniforms import bounded_scheme

    if scheme == "none":
        return 0.0
    if upper_bound:
        scheme = bounded_scheme(scheme, lambda s: (layer, tensor, s) in problem.damage)
    return problem.damage.get((layer, tensor, scheme), missing)


def select_measured(plan: Plan, profile_dir: str, budget, windows: int, seq_len: int | None = None,
                    device: str = "auto", log=print, dtype=None, device_map=None, trust_remote_code=False,
                    model: str | None = None, loaded=None, text=None, uniform_set: str = "all") -> Plan:
    """The final choice by measured KL on `windows` unseen windows of the profile's text (or of `text`, the
    user's: validate.read_user_text's data.Text)."""
    from ..data import bos_prefix
    from ..models import load_for_profile
    from .plan import make_plan, priced_table
    from .planner import problem_from_table
    from ..profiling.hooks import layers_with_rope
    from ..profiling.table import load_profile
    from ..targets import get_target
    from .pricing import priced_at
    from ..validation.validate import layer_choices, measure, plan_reads, predicted_damage

    check_select_args(windows, seq_len, plan.target)
    if uniform_set not in UNIFORM_CHOICES:
        raise SensprofError(f"--select-uniforms {uniform_set!r}: choose {' or '.join(UNIFORM_CHOICES)}")
    if windows < 1:
        raise SensprofError(f"--select-measured {windows}: pass the number of windows to measure on, e.g. 2")
    profile = load_profile(profile_dir, require_complete=True)
    meta = profile.meta
    missing = [f for f in meta.get("text_files") or [] if not os.path.exists(f)]
    if missing:
        raise SensprofError(f"--select-measured reads the profile's text, but {missing[0]!r} is gone; restore it or "
                            "pass --select-measured 0 to plan by predicted damage alone")
    check_recorded_files(meta.get("text_files"), [profile_dir, "."], "the profile's text",
                         ", or pass --select-measured 0 to plan by predicted damage alone")
    pricing = plan.predicted.pricing or {}
    own = int(meta["settings"]["seq_len"])
    context = int(pricing.get("context_len") or 4 * own)
    n = seq_len or min(4 * own, context)
    limit = meta.get("max_positions")
    if limit and n > int(limit):
        raise SensprofError(f"--select-seq-len {n} is beyond the model's {limit} positions; pass at most {limit}")
    if seq_len and pricing.get("context_len") and seq_len > context:  # measured beyond what is served, silently
        raise SensprofError(f"--select-seq-len {seq_len} is beyond the served context of {context} tokens the plan "
                            f"is priced for; pass at most {context}, or a larger --context-len")
    if loaded is None:
        loaded = load_for_profile(plan, meta, model, device, dtype, device_map, trust_remote_code)
    if text is None:
        ids, slots = selection_windows(loaded.tokenizer, plan, windows, n)
    else:
        from ..validation.validate import user_windows

        ids, slots = user_windows(plan, loaded.tokenizer, text, n, windows,
                                  meta["settings"]["seed"] + SELECT_SEED_OFFSET, "--select-text")

    # the candidates: this plan, plans from other objectives / robustness at the same budget, uniform configurations
    gpu = plan.engine.vllm_gpu if plan.target == "vllm" else None
    plans = {"plan": plan}
    for label, objective, robust in (("plan (robust 1)", "kl", 1.0), ("plan (objective dnll)", "dnll", 0.0)):
        if (objective, robust) == (plan.objective, plan.solver.robust):
            continue
        try:
            alt = make_plan(profile_dir, plan.target, budget, objective, vllm_gpu=gpu, robust=robust,
                            per_layer=bool(plan.layer_dtypes))
        except SensprofError:
            continue
        plans[label] = alt
    tgt = get_target(plan.target, gpu, None, {layer["head_dim"] for layer in meta["layers"]})
    table, pricing_used = priced_table(profile, plan.target, tgt, pricing.get("context_len") or budget.context_len)
    problem = problem_from_table(table, meta["layers"], "kl")
    growth = None
    if plan.target == "sensprof":  # the K/V split re-learnt where the plan serves: a key error grows with context
        growth = _kv_growth(loaded.model, ids, plan, profile, own, plan_reads(plan))
        rebalanced = None if growth is None else _rebalanced(plan, profile, table, pricing_used, tgt, budget,
                                                             growth["k"] / growth["v"])
        if growth is not None:
            log(f"select: at {growth['seq_len']} tokens the plan's keys alone measured {growth['k']:.2f}x their "
                f"price, its values alone {growth['v']:.2f}x" + ("" if rebalanced is None else
                                                                 "; the plan with keys weighted so is a candidate"))
        if rebalanced is not None:
            plans[f"plan (keys weighted x{growth['k'] / growth['v']:.2f})"] = rebalanced
    if plan.target == "sensprof" and uniform_set == "all":  # each plan also with sinks and recent tokens kept
        for label, candidate in list(plans.items()):
            kept = _keeping_recent(candidate, problem, budget, meta["layers"])
            if kept is not None:
                plans[f"{label} + sinks and 32 recent tokens"] = kept
        rope = layers_with_rope(loaded.model)  # and each with its keys before RoPE, where layers have RoPE
        for label, candidate in list(plans.items()):
            moved = _keys_before_rope(candidate, problem, rope)
            if moved is not None:
                plans[f"{label}, keys before RoPE"] = moved
    screened, uniform_pairs = None, {}  # uniform_pairs: {name: (K, V)} of the uniform candidates a screen found
    if plan.target == "sensprof" and uniform_set == "menus":
        uniforms = uniform_candidates(problem, budget, meta["layers"])
        uniform_layers = {name: layer_choices(plan, pair) for name, pair in uniforms.items()}
    elif plan.target == "sensprof":  # every uniform configuration it stores within the budget, screened by measurement
        chosen_uniforms, screened = _screened_uniforms(loaded.model, ids, plan, budget, log)
        uniforms = uniform_pairs = {c.name: (c.k, c.v) for c in chosen_uniforms}
        uniform_layers = {name: layer_choices(plan, pair) for name, pair in uniforms.items()}
    else:  # each engine dtype alone is itself a plan (its engine settings included)
        uniforms = engine_uniform_plans(profile, problem, tgt, budget, plan.objective, pricing_used, table)
        if plan.layer_dtypes and uniform_set == "all":  # and the best of each dtype the plugin serves, on every layer
            chosen_uniforms, screened = _screened_uniforms(loaded.model, ids, plan, budget, log)
            for c in chosen_uniforms:
                uniform_pairs[c.name] = (c.k, c.v)
                uniforms.setdefault(c.name, per_layer_uniform_plan(plan, c, problem.damage, screened))
        uniform_layers = {name: list(p.layers) for name, p in uniforms.items()}
    configs, seen = {}, set()
    for name, layers in [*((name, p.layers) for name, p in plans.items()), *uniform_layers.items()]:
        key = tuple((q.k_scheme, q.v_scheme) for q in layers)
        if key not in seen:
            seen.add(key)
            configs[name] = layers
    reads = plan_reads(plan)
    log(f"select: measuring {len(configs)} candidates on {ids.shape[0]} x {ids.shape[1]} unseen tokens, read {reads}")
    measured = measure(loaded.model, ids, configs, reads=reads, per_token=True)
    at_len = priced_at(profile.table, meta.get("reads", "streaming"), own, int(ids.shape[1]), meta["layers"])
    rows = []
    for name, layers in configs.items():
        bound = name not in uniforms  # a plan given sinks and recent tokens: its cells' bases (uniforms read screens)
        pred = sum(_cell(problem, p.layer, "K", p.k_scheme, upper_bound=bound)
                   + _cell(problem, p.layer, "V", p.v_scheme, upper_bound=bound) for p in layers)
        here = predicted_damage(at_len, layers, "kl", upper_bound=bound)  # priced at the windows' own length
        if not math.isfinite(pred) and name in uniform_pairs:  # outside the profile: its schemes' screens summed
            k, v = uniform_pairs[name]
            pred = here = screened["k"].get(k, 0.0) + screened["v"].get(v, 0.0)
        cost = budget.layers_cost([(p.k_scheme, p.v_scheme) for p in layers], meta["layers"])
        rows.append({"name": name, "uniform": name in uniforms, "predicted_kl": _finite(pred),
                     "predicted_kl_here": _finite(here),
                     "measured_kl": measured[name]["kl"], "budget_used": cost})
        log(f"  {name:<40} predicted {here:.3e}  measured {measured[name]['kl']:.3e}" if math.isfinite(here) else
            f"  {name:<40} predicted (outside the profile)  measured {measured[name]['kl']:.3e}")
    best = min(rows, key=lambda r: r["measured_kl"])
    lead = plan_lead(rows, measured)
    if lead is not None and not lead["beyond_noise"]:
        best = next(r for r in rows if r["name"] == lead["uniform"])
    joint, joint_windows = _joint_factors(loaded.model, ids, configs[best["name"]], best, profile, own, reads,
                                          len(bos_prefix(loaded.tokenizer)), upper_bound=not best["uniform"])
    record = {"windows": int(ids.shape[0]), "seq_len": int(ids.shape[1]), "seed": meta["settings"]["seed"]
              + SELECT_SEED_OFFSET, "window_slots": list(slots), "reads": reads, "candidates": rows,
              "chosen": best["name"], "uniform_won": bool(best["uniform"])}
    if lead is not None:  # the best plan's lead over the best uniform configuration, and its noise
        record["lead"] = lead
    if growth:  # the plan's keys alone and values alone, measured over their price at the selection's length
        record["kv_growth"] = growth
    if screened:  # what each uniform scheme alone measured: the baselines' ranking
        record["uniform_screen"] = screened
    if text is not None:  # the user's text chose the plan: which, and that validate's windows need not avoid it
        record |= {"text": text.name, "text_files": list(text.files), "text_digest": text.digest(loaded.tokenizer)}
    if lead is not None and not lead["beyond_noise"]:
        log(f"select: {lead['plan']} measured {lead['ratio']:.3f}x {lead['uniform']}, a lead of {lead['lead']:.2e} "
            f"within one standard error ({lead['standard_error']:.2e} over {lead['blocks']} blocks of "
            f"{lead['block_tokens']} positions): not evidence, so the uniform configuration is kept")
    if best["uniform"] and plan.target != "sensprof":
        chosen = uniforms[best["name"]]
        log(f"select: {best['name']} alone measured {uniform_verdict(lead)} ({best['measured_kl']:.3e} vs "
            f"{min(r['measured_kl'] for r in rows if not r['uniform']):.3e}): the plan is that dtype")
    elif best["uniform"]:
        k, v = uniforms[best["name"]]
        n_layers, screen = len(plan.layers), screened or {"k": {}, "v": {}}
        chosen = plan.replace(layers=tuple(dataclasses.replace(  # a scheme outside the profile: its screen, per layer
            p, k_scheme=k, v_scheme=v, k_damage=_cell(problem, p.layer, "K", k, screen["k"].get(k, 0.0) / n_layers),
            v_damage=_cell(problem, p.layer, "V", v, screen["v"].get(v, 0.0) / n_layers)) for p in plan.layers))
        from .plan import held_avg_bits, predicted_summary

        at = plan.predicted.context_len
        chosen = chosen.replace(predicted=dataclasses.replace(
            plan.predicted, damage=best["predicted_kl"], budget_used=best["budget_used"],
            **predicted_summary(chosen.layers), **({"avg_bits_at_context": held_avg_bits(chosen.layers, at)}
                                                   if at else {})))
        log(f"select: the uniform configuration {k} / {v} measured {uniform_verdict(lead)} "
            f"({best['measured_kl']:.3e} vs {min(r['measured_kl'] for r in rows if not r['uniform']):.3e}): "
            "the plan is that configuration")
    else:
        chosen = plans[best["name"]]
        if chosen.predicted.objective != "kl":  # its prediction is stated in KL, what the choice and the joint factor
            chosen = chosen.replace(predicted=dataclasses.replace(  # measure (a dNLL sum would print "pred KL nan")
                chosen.predicted, damage=best["predicted_kl"], objective="kl"))
        log(f"select: {best['name']} measured the lowest KL ({best['measured_kl']:.3e})")
    if joint:
        record["joint_factor"] = joint
        record["joint_factor_windows"] = joint_windows
        chosen = chosen.replace(predicted=dataclasses.replace(chosen.predicted, joint_factor=joint))
        log(f"select: all layers at once measured {chosen.predicted.joint_summary()} the per-layer sum; validate's "
            "prediction carries it")
    return chosen.replace(solver=dataclasses.replace(chosen.solver, select=record))


def plan_lead(rows: list[dict], measured: dict) -> dict | None:
    """The best plan's lead over the best uniform configuration on the selection's windows, and whether it exceeds
    one standard error of that difference (the one-standard-error rule: among candidates that measure alike, keep the
    simplest). A plan is fitted to the profile's text and a uniform configuration to nothing, so a lead within the
    noise of a few windows is no evidence that it holds on other text. The standard error is that of the mean of
    paired per-position differences over LEAD_BLOCKS_PER_WINDOW contiguous blocks per window (neighbouring positions
    are correlated). None where the best candidate is a uniform one, there is none to compare, or too few blocks."""
    plans = [r for r in rows if not r["uniform"]]
    uniforms = [r for r in rows if r["uniform"]]
    if not plans or not uniforms:
        return None
    p = min(plans, key=lambda r: r["measured_kl"])
    u = min(uniforms, key=lambda r: r["measured_kl"])
    if u["measured_kl"] <= p["measured_kl"]:
        return None
    noise = paired_standard_error(measured[p["name"]]["kl_tokens"] - measured[u["name"]]["kl_tokens"])
    if noise is None:
        return None
    error, blocks, size = noise
    lead = u["measured_kl"] - p["measured_kl"]  # the figures printed beside it; the blocks give its noise
    return {"plan": p["name"], "uniform": u["name"], "ratio": round(p["measured_kl"] / u["measured_kl"], 4),
            "lead": lead, "standard_error": error, "blocks": blocks, "block_tokens": size,
            "beyond_noise": bool(lead > error)}


def paired_standard_error(diff) -> tuple[float, int, int] | None:
    """(standard error, blocks, tokens a block) of the mean of paired per-position differences `diff` [windows,
    positions], over LEAD_BLOCKS_PER_WINDOW contiguous blocks per window (neighbouring positions are correlated);
    None with fewer than 2 blocks or positions than blocks."""
    size = diff.shape[1] // LEAD_BLOCKS_PER_WINDOW
    if size < 1:
        return None
    blocks = diff[:, :size * LEAD_BLOCKS_PER_WINDOW].reshape(diff.shape[0], LEAD_BLOCKS_PER_WINDOW, size).mean(-1)
    blocks = blocks.flatten()
    if blocks.numel() < 2:
        return None
    return float(blocks.std() / math.sqrt(blocks.numel())), int(blocks.numel()), int(size)


def _kv_growth(model, ids, plan: Plan, profile, own: int, reads: str) -> dict | None:
    """The plan's keys alone and its values alone, measured on the selection's windows, each over its per-layer sum
    priced at their length. A profile of a few hundred tokens prices a key error as if it stayed what it was there,
    but it grows with context more than a value error does (docs/measurements.md, "What the built-in mixture
    changes": keys weighed 0.09-0.23 of values at 256 tokens, 0.27-0.52 at 1024), so the split it teaches starves
    the keys. None where a price is missing or zero."""
    from .pricing import priced_at
    from ..validation.validate import measure, predicted_damage

    n = int(ids.shape[1])
    at = priced_at(profile.table, profile.meta.get("reads", "streaming"), own, n, profile.meta["layers"])
    alone = {"k": [dataclasses.replace(p, v_scheme="none") for p in plan.layers],
             "v": [dataclasses.replace(p, k_scheme="none") for p in plan.layers]}
    priced = {t: predicted_damage(at, layers) for t, layers in alone.items()}
    if not all(math.isfinite(x) and x > 0 for x in priced.values()):
        return None
    measured = measure(model, ids, alone, reads=reads)
    out = {t: round(measured[t]["kl"] / priced[t], 4) for t in alone}
    return {**out, "seq_len": n} if all(x > 0 for x in out.values()) else None


def _rebalanced(plan: Plan, profile, table, pricing, tgt, budget, key_weight: float) -> Plan | None:
    """The plan solved again with every key cell's damage weighted by `key_weight` (the keys' measured growth over
    the values'), each layer still recording the profile's priced damage; None if that changes nothing."""
    from .plan import build_plan
    from .planner import plan as solve, problem_from_table
    from .pricing import PRICED_COLUMNS

    weighted = table.copy()
    keys = weighted.tensor == "K"
    for column in PRICED_COLUMNS:
        if column in weighted:
            weighted.loc[keys, column] = weighted.loc[keys, column] * key_weight
    robust = plan.solver.robust or 0.0  # the plan's own objective and robustness, only the weights change
    solution = solve(problem_from_table(weighted, profile.meta["layers"], plan.objective, robust), tgt, budget)
    result = build_plan(profile, solution, plan.target, plan.objective, budget, pricing, table)
    if [(p.k_scheme, p.v_scheme) for p in result.layers] == [(p.k_scheme, p.v_scheme) for p in plan.layers]:
        return None
    return result.replace(predicted=dataclasses.replace(result.predicted, damage=sum(
        p.k_damage + p.v_damage for p in result.layers)), solver=dataclasses.replace(result.solver, robust=robust))


def short_chunks(ids, own: int, prefix: int):
    """Every whole window of the profile's length (`own` tokens, the tokenizer's `prefix` tokens first) cut from the
    selection's longer windows: 4x the text of their first tokens alone for the factor at the profile's length."""
    import torch

    body = own - prefix
    per = (ids.shape[1] - prefix) // body if body > 0 else 0
    chunks = [torch.cat([ids[:, :prefix], ids[:, prefix + j * body:prefix + (j + 1) * body]], dim=1)
              for j in range(per)]
    return torch.cat(chunks, dim=0) if chunks else ids[:, :own]


def _joint_factors(model, ids, layers, best: dict, profile, own: int, reads: str, prefix: int,
                   upper_bound: bool = False):
    """({tokens: measured / per-layer sum}, {tokens: windows}) for the chosen candidate: at the selection's length
    (already measured) and at the profile's, on every profile-length chunk of the same windows (text validate never
    reads; one 2-window measurement at that length erred by up to 1.6x on Gemma). Empty where the profile lacks a
    cell; upper_bound: the sum of a plan given sinks and recent tokens, as its row was summed."""
    from .pricing import priced_at
    from ..validation.validate import measure, predicted_damage

    out, windows = {}, {}
    if (best["predicted_kl_here"] or 0) > 0:
        out[str(ids.shape[1])], windows[str(ids.shape[1])] = round(best["measured_kl"] / best["predicted_kl_here"], 4), \
            int(ids.shape[0])
    if ids.shape[1] > own:
        pred = predicted_damage(priced_at(profile.table, profile.meta.get("reads", "streaming"), own, own), layers,
                                upper_bound=upper_bound)
        chunks = short_chunks(ids, own, prefix)
        kl = measure(model, chunks, {"chosen": layers}, reads=reads)["chosen"]["kl"]
        if pred > 0:
            out[str(own)], windows[str(own)] = round(kl / pred, 4), int(chunks.shape[0])
    keep = {n for n, f in out.items() if f == f}  # NaN: a cell it lacks
    order = sorted(keep, key=int)
    return {n: out[n] for n in order}, {n: windows[n] for n in order}
