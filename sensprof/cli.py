"""Command line: parse (cli_args.py), call sensprof.api, print; bad input becomes one line and exit code 2."""

from __future__ import annotations

import sys
import time

from . import api
from .errors import SensprofError


def _model(args) -> dict:
    """The shared model options, as every api function that loads a model takes them."""
    return {"model": args.model, "device": args.device, "dtype": args.dtype, "device_map": args.device_map,
            "trust_remote_code": args.trust_remote_code}


def cmd_profile(args) -> int:
    if args.quiet:  # the GGUF loader draws its own progress bar on stderr; errors still arrive as exceptions
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    out = args.out or api.default_profile_dir(args.model)
    prof = api.profile(**_model(args), schemes=args.schemes, k_schemes=args.k_schemes, v_schemes=args.v_schemes,
                       target=args.target, vllm_gpu=args.vllm_gpu, text=args.text, seq_len=args.seq_len,
                       windows=args.windows, seed=args.seed, layers=args.layers, out_dir=out,
                       variants_per_pass=args.variants_per_pass, kl=args.kl, screen=args.screen, naive=args.naive,
                       progress=not args.quiet, quiet_loading=args.quiet, ray=args.ray, ray_workers=args.ray_workers,
                       ray_gpus_per_worker=args.ray_gpus_per_worker, reads=args.reads,
                       menus=args.menus)
    if not args.quiet:
        from .summary import summarize

        print(summarize(prof))
        print(f"\nwrote {out}/ (profile.csv, heads.csv, windows.csv, stats.csv, calibration.json, meta.json)")
    return 0


def cmd_merge(args) -> int:
    meta = api.merge(args.dirs, args.out)
    state = "complete" if meta["complete"] else f"partial ({len(meta['layers_done'])}/{len(meta['layers'])} layers)"
    print(f"merged {len(args.dirs)} profiles into {args.out}: {state}")
    return 0


def cmd_report(args) -> int:
    paths = api.report(args.profile_dir, out=args.out, plans=args.plan, sweeps=args.sweep, metric=args.metric,
                       reference_scheme=args.reference_scheme)
    print(f"wrote {paths[-1]} and {len(paths) - 1} figures in {args.out}")
    return 0


def cmd_summary(args) -> int:
    print(api.summary(args.dir))
    return 0


def cmd_schemes(args) -> int:
    print(api.schemes(target=args.target, vllm_gpu=args.vllm_gpu))
    return 0


def cmd_plan(args) -> int:
    plan, path = api.plan(args.profile_dir, avg_bits=args.avg_bits, fraction=args.fraction,
                          gpu_mem_gib=args.gpu_mem_gib, max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs, context_len=args.context_len, target=args.target,
                          objective=args.objective, robust=args.robust, refine=args.refine, num_skip=args.num_skip,
                          select_measured=args.select_measured, select_seq_len=args.select_seq_len,
                          select_text=args.select_text, select_uniforms=args.select_uniforms,
                          per_layer=args.per_layer,
                          vllm_gpu=args.vllm_gpu, llamacpp_build=args.llamacpp_build, **_model(args),
                          out=args.out or True)
    print(plan.describe())
    if plan.target in api.SELECTABLE and not plan.solver.select:
        print("chosen by predicted damage alone: --select-measured 2 (without --num-skip) measures it beside the "
              "strongest uniform configurations of no more memory on unseen text and keeps the lowest")
    print(f"wrote {path}")
    return 0


def cmd_sweep(args) -> int:
    import pandas as pd

    df, out = api.sweep(args.profile_dir, avg_bits=args.avg_bits, target=args.target, objective=args.objective,
                        robust=args.robust, vllm_gpu=args.vllm_gpu, llamacpp_build=args.llamacpp_build,
                        context_len=args.context_len, validate=args.validate, uniform=args.uniform,
                        windows=args.windows, seq_len=args.seq_len, select_measured=args.select_measured,
                        select_seq_len=args.select_seq_len, select_text=args.select_text, **_model(args),
                        out=args.out)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(df.drop(columns=["plan"]).to_string(index=False))
    print(f"wrote {out}/sweep.csv" + (", uniform.csv" if args.validate else "") + f" and {len(df)} plans")
    return 0


def cmd_validate(args) -> int:
    result = api.validate(args.plan, **_model(args), windows=args.windows, seq_len=args.seq_len, out=args.out,
                          engine=args.engine, engine_python=args.engine_python, text=args.text)
    if result.note:
        print(result.note)
    print(f"wrote {result.path}")
    return 0


def cmd_export(args) -> int:
    print(api.export(args.plan, format=args.format, model=args.model, gpu_mem_gib=args.gpu_mem_gib,
                     vllm_version=args.vllm_version, vllm_gpu=args.vllm_gpu, hub_id=args.hub_id,
                     write_checkpoint=args.write_checkpoint, scales_out=args.scales_out, tp=args.tp,
                     device=args.device, dtype=args.dtype, device_map=args.device_map,
                     trust_remote_code=args.trust_remote_code))
    return 0


def cmd_eval(args) -> int:
    t0, c0 = time.perf_counter(), time.process_time()
    progress = None if args.quiet else (lambda msg: print(f"eval: {msg}", file=sys.stderr, flush=True))
    lm_only = [flag for flag, given in (("--lm-eval-truncate", args.lm_eval_truncate),
                                        ("--lm-eval-limit", args.lm_eval_limit is not None),
                                        ("--num-fewshot", args.num_fewshot is not None)) if given]
    if lm_only and args.lm_eval_tasks is None:  # they were silently ignored by the retrieval task
        raise SensprofError(f"{lm_only[0]} is for lm-eval tasks, and no --lm-eval-tasks was given; pass "
                            f"--lm-eval-tasks TASKS, or drop {lm_only[0]}")
    if args.lm_eval_tasks is not None:  # '' is refused as empty, not read as "no lm-eval"
        from .evaluate.lm_eval_run import format_lm_eval

        df, out = api.lm_eval(args.plan, **_model(args), tasks=args.lm_eval_tasks, include=args.lm_eval_include,
                              limit=args.lm_eval_limit, num_fewshot=args.num_fewshot, chunk=args.chunk,
                              uniform=args.uniform, out=args.out, quiet=args.quiet, progress=progress,
                              truncate=args.lm_eval_truncate)
        table = format_lm_eval(df)
        what = f"lm-eval requests, each through a fresh runtime cache (chunks of {args.chunk} tokens)"
    else:
        from .evaluate.run import format_eval

        df, out = api.evaluate(args.plan, **_model(args), task=args.task, lengths=args.lengths, depths=args.depths,
                               seeds=args.seeds, chunk=args.chunk, uniform=args.uniform, text=args.text,
                               seq_len=args.seq_len, windows=args.windows, seed=args.seed, out=args.out,
                               quiet=args.quiet, progress=progress)
        table = format_eval(df, args.seeds)
        what = f"{len(df.attrs['samples'])} samples through the runtime cache (chunks of {args.chunk} tokens)"
    print(table)
    for note in df.attrs["notes"]:
        print(f"# note: {note}")
    print(f"# {what} in {time.perf_counter() - t0:.1f} s wall ({time.process_time() - c0:.1f} s CPU), model loading "
          "included")
    print(f"wrote {out}")
    return 0


def cmd_generate(args) -> int:
    r = api.generate(args.plan, args.prompt, **_model(args), max_new_tokens=args.max_new_tokens,
                     sample=args.sample, seed=args.seed, kernels=args.kernels)
    for i, text in enumerate(r["texts"]):
        print(f"--- {i}: {text}")
    print(f"# cache: {r['cache_bytes']:,} bytes for {r['cache_tokens']} tokens x {len(args.prompt)} sequences; "
          f"{r['tokens']} new tokens in {r['seconds']:.2f} s ({r['tokens_per_s']:.1f} tokens/s); "
          f"{r['kernels']} kernels read the packed cache in {r['packed_steps']} layer-steps")
    return 0


COMMANDS = {"profile": cmd_profile, "merge": cmd_merge, "summary": cmd_summary, "report": cmd_report,
            "schemes": cmd_schemes, "plan": cmd_plan, "sweep": cmd_sweep, "validate": cmd_validate,
            "export": cmd_export, "eval": cmd_eval, "generate": cmd_generate}


def _terminated(signum, frame):
    """SIGTERM ends a run as Ctrl-C does: cleanups run (the folder's lock, temporary files, a Ray cluster this
    run started), and the same command resumes."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    import signal
    import threading

    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main else None
    try:
        return _main(argv)
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


RESUMABLE = {"profile"}  # the commands that keep their finished work on disk and take it up again


def _main(argv=None) -> int:
    from .cli_args import build_parser

    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        return COMMANDS[args.command](args)
    except SensprofError as e:
        _end_progress_bars()
        print(f"sensprof: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _end_progress_bars()
        command = getattr(args, "command", None)
        print("sensprof: interrupted; " + ("run the same command again to resume" if command in RESUMABLE else
                                          f"`sensprof {command or ''}` does not resume: run it again"),
              file=sys.stderr)
        return 130
    except MemoryError:
        _end_progress_bars()
        print("sensprof: error: out of memory; use fewer --windows, a shorter --seq-len or --variants-per-pass 1",
              file=sys.stderr)
        return 2
    except Exception as e:  # out-of-memory on a GPU surfaces as a RuntimeError subclass
        if type(e).__name__ == "OutOfMemoryError":
            _end_progress_bars()
            print("sensprof: error: GPU out of memory; use fewer --windows, a shorter --seq-len or "
                  "--variants-per-pass 1", file=sys.stderr)
            return 2
        raise


def _end_progress_bars() -> None:
    """Close the progress bars an error left open (ours, or a library's loop the error broke out of), so the error
    line starts on a line of its own instead of after a half-drawn bar."""
    tqdm = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", ())):
        try:
            bar.close()
        except Exception:  # a bar whose file is gone: nothing of it is on the terminal to end
            pass


if __name__ == "__main__":
    sys.exit(main())
