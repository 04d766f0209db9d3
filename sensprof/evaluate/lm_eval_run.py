"""`sensprof eval --lm-eval-tasks`: lm-evaluation-harness tasks through the runtime cache for the baseline, the
plan and the uniform configurations of equal memory, gathered into one comparison table.

lm-eval is optional (`pip install 'sensprof[eval]'`); nothing here imports it before `require_lm_eval` has said,
in one line, how to get it. Tasks are checked against lm-eval's index before the model loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import time
from collections.abc import Callable

from ..errors import SensprofError
from .lm_eval_quiet import quiet_lm_eval

COLUMNS = ["config", "kind", "avg_bits", "cache_bytes_per_token", "task", "metric", "filter", "value", "stderr",
           "samples", "seconds"]
MIN_VERSION = (0, 4)


def require_lm_eval():
    """The lm_eval package, or a one-line error naming the extra that installs it."""
    try:
        import lm_eval
    except ImportError:
        raise SensprofError("lm-evaluation-harness is not installed; pip install 'sensprof[eval]' "
                            "(or pip install 'lm-eval>=0.4')") from None
    version = getattr(lm_eval, "__version__", "0")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < MIN_VERSION:
        raise SensprofError(f"lm-eval {version} is too old; pip install 'sensprof[eval]' (lm-eval >= 0.4)")
    return lm_eval


def parse_tasks(tasks) -> list[str]:
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    if not names:
        raise SensprofError("--lm-eval-tasks needs at least one task name, e.g. gsm8k or hellaswag,arc_easy")
    return list(dict.fromkeys(names))


def task_manager(tasks: list[str], include=None):
    """lm-eval's TaskManager (`include` directories, plus the built-in tasks unless every name is in those),
    refusing names it does not know."""
    import difflib

    require_lm_eval()
    from lm_eval.tasks import TaskManager

    paths = [include] if isinstance(include, str) else list(include or [])
    for p in paths:
        if not os.path.isdir(p):
            raise SensprofError(f"--lm-eval-include {p!r} is not a directory; pass the folder holding your "
                                "task YAML files")
    if paths:  # your own tasks first: indexing lm-eval's ~15,000 built-in ones takes seconds
        with quiet_lm_eval():
            own = TaskManager(include_path=paths, include_defaults=False)
        if all(own.match_tasks([name]) for name in tasks):
            return own
    with quiet_lm_eval():
        tm = TaskManager(include_path=paths or None)
    known = tm.all_tasks
    for name in tasks:
        if not tm.match_tasks([name]):
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise SensprofError(f"unknown lm-eval task {name!r}; {hint}`lm-eval ls tasks` lists the {len(known)} "
                                "known ones; --lm-eval-include DIR adds your own YAML tasks")
    return tm


def _rows(results: dict) -> list[dict]:
    """One row per task (and group) x metric x filter from lm-eval's results."""
    rows = []
    samples = results.get("n-samples", {})
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, _, filt = key.partition(",")
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append({"task": task, "metric": metric, "filter": filt, "value": _number(value),
                         "stderr": _number(stderr), "samples": samples.get(task, {}).get("effective")})
    return rows


def _number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")  # lm-eval writes "N/A" where it has no stderr


def run_lm_eval(model, tokenizer, plan, tasks: list[str], tm, limit=None, num_fewshot=None, chunk: int = 512,
                uniform: str = "auto", kernels: str = "auto", progress: Callable[[str], None] | None = None,
                quiet: bool = True, truncate: bool = False):
    """Every configuration of `eval_configs` (baseline, plan, uniform of equal memory) through lm-eval.

    Returns a DataFrame (COLUMNS): one row per configuration x task x metric x filter; `cache_bytes_per_token`
    is what the runtime caches really held (all requests' bytes over all their tokens). `.attrs`: "notes".
    """
    import pandas as pd

    from ..artifacts import predicted_summary
    from .lm_eval_model import SensprofLM
    from .run import eval_configs

    lm_eval = require_lm_eval()
    configs, kinds, notes = eval_configs(plan, model, uniform)
    rows = []
    for name, layers in configs.items():
        t0 = time.perf_counter()
        quiet_output = contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext()
        with quiet_lm_eval(), quiet_output:
            lm = SensprofLM(pretrained=model, tokenizer=tokenizer, plan=dataclasses.replace(plan, layers=layers),
                            chunk=chunk, kernels=kernels, truncate="left" if truncate else None)
            results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=limit,
                                              num_fewshot=num_fewshot, log_samples=False)
        seconds = time.perf_counter() - t0
        base = {"config": name, "kind": kinds[name], "avg_bits": predicted_summary(layers)["avg_bits"],
                "cache_bytes_per_token": lm.stats.bytes_per_token(), "seconds": seconds}
        rows += [{**base, **r} for r in _rows(results)]
        if progress:
            progress(f"{name}: {', '.join(tasks)} in {seconds:.1f} s ({lm.stats.caches} requests)")
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs["notes"] = notes
    return df


def format_lm_eval(df) -> str:
    """A markdown table: one line per configuration, one column per task and metric (value ± stderr)."""
    keys = list(dict.fromkeys(zip(df.task, df.metric, df["filter"])))
    head = ["configuration", "kind", "bits", "cache bytes/token"] + [
        f"{t} {m}" + ("" if f == "none" else f" ({f})") for t, m, f in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config, g in df.groupby("config", sort=False):
        first = g.iloc[0]
        cells = [config, first.kind, f"{first.avg_bits:.2f}", f"{first.cache_bytes_per_token:,.0f}"]
        for t, m, f in keys:
            hit = g[(g.task == t) & (g.metric == m) & (g["filter"] == f)]
            cells.append(_cell(hit.iloc[0]) if len(hit) else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r) -> str:
    if r.stderr == r.stderr:  # not NaN
        return f"{r.value:.4f} ± {r.stderr:.4f}"
    return f"{r.value:.4f}"
