"""The library's entry points, one per command, with explicit keyword parameters.

The command line (cli.py) only parses arguments into these and prints what they return; a notebook or a test
calls them the same way. Every function that loads a model takes the same model options: `model`, `device`,
`dtype`, `device_map`, `trust_remote_code`.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass

from .data import load_windows, select_windows  # noqa: F401  (part of the API: windows of the built-in text)
from .errors import SensprofError
from .models import DEFAULT_MODEL
from .planning.selection import SELECTABLE  # noqa: F401  (part of the API: the targets plan can choose for)
from .planning.selection import check_select_args, default_select_windows


def _model_options(model=None, device="auto", dtype=None, device_map=None, trust_remote_code=False) -> dict:
    return {"model": model, "device": device, "dtype": dtype, "device_map": device_map,
            "trust_remote_code": trust_remote_code}


# ---------------------------------------------------------------- profile


def profile(model=DEFAULT_MODEL, schemes=None, *, k_schemes=None, v_schemes=None, target=None, vllm_gpu=None,
            tokenizer=None, text=None, seq_len=None, windows=None, seed=0, layers=None, out_dir=None, device="auto",
            dtype=None, device_map=None, trust_remote_code=False, variants_per_pass=1, kl=None, screen=False,
            naive=False, progress=True, quiet_loading=False, ray=None, ray_workers=None, ray_gpus_per_worker=None,
            reads=None, menus=None):
    """Profile a model (an id/path/alias, or a loaded transformers model with its tokenizer).

    `schemes` go to both K and V; `k_schemes` / `v_schemes` to one (default: the per-tensor menus named by `menus`,
    "default" or "long" (sensprof.schemes.MENUS), or what `target` can use). `seq_len` may be a list (e.g.
    "256,1024"): each length is profiled, the longest into `out_dir`, the others into `out_dir`/lengths/<L>; with
    `seq_len`, `windows`, `kl`, `menus` and the schemes all left out, two 256-token windows with exact KL, or for a
    model whose sliding windows those never pass the long-context route (sensprof.profiling.route). `layers`: a
    list or a spec such as "0-11". `ray`: True (a Ray cluster on this machine, or the one already initialized) or a
    Ray address ("auto", "host:6379", "ray://host:10001") fans the cells out over `ray_workers` workers (default one
    per GPU, else per CPU), each loading the model on `ray_gpus_per_worker` GPUs (default 1; more with
    `device_map="auto"`). `reads`: how the profiled cache is read, "streaming" or "all" (default: the `target`'s
    regime, sensprof.pricing; streaming without one). Returns the `Profile` of the longest length (its `.table` is a
    pandas DataFrame, one row per layer x tensor x scheme).
    """
    from .data import parse_seq_lens, text_source
    from .profiling.profile import check_modes
    from .specs import parse_layers
    from .profiling.table import length_dir
    from .targets import llamacpp_channel_order, profile_menu

    schemes, k_schemes, v_schemes = (",".join(x) if isinstance(x, (list, tuple)) else x
                                     for x in (schemes, k_schemes, v_schemes))
    for flag, value in (("--schemes", schemes), ("--k-schemes", k_schemes), ("--v-schemes", v_schemes)):
        if value is not None and not str(value).replace(",", "").strip():
            from .schemes import scheme_names

            raise SensprofError(f"no schemes given: {flag} is empty; pass one or more of: {', '.join(scheme_names())}; "
                                f"or leave {flag} out for the default menu")
    if isinstance(layers, str) and not layers.replace(",", "").strip():
        raise SensprofError("--layers is empty; pass layers such as 0-11 or 0,5,7-9, or leave --layers out for all")
    profile_menu(schemes, target, vllm_gpu, None, k_schemes, v_schemes, menus=menus)  # a bad menu fails before loading
    check_modes("exact" if kl is None else kl, screen, replay=not naive, naive=naive)
    from .planning.pricing import profile_reads
    from .profiling.route import SHORT_SEQ_LEN, profile_route

    reads = profile_reads(reads, target)
    named = {"seq_len": seq_len, "windows": windows, "kl": kl, "menus": menus,
             "named_schemes": any(x is not None for x in (schemes, k_schemes, v_schemes)), "naive": naive,
             "reads": reads, "target": target}
    parse_seq_lens(SHORT_SEQ_LEN if seq_len is None else seq_len)  # a bad --seq-len fails before loading
    for flag, value in (("--windows", windows), ("--variants-per-pass", variants_per_pass)):
        if value is not None and value < 1:
            raise SensprofError(f"{flag} must be at least 1")
    if ray is None and (ray_workers is not None or ray_gpus_per_worker is not None):
        raise SensprofError("--ray-workers and --ray-gpus-per-worker need --ray")
    if ray is not None and not isinstance(model, str):
        raise SensprofError("--ray loads the model on every worker: pass a model id, path or alias, not a loaded model")
    files = [text] if isinstance(text, str) else text
    body, text_name = text_source(files)  # missing, empty, binary or bad JSONL --text fails before minutes of loading
    with contextlib.ExitStack() as stack:
        if out_dir:
            from .files import check_writable, output_lock

            check_writable(out_dir)  # before minutes of loading
            stack.enter_context(output_lock(out_dir))  # one writer per folder, for the whole run
        if ray is None:
            model, tokenizer, model_id, shape = _profiled_model(model, tokenizer, device, dtype, device_map,
                                                                trust_remote_code, quiet_loading)
        else:
            from .profiling.distributed import RayProfiler

            model_id = model  # the driver's text (body) goes to every worker, which renders its chats
            cluster = stack.enter_context(RayProfiler(ray, _model_options(model, device, dtype, device_map,
                                                                          trust_remote_code),
                                                      ray_workers, ray_gpus_per_worker,
                                                      log=_stderr_line if progress else None))
            shape = cluster.shape
        layers = parse_layers(layers, shape["layers"]) if layers is None or isinstance(layers, str) else layers
        route = profile_route(shape.get("sliding_windows") or [], shape["max_positions"], shape.get("vocab"), **named)
        seq_len, windows, kl, menus = route.seq_len, route.windows, route.kl, route.menus
        lengths = parse_seq_lens(seq_len, shape["max_positions"])
        if progress and route.long:
            _note_long_route(max(shape["sliding_windows"]), route)
        menu = profile_menu(schemes, target, vllm_gpu, set(shape["head_dims"]), k_schemes, v_schemes,
                            llamacpp_channel_order(shape.get("model_class")), menus)
        _check_sinks_outgrown(menus, shape.get("sliding_windows") or [], lengths[-1])
        if progress:
            _note_windows_not_passed(shape.get("sliding_windows") or [], lengths[-1], target)
        result = None
        for n in lengths:  # the shorter ones first (cheap), the longest last: it is the profile the planner reads
            out = (out_dir if n == lengths[-1] else length_dir(out_dir, n)) if out_dir else None
            extra = {"lengths": lengths if len(lengths) > 1 else None,
                     "text_files": list(body.files) if files else None,  # the files read (a folder's each)
                     "max_positions": shape["max_positions"]}
            if ray is None:
                result = _profile_here(model, tokenizer, (body, text_name), n, windows, seed, menu, layers, out,
                                       model_id, variants_per_pass, naive, kl, screen, progress, extra, reads)
            else:
                result = cluster.profile(menu, body, text_name, n, windows, seed, layers, out, model_id,
                                         variants_per_pass, not naive, "materialized" if naive else kl, screen,
                                         progress, extra, reads)
    return result


def _stderr_line(msg: str) -> None:
    import sys

    print(f"sensprof: {msg}", file=sys.stderr, flush=True)


def _profiled_model(model, tokenizer, device, dtype, device_map, trust_remote_code, quiet_loading):
    """(model, tokenizer, model id, shape) of the model to profile in this process: loaded, or as passed."""
    from .models import load_model, model_shape

    if isinstance(model, str):
        model_id = model
        with contextlib.redirect_stderr(io.StringIO()) if quiet_loading else contextlib.nullcontext():
            loaded = load_model(model, device, dtype, device_map, trust_remote_code)
        model, tokenizer = loaded.model, loaded.tokenizer
    elif tokenizer is None:
        raise SensprofError("pass the tokenizer along with a loaded model")
    else:
        from .profiling.hooks import register

        model_id = getattr(model.config, "_name_or_path", type(model).__name__)
        register()
    return model, tokenizer, model_id, model_shape(model)


def _check_sinks_outgrown(menus: str | None, windows: list[int], seq_len: int) -> None:
    """--menus long's layouts mostly keep sink tokens; a sliding-window layer the profile never
    outgrows is priced for longer contexts by the same layouts without sinks (sensprof.planning.pricing.
    sinkless_pricing), which that menu lacks: refused before minutes of profiling."""
    if menus == "long" and windows and max(windows) >= seq_len:
        w = max(windows)
        raise SensprofError(f"--menus long keeps sink tokens that a sliding-window layer of {w} tokens loses at "
                            f"longer contexts, and a {seq_len}-token profile cannot see it: pass --seq-len above {w} "
                            f"(e.g. {max(2 * w, 1024)}), or leave --menus out")


def _note_long_route(window: int, route) -> None:
    """Say which profile runs, and how to get the short one: the user named none of its settings."""
    from .planning.pricing import past_window_profile
    from .profiling.route import SHORT_SEQ_LEN

    _stderr_line(f"the default {SHORT_SEQ_LEN}-token windows never pass this model's {window}-token sliding window, "
                 f"so it gets the long-context route: {past_window_profile(route.seq_len, None, route.kl)} "
                 f"(docs/plan-quality.md); name --seq-len {SHORT_SEQ_LEN} for the short profile")


def _note_windows_not_passed(windows: list[int], seq_len: int, target: str | None) -> None:
    """Before minutes of profiling: windows that never pass a sliding window leave those layers' damage past it to
    extrapolation, which ranked Gemma 3 270M's layers wrongly at 1024 tokens (sensprof.planning.pricing.
    outgrown_windows_note says it again beside each plan served past it)."""
    from .planning.pricing import past_window_profile

    if windows and seq_len <= max(windows):
        w = max(windows)
        _stderr_line(f"note: {seq_len}-token windows do not pass this model's {w}-token sliding window, so plans served "
                     f"past {w} tokens price those layers by extrapolation; for them profile with "
                     f"{past_window_profile(2 * w, target)}")


def _profile_here(model, tokenizer, text, seq_len, windows, seed, menu, layers, out, model_id, variants_per_pass,
                  naive, kl, screen, progress, extra, reads="streaming"):
    from .data import text_windows
    from .profiling.profile import run_profile

    ids, text_name, digest, slots = text_windows(tokenizer, *text, seq_len, windows, seed)
    return run_profile(model, ids, menu, layers=layers, out_dir=out, model_id=model_id, text_name=text_name,
                       text_digest=digest, seed=seed, variants_per_pass=variants_per_pass, replay=not naive,
                       kl="materialized" if naive else kl, screen=screen, progress=progress,
                       extra_meta={"window_slots": slots, **extra}, reads=reads)


def default_profile_dir(model: str) -> str:
    from .profiling.table import default_out_dir

    return default_out_dir(model)


# ---------------------------------------------------------------- plan, sweep


def plan(profile_dir: str, *, avg_bits=None, fraction=None, gpu_mem_gib=None, max_model_len=None,
         max_num_seqs=None, context_len=None, target="sensprof", objective="kl", robust=0.0, refine=0,
         num_skip=None, vllm_gpu=None, llamacpp_build=None, model=None, device="auto", dtype=None, device_map=None,
         trust_remote_code=False, out=None, log=print, select_measured=None, select_seq_len=None, select_text=None,
         per_layer=False, select_uniforms="all"):
    """Solve for each layer's K and V scheme under one budget, then make the final choice among plans and uniform
    configurations by measured KL on `select_measured` unseen windows (sensprof.selection; default
    DEFAULT_SELECT_WINDOWS for the targets that have a choice and no --num-skip, 0: by predicted damage alone); with
    `out` (a path, or True for the default plans/<model>-<target>-<budget>.json) the plan is written there;
    `select_uniforms` "all" (every uniform configuration sensprof stores, screened) or "menus". Returns (Plan, path
    or None)."""
    from .planning.budget import budget_from_args
    from .files import check_writable
    from .planning.plan import make_plan

    budget = budget_from_args(avg_bits, fraction, gpu_mem_gib, max_model_len, max_num_seqs, context_len)
    if refine < 0:
        raise SensprofError(f"--refine {refine} is negative; pass the number of rounds, e.g. 3")
    defaulted = select_measured is None
    if defaulted:
        select_measured = default_select_windows(target, num_skip)
    check_select_args(select_measured, select_seq_len, target)
    if select_measured and num_skip is not None:  # only when asked for: the default is 0 with --num-skip
        raise SensprofError(f"--num-skip {num_skip} fixes how many layers the plan keeps, but --select-measured may "
                            "choose a dtype alone (none kept): drop one of them")
    if isinstance(out, str):
        check_writable(out, "--out", "file")  # before the solver and any --refine rounds
    from .validation.validate import read_select_text

    user_text = read_select_text(profile_dir, select_text, select_measured)  # before the solver and the model
    result = make_plan(profile_dir, target, budget, objective, num_skip, vllm_gpu, llamacpp_build, robust, per_layer)
    if refine:
        from .planning.refine import refine_plan

        result = refine_plan(result, profile_dir, budget, refine, device, log, dtype, device_map, trust_remote_code,
                             model)
    if select_measured:
        from .planning.selection import select_or_explain

        result = select_or_explain(result, profile_dir, budget, select_measured, select_seq_len, defaulted,
                                   device=device, log=log, dtype=dtype, device_map=device_map,
                                   trust_remote_code=trust_remote_code, model=model, text=user_text,
                                   uniform_set=select_uniforms)
    path = None
    if out:
        path = out if isinstance(out, str) else result.default_path()
        result.save(path)
    return result, path


def sweep(profile_dir: str, *, avg_bits=(3, 3.5, 4, 4.5, 5, 6, 8), target="sensprof", objective="kl", robust=0.0,
          vllm_gpu=None, llamacpp_build=None, context_len=None, validate=False, uniform="frontier", windows=None,
          seq_len=None, model=None, device="auto", dtype=None, device_map=None, trust_remote_code=False, out=None,
          log=print, select_measured=0, select_seq_len=None, select_text=None):
    """Plans over a range of --avg-bits budgets, each (with `select_measured` windows, of `select_text` if given)
    chosen by measurement as `plan` chooses, and with `validate` each measured beside the menu's uniform
    configurations on unseen windows.
    Returns (sweep table, output directory)."""
    from .planning.sweep import run_sweep

    return run_sweep(profile_dir, avg_bits=avg_bits, target=target, objective=objective, robust=robust,
                     vllm_gpu=vllm_gpu, llamacpp_build=llamacpp_build, context_len=context_len, validate=validate,
                     uniform=uniform, windows=windows, seq_len=seq_len, select_measured=select_measured,
                     select_seq_len=select_seq_len, select_text=select_text,
                     model_options=_model_options(model, device, dtype, device_map, trust_remote_code), out=out,
                     log=log)


# ---------------------------------------------------------------- validate, export, generate, evaluate


@dataclass(frozen=True)
class Validation:
    table: object  # DataFrame: the plan and each reference configuration, per validation length
    note: str | None  # set when the plan's advantage over uniform vanishes at a longer length
    path: str


def validate(plan_path: str, *, model=None, windows=None, seq_len=None, device="auto", dtype=None, device_map=None,
             trust_remote_code=False, out=None, engine=None, engine_python=None, text=None, log=print) -> Validation:
    """Apply the whole plan on windows the profile did not use, at the profile's length and 4x it (or
    `seq_len`, a length or a list), beside uniform configurations; the table is written to `out` (default
    <plan>.validation.csv). With `engine` ("vllm" or "llamacpp"), run the plan as exported in that engine instead
    and compare it with sensprof's emulation on the same tokens (default out: <plan>.engine-<engine>.csv). With
    `text` (files), on windows of that text instead of the profile's unseen windows."""
    import pandas as pd

    from .artifacts import load_plan
    from .files import atomic_write_text, check_writable
    from .models import load_for_plan
    from .validation.validate import (advantage_note, check_plan_text, format_table, validate_plan, validation_lengths,
                           validation_windows)

    if windows is not None and windows < 1:
        raise SensprofError(f"--windows {windows} is too few; use at least 1, or leave --windows out for as many as "
                            "profiled")
    if engine_python is not None and engine is None:
        raise SensprofError("--engine-python names the Python that runs an engine, and no --engine was given; pass "
                            "--engine vllm or --engine llamacpp, or drop --engine-python")
    result = load_plan(plan_path)
    check_plan_text(result)  # a text file the plan records, refused before the model loads or anything is read
    user_text = None
    if text:
        from .validation.validate import read_user_text

        chosen_on = result.solver.select or {}
        user_text = read_user_text(result.profile.settings.get("text_digest"), text,  # before the model loads
                                   chosen_digest=chosen_on.get("text_digest"))
        shown = ", ".join(os.path.relpath(f) for f in user_text.files[:5])
        log(f"text: {user_text.name}, {len(user_text.files)} file(s) read: {shown}"
            + (", ..." if len(user_text.files) > 5 else ""))
    suffix = f".engine-{engine}.csv" if engine else ".validation.csv"
    out = out or os.path.splitext(plan_path)[0] + suffix
    check_writable(out, "--out", "file")
    engine_log = os.path.splitext(out)[0] + ".log"  # the engine's output, written only when it failed
    if engine is not None:
        from .engines.run.python import find_engine_python
        from .validation.validate_engine import check_engine_for_plan

        engine_at = find_engine_python(engine, engine_python)
        runs = check_engine_for_plan(engine, result, engine_at)  # before loading: each refusal costs nothing
        dtype = dtype or "float32"  # the engine serves the float32 weights sensprof measures
    loaded = load_for_plan(result, model, device, dtype, device_map, trust_remote_code)
    frames = []
    lengths = validation_lengths(result, seq_len, loaded.model)
    baselines_at: dict[int, dict] = {}  # length -> its uniform baselines
    if engine is None and (result.target == "sensprof" or result.layer_dtypes):  # every uniform setting the target
        # stores in the plan's budget (a per-layer vLLM plan: each dtype the plugin serves, on every layer), ranked by
        # a screen at each length judged; lengths that share a screen length screen once
        from .validation.baselines import screen_length

        screen_at = {n: screen_length(n, max(lengths)) for n in lengths}
        by_tokens = {t: _screened_baselines(result, loaded, t, user_text, log) for t in sorted(set(screen_at.values()))}
        baselines_at = {n: by_tokens[t] for n, t in screen_at.items()}
    for n in lengths:
        baselines = baselines_at.get(n)
        if engine is not None:
            from .validation.validate_engine import format_engine_table, validate_with_engine

            ids = validation_windows(result, loaded.tokenizer, windows, n, user_text)
            family = len(lengths) * sum(r.plan is not None for r in runs)  # rows judged at once
            df = pd.DataFrame(validate_with_engine(engine_at, runs, loaded, ids, engine_log, family)).assign(seq_len=n)
            log(f"{engine} ({df.engine.iloc[0]}, run by {engine_at.python}) vs sensprof's emulation, {ids.shape[0]} "
                f"unseen windows of {n} tokens:")
            log(format_engine_table(df))
            log(plan_prediction_line(result, df, n, "engine_kl"))
        else:
            df = validate_plan(result, loaded, windows, n, text=user_text, baselines=baselines).assign(
                seq_len=n, **({"text": user_text.name, "text_digest": user_text.digest(loaded.tokenizer)}
                              if user_text else {}))
            where = f"windows of {user_text.name}" if user_text else "unseen windows"
            log(f"measured on {windows if windows is not None else result.profile.settings['windows']} {where} of {n} "
                "tokens:")
            log(format_table(df))
            if result.predicted.joint_factor:
                log(f"(the plan's pred KL is its per-layer sum times {result.predicted.joint_factor_at(n):g}, the "
                    "joint damage plan --select-measured measured on its own windows)")
            log(plan_prediction_line(result, df, n, "measured_kl"))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    atomic_write_text(out, df.to_csv(index=False))
    note = None if engine else advantage_note(df)
    if engine is not None and not df.agrees.all():
        from .validation.validate_engine import FALSE_ALARM, KL_REL_TOL

        note = (f"note: {engine} and sensprof's emulation disagree beyond the bounds (KL within "
                f"{KL_REL_TOL:.0%} or its noise, mean dNLL within its noise; {FALSE_ALARM:.0%} false alarms) for: "
                + ", ".join(f"{r.config} at {r.seq_len}" for r in df[~df.agrees].itertuples()))
    return Validation(df, note, out)


def _screened_baselines(plan, loaded, tokens: int, user_text, log) -> dict:
    """{name: layers} of the best uniform baselines of `plan`, ranked by a screen on one window of `tokens`
    (sensprof.validation.baselines)."""
    from .validation.baselines import baseline_configs, baseline_limit, best_uniforms, recorded_screen
    from .validation.validate import plan_reads, validation_windows

    short = validation_windows(plan, loaded.tokenizer, 1, tokens, user_text)
    known = None if user_text else recorded_screen(plan, int(short.shape[1]))  # the selection's, reused
    chosen, _, _ = best_uniforms(loaded.model, short, plan, limit=baseline_limit(plan), reads=plan_reads(plan),
                                 log=log, known=known)
    return baseline_configs(plan, chosen)


def plan_prediction_line(plan, df, n: int, measured: str) -> str:
    """What `plan` and `export` print for the plan, priced at this length, beside what was measured here (`measured`:
    the column of validate's table, `engine_kl` for an engine's). An engine reads every token (`all`), where the
    plan's sum holds at every length; validate's own table gives the plan's sum priced at n (`per_layer_sum`, or
    `predicted_kl` over the joint factor it applied)."""
    import math

    from .planning.prediction import for_plan

    if not (df.config == "plan").any():
        return "no plan row in this table, so no printed prediction to compare"
    row = df[df.config == "plan"].iloc[0]
    if measured == "engine_kl":
        total = math.nan  # the plan's own KL sum (prediction.kl_sum)
    elif "per_layer_sum" in df:
        total = float(row.per_layer_sum)
    else:
        total = float(row.predicted_kl) / (plan.predicted.joint_factor_at(n) or 1.0)
    p = for_plan(plan, n, total if math.isfinite(total) else None,  # NaN: the profile was not there, or an engine
                 engine=measured == "engine_kl")
    if p is None:
        return (f"plan at {n} tokens: measured KL {row[measured]:.2e}; no printed prediction to compare (its objective "
                f"is {plan.predicted.objective}, or its profile is not there to price it at {n} tokens)")
    return f"plan: {p.describe()}; measured here {row[measured]:.2e}, {row[measured] / p.kl:.2f}x it"


def export(plan_path: str, *, format: str, model=None, gpu_mem_gib=80.0, vllm_version=None, vllm_gpu=None,
           hub_id=None, write_checkpoint=None, scales_out=None, tp=1, device="cpu", dtype=None, device_map=None,
           trust_remote_code=False) -> str:
    """A ready serving command line for the plan, with comments (and scale files or a checkpoint)."""
    from .artifacts import load_plan
    from .export import ExportOptions, export_plan
    from .export.vllm import DEFAULT_VERSION
    from .models import load_for_plan

    result = load_plan(plan_path)
    opts = ExportOptions(format=format, model=model, gpu_mem_gib=gpu_mem_gib, vllm_version=vllm_version or
                         DEFAULT_VERSION, vllm_gpu=vllm_gpu, hub_id=hub_id, write_checkpoint=write_checkpoint,
                         scales_out=scales_out, tp=tp)
    # on the CPU by default: checks and checkpoints need the weights, not speed (a GGUF model is dequantized)
    return export_plan(result, opts, lambda: load_for_plan(result, model, device, dtype, device_map,
                                                           trust_remote_code, quiet=True))


def generate(plan_path: str, prompts, *, model=None, max_new_tokens=64, sample=False, seed=0, kernels="auto",
             device="auto", dtype=None, device_map=None, trust_remote_code=False) -> dict:
    """Generate through the plan's packed quantized cache: texts, cache bytes, tokens/s."""
    from .artifacts import load_plan
    from .models import load_for_plan
    from .runtime.generate import check_prompts, generate_with_plan

    if max_new_tokens < 1:
        raise SensprofError("--max-new-tokens must be at least 1")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    check_prompts(prompts)  # before loading anything
    result = load_plan(plan_path)
    loaded = load_for_plan(result, model, device, dtype, device_map, trust_remote_code)
    return generate_with_plan(loaded.model, loaded.tokenizer, result, prompts, max_new_tokens, sample, seed,
                              kernels=kernels)


def evaluate(plan_path: str, *, model=None, task="retrieval", lengths="1k,2k,4k", depths="0.1,0.5,0.9", seeds=3,
             chunk=512, uniform="auto", text=None, seq_len=1024, windows=2, seed=0, device="auto", dtype=None,
             device_map=None, trust_remote_code=False, out=None, quiet=False, progress=None):
    """Long-context retrieval/passkey accuracy (and perplexity on `text`) through the runtime cache, beside the
    baseline and uniform configurations; the table is written to `out` (default <plan>.eval-<task>.csv).
    Returns (table, path)."""
    from .artifacts import load_plan
    from .evaluate.run import evaluate as run_evaluation
    from .evaluate.run import use_sdpa
    from .evaluate.tasks import TASKS, parse_depths, parse_lengths
    from .files import atomic_write_text, check_writable
    from .models import load_for_plan

    if task not in TASKS:
        raise SensprofError(f"unknown --task {task!r}; use one of {', '.join(TASKS)}")
    lengths, depths = parse_lengths(lengths), parse_depths(depths)
    if seeds < 1:
        raise SensprofError(f"--seeds {seeds} is too few; use at least 1")
    if chunk < 1:
        raise SensprofError(f"--chunk {chunk} is too small; use a positive number of tokens, e.g. 512")
    if uniform not in ("auto", "all", "none"):
        raise SensprofError(f"--uniform {uniform!r} is not one of auto, all, none")
    if text and windows < 1:
        raise SensprofError("--windows must be at least 1")
    result = load_plan(plan_path)
    out = out or os.path.splitext(plan_path)[0] + f".eval-{task}.csv"
    check_writable(out, "--out", "file")
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
        loaded = load_for_plan(result, model, device, dtype, device_map, trust_remote_code)  # quiet: no GGUF bar
    use_sdpa(loaded.model)
    ppl_ids = None
    if text:
        ppl_ids = select_windows(loaded.tokenizer, [text] if isinstance(text, str) else text, seq_len, windows,
                                 seed)[0]
    df = run_evaluation(loaded.model, loaded.tokenizer, result, task, lengths, depths, seeds, chunk, uniform,
                        ppl_ids, progress)
    atomic_write_text(out, df.to_csv(index=False))
    return df, out


def lm_eval(plan_path: str, *, tasks, include=None, limit=None, num_fewshot=None, chunk=512, uniform="auto",
            kernels="auto", model=None, device="auto", dtype=None, device_map=None, trust_remote_code=False, out=None,
            quiet=False, progress=None, truncate=False):
    """lm-evaluation-harness `tasks` (names or patterns; `include`: directories of your own YAML tasks) through
    the runtime cache for the baseline, the plan and the uniform configurations of equal memory; one comparison
    table is written to `out` (default <plan>.lm-eval.csv). A request longer than the model's positions is refused,
    or with `truncate` cut from the left with a warning. Needs `pip install 'sensprof[eval]'`.
    Returns (table, path)."""
    from .artifacts import load_plan
    from .evaluate.lm_eval_run import parse_tasks, require_lm_eval, run_lm_eval, task_manager
    from .evaluate.run import use_sdpa
    from .files import atomic_write_text, check_writable
    from .models import load_for_plan

    require_lm_eval()
    names = parse_tasks(tasks)
    if limit is not None and not limit > 0:
        raise SensprofError(f"--lm-eval-limit {limit:g} is too small; use a number of documents per task, e.g. 100")
    if limit is not None and limit >= 1:
        limit = int(limit)  # lm-eval reads a limit below 1 as a share of each task's documents
    if num_fewshot is not None and num_fewshot < 0:
        raise SensprofError(f"--num-fewshot {num_fewshot} is negative; use 0 or more")
    if chunk < 1:
        raise SensprofError(f"--chunk {chunk} is too small; use a positive number of tokens, e.g. 512")
    if uniform not in ("auto", "all", "none"):
        raise SensprofError(f"--uniform {uniform!r} is not one of auto, all, none")
    result = load_plan(plan_path)
    out = out or os.path.splitext(plan_path)[0] + ".lm-eval.csv"
    check_writable(out, "--out", "file")
    tm = task_manager(names, include)  # unknown tasks fail before the model loads
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
        loaded = load_for_plan(result, model, device, dtype, device_map, trust_remote_code)
    use_sdpa(loaded.model)
    df = run_lm_eval(loaded.model, loaded.tokenizer, result, names, tm, limit, num_fewshot, chunk, uniform, kernels,
                     progress, quiet, truncate)
    atomic_write_text(out, df.to_csv(index=False))
    return df, out


# ---------------------------------------------------------------- profiles: merge, summary, report


def merge(dirs, out: str) -> dict:
    """Join profiles of the same model and settings computed for different layers; returns the merged meta."""
    from .profiling.table import merge_profiles

    return merge_profiles(list(dirs), out)


def summary(profile_dir: str) -> str:
    from .summary import summarize
    from .profiling.table import load_profile

    return summarize(load_profile(profile_dir))


def report(profile_dir: str, *, out: str, plans=(), sweeps=(), metric="kl", reference_scheme=None) -> list[str]:
    """Figures (PNG) and one self-contained HTML page; returns the written paths, the page last."""
    from .report import write_report

    return write_report(profile_dir, out, list(plans), list(sweeps), metric, reference_scheme)


def schemes(*, target=None, vllm_gpu=None) -> str:
    """The scheme registry with each scheme's storage cost; with target "vllm", every vLLM KV dtype instead."""
    if target is not None:
        if target != "vllm":
            raise SensprofError(f"`sensprof schemes --target` lists vLLM's dtypes; got {target!r}, pass vllm")
        from .scheme_tables import describe_dtypes

        return describe_dtypes(vllm_gpu)
    if vllm_gpu is not None:
        raise SensprofError("--vllm-gpu needs --target vllm")
    from .scheme_tables import describe_schemes

    return describe_schemes()
