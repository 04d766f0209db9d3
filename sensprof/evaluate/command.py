"""The work behind `sensprof eval` (cli.py only parses arguments)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time

from ..errors import SensprofError


def default_out(plan_path: str, task: str) -> str:
    return os.path.splitext(plan_path)[0] + f".eval-{task}.csv"


def run_eval(args) -> str:
    from ..commands import _load_for_plan
    from ..plan import load_plan
    from ..table import atomic_write_text
    from .run import evaluate, format_eval
    from .tasks import TASKS, parse_depths, parse_lengths

    t0, c0 = time.perf_counter(), time.process_time()
    if args.task not in TASKS:
        raise SensprofError(f"unknown --task {args.task!r}; use one of {', '.join(TASKS)}")
    lengths, depths = parse_lengths(args.lengths), parse_depths(args.depths)
    if args.seeds < 1:
        raise SensprofError(f"--seeds {args.seeds} is too few; use at least 1")
    if args.chunk < 1:
        raise SensprofError(f"--chunk {args.chunk} is too small; use a positive number of tokens, e.g. 512")
    if args.uniform not in ("auto", "all", "none"):
        raise SensprofError(f"--uniform {args.uniform!r} is not one of auto, all, none")
    if args.text and args.windows < 1:
        raise SensprofError("--windows must be at least 1")
    plan = load_plan(args.plan)
    with contextlib.redirect_stderr(io.StringIO()) if args.quiet else contextlib.nullcontext():
        loaded = _load_for_plan(plan, args.model, args.device, args.dtype)  # --quiet: no GGUF loading bar
    _use_sdpa(loaded.model)
    ppl_ids = None
    if args.text:
        from ..api import select_windows

        ppl_ids = select_windows(loaded.tokenizer, args.text, args.seq_len, args.windows, args.seed)[0]
    progress = None if args.quiet else (lambda msg: print(f"eval: {msg}", file=sys.stderr, flush=True))
    df = evaluate(loaded.model, loaded.tokenizer, plan, args.task, lengths, depths, args.seeds, args.chunk,
                  args.uniform, ppl_ids, progress)
    out = args.out or default_out(args.plan, args.task)
    atomic_write_text(out, df.to_csv(index=False))
    lines = [format_eval(df, args.seeds)]
    lines += [f"# note: {n}" for n in df.attrs["notes"]]
    lines.append(f"# {len(df.attrs['samples'])} samples through the runtime cache (chunks of {args.chunk} tokens) in "
                 f"{time.perf_counter() - t0:.1f} s wall ({time.process_time() - c0:.1f} s CPU), model loading included")
    lines.append(f"wrote {out}")
    return "\n".join(lines)


def _use_sdpa(model) -> None:
    """load_model picks eager attention (the profiler reads attention weights); eval reads none, and PyTorch's
    fused attention is faster and lighter at long context. Keep eager where a model does not support it."""
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError, AttributeError):
        pass
