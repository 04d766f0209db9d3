"""The work behind `plan`, `sweep`, `validate` and `export` (cli.py only parses arguments)."""

from __future__ import annotations

import os
import re

from .errors import SensprofError
from .plan import Plan, build_plan, load_plan


def make_plan(profile_dir: str, target: str, budget, objective: str = "kl", num_skip=None) -> Plan:
    from .planner import plan, problem_from_table
    from .table import load_profile
    from .targets import get_target

    tgt = get_target(target)
    profile = load_profile(profile_dir, require_complete=True)
    problem = problem_from_table(profile.table, profile.meta["layers"], objective)
    solution = plan(problem, tgt, budget, num_skip)
    return build_plan(profile, solution, target, objective, budget)


def plan_path(plan: Plan) -> str:
    b = plan.budget
    tag = {"avg_bits": f"{b['value']:g}bits", "fraction": f"{b['value']:g}frac"}.get(
        b["kind"], f"{b['value']:g}GiB-{b['max_model_len']}x{b['max_num_seqs']}")
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(plan.model_id.rstrip("/")).removesuffix(".gguf"))
    return os.path.join("plans", f"{model}-{plan.target}-{tag}.json")


def describe_plan(plan: Plan) -> str:
    p = plan.predicted
    lines = [f"plan for {plan.model_id} -> target {plan.target}: {p['avg_bits']:.2f} bits/element "
             f"({p['fraction_of_bf16']:.3f} of bf16, {p['bytes_per_token']:,.0f} bytes/token), predicted "
             f"{plan.objective} {p['damage']:.3e}; solver {plan.solver['status']} in {plan.solver['time_s']:.2f} s"]
    if plan.engine:
        lines.append("engine: " + ", ".join(f"{k}={v}" for k, v in plan.engine.items()))
    lines.append("layer kind     K scheme             V scheme")
    for layer in plan.layers:
        lines.append(f"{layer.layer:>5} {layer.kind:<8} {layer.k_scheme:<20} {layer.v_scheme:<20}")
    return "\n".join(lines)


def _load_for_plan(plan: Plan, model: str | None, device: str = "auto", dtype: str | None = None):
    from .models import fingerprint, load_model

    loaded = load_model(model or plan.model_id, device, dtype)
    fp = fingerprint(loaded.model)
    if fp != plan.model_fingerprint:
        raise SensprofError(
            f"the plan was made for model fingerprint {plan.model_fingerprint} ({plan.model_id}), but "
            f"{model or plan.model_id} has fingerprint {fp}; pass the profiled model with --model or re-plan")
    return loaded


def validation_windows(plan: Plan, tokenizer, windows: int | None, seq_len: int | None):
    """Windows from the profile's text that the profile did not use."""
    from .api import select_windows

    settings = plan.profile["settings"]
    exclude = set(plan.profile.get("window_slots") or [])
    seq = seq_len or settings["seq_len"]
    if seq != settings["seq_len"]:
        exclude = set()  # other slot boundaries: the profiled windows cannot be excluded by slot
    ids, _, _, _ = select_windows(tokenizer, plan.profile.get("text_files"), seq,
                                  windows or settings["windows"], settings["seed"] + 1, exclude)
    return ids


def validate_plan(plan: Plan, loaded, windows=None, seq_len=None, progress=None):
    """Measured table of the plan beside the reference configurations."""
    from .table import load_profile
    from .validate import measure, reference_configs, validation_table

    ids = validation_windows(plan, loaded.tokenizer, windows, seq_len)
    configs = {"plan": plan.layers, **reference_configs(plan)}
    measured = measure(loaded.model, ids, configs, progress)
    table = None
    path = plan.profile.get("path")
    if path and os.path.isdir(path):
        table = load_profile(path).table
    return validation_table(plan, measured, configs, table)


def run_validate(args) -> None:
    from .table import atomic_write_text
    from .validate import format_table

    plan = load_plan(args.plan)
    loaded = _load_for_plan(plan, args.model, args.device, args.dtype)
    df = validate_plan(plan, loaded, args.windows, args.seq_len)
    print(format_table(df))
    out = args.out or os.path.splitext(args.plan)[0] + ".validation.csv"
    atomic_write_text(out, df.to_csv(index=False))
    print(f"wrote {out}")


def run_sweep(args) -> None:
    import pandas as pd

    from .budget import Budget
    from .table import atomic_write_text, load_profile

    try:
        budgets = [float(x) for x in str(args.avg_bits).split(",") if x.strip()]
    except ValueError:
        raise SensprofError(f"--avg-bits {args.avg_bits!r} is not a comma-separated list of numbers; e.g. 3,4,6") from None
    if not budgets:
        raise SensprofError("--avg-bits needs at least one budget, e.g. 3,4,6")
    profile = load_profile(args.profile_dir, require_complete=True)
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", str(profile.meta["model"]["id"]).removesuffix(".gguf"))
    out = args.out or os.path.join("plans", f"sweep-{os.path.basename(model)}-{args.target}")
    rows, plans = [], []
    for b in sorted(budgets):
        try:
            plan = make_plan(args.profile_dir, args.target, Budget("avg_bits", b), args.objective)
        except SensprofError as e:
            if "infeasible" in str(e):
                print(f"--avg-bits {b:g}: infeasible for {args.target}")
                continue
            raise
        path = os.path.join(out, f"plan-{b:g}bits.json")
        plan.save(path)
        plans.append((path, plan))
        rows.append({"budget_avg_bits": b, "avg_bits": plan.predicted["avg_bits"],
                     "fraction_of_bf16": plan.predicted["fraction_of_bf16"],
                     "predicted_damage": plan.predicted["damage"], "engine": plan.engine_summary(), "plan": path})
    if not rows:
        raise SensprofError(f"every budget was infeasible for target {args.target}; try larger --avg-bits")
    df = pd.DataFrame(rows)
    best = float("inf")
    frontier = []
    for r in df.sort_values("avg_bits").itertuples():  # non-dominated: less damage than any cheaper plan
        frontier.append(r.predicted_damage < best - 1e-18)
        best = min(best, r.predicted_damage)
    df = df.sort_values("avg_bits").assign(frontier=frontier)
    if args.validate:
        loaded = _load_for_plan(plans[0][1], None, args.device)
        from .validate import measure

        measured_kl, dppl = [], []
        for r in df.itertuples():
            plan = load_plan(r.plan)
            m = measure(loaded.model, validation_windows(plan, loaded.tokenizer, args.windows, None),
                        {"plan": plan.layers})["plan"]
            measured_kl.append(m["kl"])
            dppl.append(m["dppl"])
        df = df.assign(measured_kl=measured_kl, dppl=dppl)
    atomic_write_text(os.path.join(out, "sweep.csv"), df.to_csv(index=False))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(df.drop(columns=["plan"]).to_string(index=False))
    print(f"wrote {out}/sweep.csv and {len(rows)} plans")


def _model_path(plan: Plan, model: str | None) -> str:
    from .models import BUILTIN_MODELS, resolve_model

    name = model or plan.model_id
    if name in BUILTIN_MODELS:
        src = resolve_model(name)
        return os.path.join(src["path"], src["gguf_file"])
    return name


def run_export(args) -> str:
    from .export import check_format, command_line, memory_comments

    plan = load_plan(args.plan)
    check_format(plan, args.format)
    if args.gpu_mem_gib is not None and not args.gpu_mem_gib > 0:
        raise SensprofError(f"--gpu-mem-gib must be positive, got {args.gpu_mem_gib}")
    lines = []
    model_path = _model_path(plan, args.model)
    if args.write_checkpoint:
        if args.format != "vllm":
            raise SensprofError("--write-checkpoint is for --format vllm; use --scales-out for sglang")
        from .export.checkpoint import write_checkpoint

        loaded = _load_for_plan(plan, args.model, "cpu")
        write_checkpoint(plan, loaded.model, loaded.tokenizer, args.write_checkpoint)
        model_path = args.write_checkpoint
        lines.append(f"# wrote {args.write_checkpoint}: weights + calibrated per-layer k_scale/v_scale "
                     "(compressed-tensors kv_cache_scheme) + llmcompressor_recipe.yaml")
    elif args.model:
        _load_for_plan(plan, args.model, "cpu")  # refuse a plan made for another model
    if args.format == "vllm":
        from .export.vllm import vllm_argv

        argv = vllm_argv(plan, model_path, args.vllm_version)
        if model_path.endswith(".gguf"):
            lines.append("# vLLM reads GGUF weights but needs the original tokenizer: add --tokenizer <hub id>, "
                         "e.g. HuggingFaceTB/SmolLM2-135M-Instruct for smollm2-135m")
        if plan.engine.get("needs_scales") and not args.write_checkpoint:
            lines.append("# this plan was measured with calibrated scales: add --write-checkpoint DIR to get them "
                         "into vLLM (without them vLLM uses scale 1.0)")
    elif args.format == "sglang":
        from .export.sglang import sglang_argv, sglang_scales
        from .table import write_json

        scales = args.scales_out
        if scales:
            write_json(scales, sglang_scales(plan))
            lines.append(f"# wrote {scales}: per-layer KV scales (--quantization-param-path)")
        argv = sglang_argv(plan, model_path, scales)
    else:
        from .export.llamacpp import llamacpp_argv

        argv = llamacpp_argv(plan, model_path)
    return "\n".join([command_line(argv), *memory_comments(plan, args.gpu_mem_gib), *lines])


def run_generate(args) -> str:
    from .runtime.generate import generate_with_plan

    if args.max_new_tokens < 1:
        raise SensprofError("--max-new-tokens must be at least 1")
    plan = load_plan(args.plan)
    loaded = _load_for_plan(plan, args.model, args.device, args.dtype)
    r = generate_with_plan(loaded.model, loaded.tokenizer, plan, args.prompt, args.max_new_tokens, args.sample,
                           args.seed, kernels=args.kernels)
    lines = [f"--- {i}: {t}" for i, t in enumerate(r["texts"])]
    lines.append(f"# cache: {r['cache_bytes']:,} bytes for {r['cache_tokens']} tokens x {len(args.prompt)} sequences; "
                 f"{r['tokens']} new tokens in {r['seconds']:.2f} s ({r['tokens_per_s']:.1f} tokens/s); "
                 f"{r['kernels']} kernels read the packed cache in {r['packed_steps']} layer-steps")
    return "\n".join(lines)
