"""The work behind `plan`, `sweep`, `validate` and `export` (cli.py only parses arguments)."""

from __future__ import annotations

import os
import re

from .errors import SensprofError
from .plan import Plan, build_plan, load_plan


def make_plan(profile_dir: str, target: str, budget, objective: str = "kl", num_skip=None, vllm_gpu=None,
              llamacpp_build=None, robust: float = 0.0) -> Plan:
    from .planner import plan, problem_from_table
    from .table import load_profile
    from .targets import get_target

    get_target(target, vllm_gpu, llamacpp_build)  # a bad target or option fails before the profile is read
    profile = load_profile(profile_dir, require_complete=True)
    tgt = get_target(target, vllm_gpu, llamacpp_build, {layer["head_dim"] for layer in profile.meta["layers"]})
    problem = problem_from_table(current_cells(profile), profile.meta["layers"], objective, robust)
    solution = plan(problem, tgt, budget, num_skip)
    result = build_plan(profile, solution, target, objective, budget)
    if robust:
        result.solver["robust"] = robust
    if target == "vllm" and budget.kind == "serving":
        check_vllm_pool(result, budget)
    return result


def check_vllm_pool(plan: Plan, budget) -> None:
    """The planner prices each layer's own bytes; vLLM's pool also aligns block sizes and pads pages when skipped
    and quantized layers share it (hybrid sliding-window models). Record what vLLM would need and say if it is more."""
    import sys

    from .engines.vllm import facts
    from .export.vllm import vllm_layers

    layers = vllm_layers(plan)
    if not layers:
        return
    pool = facts.plan_pool(layers)
    need = pool.blocks_per_request(budget.max_model_len) * budget.max_num_seqs * pool.bytes_per_block
    plan.predicted["vllm_pool_bytes"] = need
    if need > budget.value * 2**30:
        print(f"sensprof: note: vLLM's pool needs {need / 2**30:.4g} GiB for this plan ({budget.max_num_seqs} x "
              f"{budget.max_model_len} tokens, its block alignment and page padding included), more than "
              f"--gpu-mem-gib {budget.value:g}; give vLLM that much, or plan with a smaller --gpu-mem-gib",
              file=sys.stderr)


def current_cells(profile):
    """The profile's rows, less those a since-corrected emulation measured (schemes.REVISIONS), said once."""
    import sys

    from .schemes import scheme_revision

    recorded = profile.meta.get("schemes", {})
    stale = sorted(n for n in set(profile.table.scheme)
                   if recorded.get(n, {}).get("revision", 1) < scheme_revision(n))
    if stale:
        print(f"sensprof: note: ignoring {', '.join(stale)}: this profile measured them with an earlier emulation; "
              "re-profile them (`sensprof profile --schemes ...` into a new --out) to plan with them", file=sys.stderr)
    return profile.table[~profile.table.scheme.isin(stale)]


def plan_path(plan: Plan) -> str:
    b = plan.budget
    tag = {"avg_bits": f"{b['value']:g}bits", "fraction": f"{b['value']:g}frac"}.get(
        b["kind"], f"{b['value']:g}GiB-{b['max_model_len']}x{b['max_num_seqs']}")
    if b.get("context_len"):
        tag += f"-at{b['context_len']}"
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(plan.model_id.rstrip("/")).removesuffix(".gguf"))
    return os.path.join("plans", f"{model}-{plan.target}-{tag}.json")


def describe_plan(plan: Plan) -> str:
    p = plan.predicted
    lines = [f"plan for {plan.model_id} -> target {plan.target}: {p['avg_bits']:.2f} bits/element "
             f"({p['fraction_of_bf16']:.3f} of bf16, {p['bytes_per_token']:,.0f} bytes/token"
             + (f"; {p['avg_bits_at_context']:.2f} held at {p['context_len']} tokens" if p.get("context_len") else "")
             + "), predicted "
             f"{plan.objective} {p['damage']:.3e}; solver {plan.solver['status']} in {plan.solver['time_s']:.2f} s"]
    if plan.engine:
        lines.append("engine: " + ", ".join(f"{k}={v}" for k, v in plan.engine.items()))
    lines.append("layer kind     K scheme             V scheme")
    for layer in plan.layers:
        lines.append(f"{layer.layer:>5} {layer.kind:<8} {layer.k_scheme:<20} {layer.v_scheme:<20}")
    return "\n".join(lines)


def _load_for_plan(plan: Plan, model: str | None, device: str = "auto", dtype: str | None = None):
    from .models import describe_layers, fingerprint, load_model

    loaded = load_model(model or plan.model_id, device, dtype)
    fp = fingerprint(loaded.model)
    if fp != plan.model_fingerprint:
        raise SensprofError(
            f"the plan was made for model fingerprint {plan.model_fingerprint} ({plan.model_id}), but "
            f"{model or plan.model_id} has fingerprint {fp}; pass the profiled model with --model or re-plan")
    plan.check_layers([(i.kv_heads, i.head_dim) for i in describe_layers(loaded.model)], model or plan.model_id)
    return loaded


def validation_windows(plan: Plan, tokenizer, windows: int | None, seq_len: int | None):
    """Windows from the profile's text that the profile did not use."""
    from .api import select_windows

    from .data import bos_prefix, overlapping_slots

    settings = plan.profile["settings"]
    exclude = set(plan.profile.get("window_slots") or [])
    seq = seq_len or settings["seq_len"]
    if seq != settings["seq_len"]:  # other slot boundaries: leave out every window that overlaps a profiled one
        prefix = len(bos_prefix(tokenizer))
        exclude = overlapping_slots(exclude, settings["seq_len"] - prefix, seq - prefix)
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


def validation_lengths(plan: Plan, spec, model) -> list[int]:
    """--seq-len for validate: a length or a list; default the profile's length and 4x it (within the model)."""
    from .models import max_positions

    from .data import parse_seq_lens

    own = int(plan.profile["settings"]["seq_len"])
    limit = max_positions(model)
    if spec is None:
        longer = 4 * own if limit is None else min(4 * own, limit)
        return parse_seq_lens(f"{own},{longer}", limit)
    return parse_seq_lens(spec, limit)


def advantage_note(df) -> str | None:
    """A warning when the plan beats every uniform configuration of as much memory at the first length but not
    at a longer one."""
    ratios = {}
    for n, g in df.groupby("seq_len", sort=True):
        rich = g[g.memory_vs_plan == ">="]
        if len(rich):
            best = rich.loc[rich.measured_kl.idxmin()]
            ratios[int(n)] = (float(g[g.config == "plan"].measured_kl.iloc[0]) / float(best.measured_kl), best.config)
    if len(ratios) < 2:
        return None
    first, *rest = sorted(ratios)
    if ratios[first][0] >= 1:
        return None
    lost = [n for n in rest if ratios[n][0] >= 1]
    if not lost:
        return None
    n = lost[0]
    return (f"warning: the plan's advantage over uniform configurations of as much memory vanishes at {n} tokens: "
            f"its KL is {ratios[n][0]:.2f}x that of {ratios[n][1]} there (was {ratios[first][0]:.2f}x at {first}); "
            "profile at that length (`sensprof profile --seq-len ...`) and re-plan")


def run_validate(args) -> None:
    import pandas as pd

    from .table import atomic_write_text, check_writable
    from .validate import format_table

    plan = load_plan(args.plan)
    out = args.out or os.path.splitext(args.plan)[0] + ".validation.csv"
    check_writable(out, "--out", "file")
    loaded = _load_for_plan(plan, args.model, args.device, args.dtype)
    frames = []
    for n in validation_lengths(plan, args.seq_len, loaded.model):
        df = validate_plan(plan, loaded, args.windows, n).assign(seq_len=n)
        print(f"measured on {args.windows or plan.profile['settings']['windows']} unseen windows of {n} tokens:")
        print(format_table(df))
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    note = advantage_note(df)
    if note:
        print(note)
    atomic_write_text(out, df.to_csv(index=False))
    print(f"wrote {out}")


def _model_path(plan: Plan, model: str | None) -> str:
    """The model as an engine names it: a built-in alias becomes its .gguf file."""
    from .models import BUILTIN_MODELS, resolve_model

    name = model or plan.model_id
    if name in BUILTIN_MODELS:
        src = resolve_model(name)
        return os.path.join(src["path"], src["gguf_file"])
    return name


def _load_quietly(plan: Plan, model: str | None, dtype: str | None = None):
    """Load on the CPU without transformers' progress bars, so a refusal stays one line on stderr."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return _load_for_plan(plan, model, "cpu", dtype)
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _is_gguf(name: str) -> bool:
    from .models import BUILTIN_MODELS

    return name in BUILTIN_MODELS or name.endswith(".gguf")


def _check_export_args(args) -> None:
    from .export.checkpoint import check_checkpoint_dir
    from .export.sglang import check_tp
    from .table import check_writable

    if args.gpu_mem_gib is not None and not args.gpu_mem_gib > 0:
        raise SensprofError(f"--gpu-mem-gib must be positive, got {args.gpu_mem_gib}")
    check_tp(args.tp)
    if args.tp != 1 and args.format != "sglang":
        raise SensprofError("--tp is for --format sglang (its scales file is keyed by TP rank)")
    if args.write_checkpoint and args.format != "vllm":
        raise SensprofError("--write-checkpoint is for --format vllm; use --scales-out for sglang")
    if args.scales_out and args.format != "sglang":
        raise SensprofError("--scales-out is for --format sglang; use --write-checkpoint DIR for vllm")
    if args.hub_id is not None and args.format != "vllm":
        raise SensprofError("--hub-id is for --format vllm (sglang and llama.cpp serve the GGUF file itself)")
    if args.scales_out:
        check_writable(args.scales_out, "--scales-out", "file")
    if args.write_checkpoint:
        check_checkpoint_dir(args.write_checkpoint)


def run_export(args) -> str:
    from .export import check_format, command_line, memory_comments

    plan = load_plan(args.plan)
    check_format(plan, args.format)
    _check_export_args(args)
    name = args.model or plan.model_id
    lines = []
    model_path = _model_path(plan, args.model)
    if args.format == "vllm":
        from .export.vllm import vllm_argv

        vllm_argv(plan, "-", args.vllm_version, args.vllm_gpu)  # refuse a bad version, dtype or GPU before loading
        if args.hub_id is not None and not _is_gguf(name):
            raise SensprofError(f"--hub-id is for GGUF models; vLLM serves {name} as it is")
    loaded = None
    if args.model or (args.format == "vllm" and args.write_checkpoint):
        loaded = _load_quietly(plan, args.model)  # refuses a plan made for another model; float32 (GGUF dequantized)
    else:  # no weights loaded: at least the layer count of the model the plan names, where its config is at hand
        from .models import config_layer_count

        n = config_layer_count(name)
        if n is not None:
            plan.check_layers([None] * n, name)
    fits_line = True
    if args.format == "vllm":
        from .export.vllm import gguf_model_for_vllm, vllm_comments, vllm_layers

        if args.write_checkpoint:
            from .export.checkpoint import has_scales, write_checkpoint

            write_checkpoint(plan, loaded.model, loaded.tokenizer, args.write_checkpoint)  # saved as bf16
            model_path = args.write_checkpoint
            if has_scales(plan):
                lines.append(f"# wrote {model_path}: bf16 weights + calibrated per-layer k_scale/v_scale "
                             "(compressed-tensors kv_cache_scheme) + llmcompressor_recipe.yaml")
            else:
                lines.append(f"# wrote {model_path}: bf16 weights and tokenizer, no KV scales: vLLM quantizes "
                             f"{plan.engine.get('kv_cache_dtype')} with its own scales, so the dtype goes on the command line")
        else:
            if _is_gguf(name):
                model_path, notes = gguf_model_for_vllm(name, args.hub_id)
                lines += notes
            if plan.engine.get("needs_scales"):
                lines.append("# this plan was measured with calibrated scales: add --write-checkpoint DIR to get "
                             "them into vLLM (without them vLLM uses scale 1.0)")
        argv = vllm_argv(plan, model_path, args.vllm_version, args.vllm_gpu)
        layers = vllm_layers(plan)
        fits_line = not layers  # vLLM's pool arithmetic says what fits instead
        lines = vllm_comments(plan, args.gpu_mem_gib, layers) + lines
    elif args.format == "sglang":
        from .export.sglang import check_scales, sglang_argv, sglang_scales
        from .table import write_json

        if args.scales_out:
            from .models import model_config

            check_scales(plan)
            cfg = model_config(name)
            cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # what SGLang's text model holds
            layers = getattr(cfg, "num_hidden_layers", len(plan.layers))
            write_json(args.scales_out, sglang_scales(plan, type(cfg).model_type or cfg.model_type, layers, args.tp))
            lines.append(f"# wrote {args.scales_out}: per-layer KV scales for TP ranks 0..{args.tp - 1} "
                         "(--quantization-param-path)")
        elif plan.engine.get("needs_scales"):
            lines.append("# this plan was measured with calibrated scales: add --scales-out FILE to get them into "
                         "SGLang (without them SGLang uses scale 1.0)")
        argv = sglang_argv(plan, model_path, args.scales_out, args.tp)
    else:
        from .export.llamacpp import build_comments, llamacpp_argv

        argv = llamacpp_argv(plan, model_path)
        lines += build_comments(plan)
    return "\n".join([command_line(argv), *memory_comments(plan, args.gpu_mem_gib, fit=fits_line), *lines])


def run_generate(args) -> str:
    from .runtime.generate import check_prompts, generate_with_plan

    if args.max_new_tokens < 1:
        raise SensprofError("--max-new-tokens must be at least 1")
    check_prompts(args.prompt)  # before loading anything
    plan = load_plan(args.plan)
    loaded = _load_for_plan(plan, args.model, args.device, args.dtype)
    r = generate_with_plan(loaded.model, loaded.tokenizer, plan, args.prompt, args.max_new_tokens, args.sample,
                           args.seed, kernels=args.kernels)
    lines = [f"--- {i}: {t}" for i, t in enumerate(r["texts"])]
    lines.append(f"# cache: {r['cache_bytes']:,} bytes for {r['cache_tokens']} tokens x {len(args.prompt)} sequences; "
                 f"{r['tokens']} new tokens in {r['seconds']:.2f} s ({r['tokens_per_s']:.1f} tokens/s); "
                 f"{r['kernels']} kernels read the packed cache in {r['packed_steps']} layer-steps")
    return "\n".join(lines)
