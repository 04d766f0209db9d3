"""Run the long-context probes through the runtime cache (PlannedCache) for the baseline, the plan and
uniform configurations of about the same memory, and aggregate the scores into a pandas DataFrame.

The context is fed in chunks (`chunk` tokens per forward), so tokens are quantized progressively as a
serving engine would; the last chunk (the scored tail) is one more forward whose logits give every
teacher-forced prediction at once.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable

import torch

from ..errors import SensprofError
from ..artifacts import LayerPlan, Plan
from ..planning.plan import predicted_summary
from .tasks import TASKS, Sample, build_sample, format_length, min_length

BASELINE = "baseline (no quantization)"
PLAN = "plan"
METRIC = {"retrieval": "accuracy", "passkey": "exact"}
AGG_COLUMNS = ["config", "kind", "avg_bits", "task", "metric", "length", "depth", "n", "mean", "std", "min", "max"]
SAMPLE_COLUMNS = ["config", "task", "length", "depth", "seed", "needle_start", "accuracy", "exact", "scored"]


# --------------------------------------------------------------------------- configurations


def _uniform_pair(layers: list[LayerPlan]):
    pairs = {(p.k_scheme, p.v_scheme) for p in layers}
    return next(iter(pairs)) if len(pairs) == 1 else None


def _storable(plan: Plan, layers: list[LayerPlan], model) -> str | None:
    """Why the runtime cannot hold this configuration, or None."""
    from ..runtime import PlannedCache

    try:
        PlannedCache.from_plan(dataclasses.replace(plan, layers=layers), model)
    except SensprofError as e:
        return str(e)
    return None


def eval_configs(plan: Plan, model=None, uniform: str = "auto") -> tuple[dict[str, list[LayerPlan]], dict, list[str]]:
    """The configurations to run: baseline, plan, and references; returns (configs, kinds, notes).

    uniform="auto": of the validator's reference configurations the runtime can store, the uniform ones
    with the least memory not below the plan's (all tied ones), plus non-uniform references of the plan's
    target (e.g. vLLM's "skip the first k layers" heuristic); "all": every storable one; "none": no reference.
    """
    from ..validation.validate import layer_choices, reference_configs

    if uniform not in ("auto", "all", "none"):
        raise SensprofError(f"--uniform {uniform!r} is not one of auto, all, none")
    why = _storable(plan, plan.layers, model)
    if why:
        raise SensprofError(f"the plan cannot be run through the runtime cache: {why}")
    configs = {BASELINE: layer_choices(plan, ("none", "none")), PLAN: plan.layers}
    kinds = {BASELINE: "baseline", PLAN: "plan"}
    notes: list[str] = []
    if uniform == "none":
        return configs, kinds, notes
    plan_bits = predicted_summary(plan.layers)["avg_bits"]
    candidates = []
    for name, layers in reference_configs(plan).items():
        bits = predicted_summary(layers)["avg_bits"]
        why = _storable(plan, layers, model)
        if why:
            notes.append(f"skipped {name} ({bits:.2f} bits): {why}")
            continue
        candidates.append((name, layers, bits, _uniform_pair(layers) is not None))
    if uniform == "all":
        chosen = candidates
    else:
        uni = [c for c in candidates if c[3]]
        above = [c for c in uni if c[2] >= plan_bits - 1e-9]
        if above:
            best = min(c[2] for c in above)
            chosen = [c for c in above if c[2] <= best + 1e-9]
        elif uni:
            best = max(c[2] for c in uni)
            chosen = [c for c in uni if c[2] >= best - 1e-9]
            notes.append(f"no storable uniform configuration has the plan's memory ({plan_bits:.2f} bits) or more; "
                         f"compared with the largest one ({best:.2f} bits)")
        else:
            chosen = []
        chosen += [c for c in candidates if not c[3]]
    for name, layers, _, is_uniform in chosen:
        configs[name] = layers
        kinds[name] = "uniform" if is_uniform else "reference"
    return configs, kinds, notes


# --------------------------------------------------------------------------- feeding the cache


def _forward_kwargs(model, cache) -> dict:
    from ..runtime.generate import cache_kwarg

    return {cache_kwarg(model): cache, "use_cache": True}


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@torch.inference_mode()
def feed(model, ids: torch.Tensor, cache, chunk: int, upto: int | None = None, all_logits: bool = False):
    """Feed ids[:, :upto] through `cache` in chunks; return the logits of every position (all_logits) or None."""
    n = ids.shape[1] if upto is None else upto
    kw = _forward_kwargs(model, cache)
    last_only = {} if all_logits or not _keeps_logits(model) else {"logits_to_keep": 1}
    out = []
    for a in range(0, n, chunk):
        logits = model(input_ids=ids[:, a:min(a + chunk, n)], **kw, **last_only).logits
        if all_logits:
            out.append(logits.float())
    return torch.cat(out, dim=1) if all_logits else None


@torch.inference_mode()
def tail_logits(model, sample: Sample, cache, chunk: int) -> torch.Tensor:
    """Prefill the context in chunks, then the scored tail as one forward: its logits [1, T_tail, V] (float32)."""
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([sample.ids], dtype=torch.long, device=device)
    feed(model, ids, cache, chunk, upto=sample.tail_start)
    logits = model(input_ids=ids[:, sample.tail_start:], **_forward_kwargs(model, cache)).logits
    return logits.float()


def planned_cache_factory(plan: Plan, layers: list[LayerPlan], model) -> Callable[[], object]:
    from ..runtime import PlannedCache

    sub = dataclasses.replace(plan, layers=layers)
    return lambda: PlannedCache.from_plan(sub, model)


def run_samples(model, samples: list[Sample], make_cache: Callable[[], object], chunk: int) -> list[dict]:
    """Score each sample with a fresh cache from make_cache()."""
    from .tasks import score

    rows = []
    for s in samples:
        r = score(tail_logits(model, s, make_cache(), chunk)[0], s)
        rows.append({"task": s.task, "length": s.length, "depth": s.depth, "seed": s.seed,
                     "needle_start": s.needle_start, **r})
    return rows


@torch.inference_mode()
def window_nll(model, ids: torch.Tensor, make_cache: Callable[[], object], chunk: int) -> list[tuple[float, int]]:
    """Summed next-token NLL and token count of each window [W, T], fed in chunks through a fresh cache."""
    device = model.get_input_embeddings().weight.device
    out = []
    for row in ids:
        row = row.to(device).unsqueeze(0)
        logits = feed(model, row, make_cache(), chunk, all_logits=True)[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, row[0, 1:], reduction="sum")
        out.append((float(nll), row.shape[1] - 1))
    return out


# --------------------------------------------------------------------------- the whole evaluation


def check_inputs(model, tokenizer, task: str, lengths, depths, seeds: int, chunk: int, prefix) -> None:
    from ..models import max_positions

    if task not in TASKS:
        raise SensprofError(f"unknown --task {task!r}; use one of {', '.join(TASKS)}")
    if seeds < 1:
        raise SensprofError(f"--seeds {seeds} is too few; use at least 1")
    if chunk < 1:
        raise SensprofError(f"--chunk {chunk} is too small; use a positive number of tokens, e.g. 512")
    if not lengths:
        raise SensprofError("--lengths needs at least one length, e.g. 1k,2k,4k")
    if any(not 0.0 <= d <= 1.0 for d in depths) or not depths:
        raise SensprofError("--depths must be fractions in [0, 1], e.g. 0.1,0.5,0.9")
    limit = max_positions(model)
    if limit is not None and max(lengths) > limit:
        raise SensprofError(f"--lengths {max(lengths)} is beyond the model's {limit} positions; "
                            f"use lengths <= {limit}")
    need = min_length(task, prefix, tokenizer)
    if min(lengths) < need:
        raise SensprofError(f"--lengths {min(lengths)} is too short for the {task} task; use at least {need}")


def evaluate(model, tokenizer, plan: Plan, task: str = "retrieval", lengths=(1024, 2048, 4096),
             depths=(0.1, 0.5, 0.9), seeds: int = 3, chunk: int = 512, uniform: str = "auto", ppl_ids=None,
             progress: Callable[[str], None] | None = None):
    """Scores of the baseline, the plan and reference configurations through the runtime cache.

    Returns a DataFrame (AGG_COLUMNS): one row per configuration x length x depth with the mean, std
    (population), min and max of the task's score over seeds, one row per configuration x length with
    depth "all" (mean over depths and seeds), and with `ppl_ids` ([W, T] windows) one row per
    configuration with metric "ppl" (exp of the mean NLL; std/min/max over windows).
    `.attrs` holds "samples" (per-sample DataFrame), "notes" and "seconds" (per configuration).
    """
    import pandas as pd

    from ..data import PYDOC_NAME, bos_prefix, builtin_corpus, tokenize

    prefix = bos_prefix(tokenizer)
    lengths, depths = sorted({int(n) for n in lengths}), sorted({float(d) for d in depths})
    check_inputs(model, tokenizer, task, lengths, depths, seeds, chunk, prefix)
    if ppl_ids is not None:
        from ..models import max_positions

        limit = max_positions(model)
        if limit is not None and ppl_ids.shape[1] > limit:
            raise SensprofError(f"--seq-len {ppl_ids.shape[1]} is beyond the model's {limit} positions; "
                                f"use --seq-len <= {limit}")
    corpus = tokenize(tokenizer, builtin_corpus(PYDOC_NAME))  # the passkey's haystack: prose, as it always was
    samples = [build_sample(task, corpus, n, d, s, prefix, tokenizer)
               for n in lengths for d in depths for s in range(seeds)]
    configs, kinds, notes = eval_configs(plan, model, uniform)
    bits = {name: predicted_summary(layers)["avg_bits"] for name, layers in configs.items()}

    sample_rows, ppl_rows, seconds = [], [], {}
    for name, layers in configs.items():
        make_cache = planned_cache_factory(plan, layers, model)
        t0 = time.perf_counter()
        for n in lengths:
            t1 = time.perf_counter()
            batch = [s for s in samples if s.length == n]
            sample_rows += [{"config": name, **r} for r in run_samples(model, batch, make_cache, chunk)]
            if progress:
                progress(f"{name}: {len(batch)} samples of {format_length(n)} tokens in {time.perf_counter() - t1:.1f} s")
        if ppl_ids is not None:
            t1 = time.perf_counter()
            ppl_rows += [{"config": name, "nll": a, "tokens": b} for a, b in window_nll(model, ppl_ids, make_cache, chunk)]
            if progress:
                progress(f"{name}: perplexity of {ppl_ids.shape[0]} windows in {time.perf_counter() - t1:.1f} s")
        seconds[name] = time.perf_counter() - t0

    per_sample = pd.DataFrame(sample_rows, columns=SAMPLE_COLUMNS)
    metric = METRIC[task]
    rows = []
    for name in configs:
        mine = per_sample[per_sample.config == name]
        base = {"config": name, "kind": kinds[name], "avg_bits": bits[name], "task": task, "metric": metric}
        for n in lengths:
            at = mine[mine.length == n]
            for d in depths:
                rows.append({**base, "length": n, "depth": d, **_stats(at[at.depth == d][metric])})
            rows.append({**base, "length": n, "depth": "all", **_stats(at[metric])})
        if ppl_rows:
            w = [r for r in ppl_rows if r["config"] == name]
            ppl = math.exp(sum(r["nll"] for r in w) / sum(r["tokens"] for r in w))
            per = pd.Series([math.exp(r["nll"] / r["tokens"]) for r in w])
            rows.append({**base, "task": "ppl", "metric": "ppl", "length": int(ppl_ids.shape[1]), "depth": "all",
                         **_stats(per), "mean": ppl})
    df = pd.DataFrame(rows, columns=AGG_COLUMNS)
    df.attrs.update(samples=per_sample, notes=notes, seconds=seconds)
    return df


def _stats(values) -> dict:
    v = values.astype(float)
    return {"n": int(v.size), "mean": float(v.mean()), "std": float(v.std(ddof=0)), "min": float(v.min()),
            "max": float(v.max())}


def format_eval(df, seeds: int | None = None) -> str:
    """A readable table: one line per configuration x length, one column per depth (mean ± std over seeds),
    then the mean over depths with [min, max]; then perplexity if measured."""
    lines = []
    main = df[df.metric != "ppl"]
    if len(main):
        task = main.task.iloc[0]
        what = ("teacher-forced top-1 accuracy on the repeated needle after its cue tokens" if task == "retrieval"
                else "exact match of the pass key's tokens (teacher-forced)")
        per = f" over {seeds} seeds" if seeds else ""
        lines.append(f"{task}: {what}; mean ± std{per}")
        depths = [d for d in dict.fromkeys(main.depth) if d != "all"]
        head = f"{'configuration':<44}{'bits':>6}{'length':>7}" + "".join(f"{'d=' + format(d, 'g'):>13}" for d in depths)
        lines.append(head + f"{'mean over depths [min, max]':>32}")
        for (config, n), g in main.groupby(["config", "length"], sort=False):
            cells = "".join(f"{_cell(g[g.depth == d].iloc[0]):>13}" for d in depths)
            a = g[g.depth == "all"].iloc[0]
            spread = f"{_cell(a)} [{a['min']:.2f}, {a['max']:.2f}]"
            lines.append(f"{config[:43]:<44}{a.avg_bits:>6.2f}{format_length(int(n)):>7}{cells}{spread:>32}")
    ppl = df[df.metric == "ppl"]
    if len(ppl):
        base = ppl[ppl.kind == "baseline"]["mean"]
        b = float(base.iloc[0]) if len(base) else float("nan")
        lines.append("")
        lines.append(f"perplexity on --text ({int(ppl.n.iloc[0])} windows of {int(ppl.length.iloc[0])} tokens)")
        lines.append(f"{'configuration':<44}{'bits':>6}{'ppl':>10}{'dPPL':>9}{'window min':>12}{'window max':>12}")
        for r in ppl.itertuples():
            lines.append(f"{r.config[:43]:<44}{r.avg_bits:>6.2f}{r.mean:>10.3f}{r.mean - b:>9.3f}{r.min:>12.3f}"
                         f"{r.max:>12.3f}")
    return "\n".join(lines)


def _cell(r) -> str:
    return f"{r['mean']:.2f}±{r['std']:.2f}"


def use_sdpa(model) -> None:
    """load_model picks eager attention (the profiler reads attention weights); eval reads none, and PyTorch's
    fused attention is faster and lighter at long context. Keep eager where a model does not support it."""
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError, AttributeError):
        pass
