"""Apply a whole plan at once (every layer quantized together) on windows the profile never saw,
and measure it beside uniform configurations: did summing per-layer damage predict the joint damage?"""

from __future__ import annotations

import math
import os
import sys

import torch

from ..errors import SensprofError
from ..profiling.hooks import attention_taps
from ..artifacts import LayerPlan, Plan
from ..planning.plan import predicted_summary
from ..profiling.outputs import Baseline, MaterializedBaseline, output_head
from ..schemes import get_scheme
from ..profiling.taps import QuantTap
from ..profiling.table import summed_damage
from ..targets import get_target

# Uniform references every validation shows.
UNIFORM = {
    "uniform fp8_e4m3": ("fp8_e4m3", "fp8_e4m3"),
    "uniform int8_per_token_head": ("int8_per_token_head", "int8_per_token_head"),
    "uniform KIVI-4 (int4_c32 / int4_t32)": ("int4_c32", "int4_t32"),
    "uniform KIVI-2 (int2_c32 / int2_t32)": ("int2_c32", "int2_t32"),
}


def layer_choices(plan: Plan, pairs) -> list[LayerPlan]:
    """The plan's layers with other (K, V) schemes: a list of pairs, or one pair for every layer."""
    import dataclasses

    if isinstance(pairs, tuple):
        pairs = [pairs] * len(plan.layers)
    return [dataclasses.replace(p, k_scheme=k, v_scheme=v) for p, (k, v) in zip(plan.layers, pairs)]


def engine_dtype_alone(plan: Plan, d) -> list[LayerPlan]:
    """The plan's layers with one engine dtype (targets.EngineDtype) on every layer but those the engine itself keeps
    at the model dtype (its forced skips), as the engine serves that dtype alone by default."""
    forced = set(d.forced_skips(len(plan.layers)))
    return layer_choices(plan, [("none", "none") if i in forced else d.schemes for i in range(len(plan.layers))])


def reference_configs(plan: Plan) -> dict[str, list[LayerPlan]]:
    """Uniform configurations to compare the plan with: the common ones and the target's own (each distinct
    choice once); for vLLM, each dtype alone with only the layers vLLM itself keeps (its default); for llama.cpp,
    each type on K and V, and every -ctk/-ctv pair of no more memory than the plan."""
    configs = _Distinct()
    for name, pair in UNIFORM.items():
        configs.setdefault(name, layer_choices(plan, pair))
    n = len(plan.layers)
    if plan.target == "vllm":
        target = get_target("vllm", plan.engine.vllm_gpu, head_dims={p.head_dim for p in plan.layers})
        for d in target.dtypes:
            forced = set(d.forced_skips(n))
            note = f", vLLM keeps layers {' '.join(map(str, sorted(forced)))}" if forced else ", all layers"
            schemes = d.k_scheme if d.k_scheme == d.v_scheme else f"{d.k_scheme} / {d.v_scheme}"
            configs.setdefault(f"vllm {d.flag_value} ({schemes}){note}", engine_dtype_alone(plan, d))
    if plan.target == "sglang":
        for d in get_target("sglang").dtypes:
            if d.k_scheme != "none":
                configs.setdefault(f"sglang {d.flag_value} ({d.k_scheme}), all layers", layer_choices(plan, d.schemes))
    if plan.target == "llamacpp":  # each type on both, and every -ctk/-ctv pair of no more memory than the plan
        types = [d for d in get_target("llamacpp", channel_order=plan.engine.channel_order).dtypes
                 if d.k_scheme != "none"]
        plan_bits = predicted_summary(plan.layers)["avg_bits"]
        for dk in types:
            for dv in types:
                layers = layer_choices(plan, (dk.k_scheme, dv.v_scheme))
                if dk is dv or predicted_summary(layers)["avg_bits"] <= plan_bits + 1e-9:
                    configs.setdefault(f"llama.cpp -ctk {dk.flag_value} -ctv {dv.flag_value}", layers)
    if plan.target != "vllm":
        return dict(configs)
    forced = set(plan.engine.forced_skip_layers)
    chosen = [i for i in plan.engine.skip_layers if i not in forced]
    if chosen:
        k = len(chosen)
        pair = plan_engine_schemes(plan)
        firsts = set(sorted(set(range(n)) - forced)[:k]) | forced
        configs.setdefault(f"vllm {plan.engine.kv_cache_dtype}, skip first {k} layers (heuristic)", layer_choices(
            plan, [("none", "none") if i in firsts else pair for i in range(n)]))
    return dict(configs)


def plan_engine_schemes(plan: Plan) -> tuple[str, str]:
    """The (K, V) schemes of a global-dtype plan."""
    return plan.engine.k_scheme, plan.engine.v_scheme


class _Distinct(dict):
    """A dict that ignores a configuration whose per-layer choices it already holds."""

    def setdefault(self, name, layers):
        key = tuple((p.k_scheme, p.v_scheme) for p in layers)
        if name not in self and all(key != tuple((q.k_scheme, q.v_scheme) for q in v) for v in self.values()):
            self[name] = layers
        return self.get(name)


def predicted_damage(profile_table, layers: list[LayerPlan], objective_col: str = "kl",
                     upper_bound: bool = False) -> float:
    """Sum of per-layer measured damage, or NaN where the profile lacks a cell; with upper_bound, a missing `_r32_s4`
    cell reads the cell of the scheme without its kept tokens (planning.uniforms.kept_recent_base)."""
    pairs = [(p.k_scheme, p.v_scheme) for p in layers]
    if upper_bound and profile_table is not None:
        pairs = _bounded_pairs(profile_table, pairs)
    return summed_damage(profile_table, pairs, objective_col)


def _bounded_pairs(profile_table, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    from ..planning.uniforms import bounded_scheme

    have = set(zip(profile_table.layer.astype(int), profile_table.tensor.astype(str),
                   profile_table.scheme.astype(str)))

    def cell_of(layer: int, tensor: str, scheme: str) -> str:
        return bounded_scheme(scheme, lambda s: (layer, tensor, s) in have)

    return [(cell_of(i, "K", k), cell_of(i, "V", v)) for i, (k, v) in enumerate(pairs)]


def plan_reads(plan: Plan) -> str:
    """How the plan's target reads its cache (sensprof.pricing): recorded in the plan, else the target's."""
    from ..planning.pricing import target_reads

    return (plan.predicted.pricing or {}).get("reads") or target_reads(plan.target)


@torch.inference_mode()
def measure(model, input_ids: torch.Tensor, configs: dict[str, list[LayerPlan]], progress=None,
            per_token: bool = False, reads: str = "streaming") -> dict[str, dict]:
    """Measured KL / ΔNLL / ΔPPL of each configuration with all its layers quantized at once, its cache read as
    `reads` says (streaming or all: sensprof.pricing); with per_token, each position's KL and ΔNLL too, and the
    baseline's NLL under "baseline"."""
    from ..models import describe_layers

    n = len(describe_layers(model))
    results = {}
    input_ids = input_ids.to(model.get_input_embeddings().weight.device)
    with attention_taps(model) as session:
        head = output_head(model, input_ids)
        forward = (lambda ids: model(input_ids=ids, use_cache=False).logits) if head is None else head.hidden
        baseline = MaterializedBaseline(forward(input_ids), input_ids) if head is None else Baseline(
            head, forward(input_ids), input_ids)
        for name, layers in configs.items():
            if len(layers) != n:
                raise SensprofError(f"configuration {name!r} has {len(layers)} layers, the model {n}")
            for p in layers:
                pair = (None if p.k_scheme == "none" else get_scheme(p.k_scheme),
                        None if p.v_scheme == "none" else get_scheme(p.v_scheme))
                cal = {k: torch.tensor(v) for k, v in (p.absmax or {}).items()}
                session.set_tap(p.layer, QuantTap(session, p.layer, [pair], input_ids.shape[0], cal, local=False,
                                                  reads=reads))
            try:
                out = forward(input_ids)
            finally:
                session.clear_taps()
            m = baseline.compare(out, per_token)
            m["dppl"] = math.exp(baseline.mean_nll + m["dnll"]) - math.exp(baseline.mean_nll)
            m["base_ppl"] = math.exp(baseline.mean_nll)
            results[name] = m
            if progress:
                progress(name)
        if per_token:
            results["baseline"] = {"nll_tokens": baseline.token_nll()}
    return results


def validation_table(plan: Plan, measured: dict, configs: dict[str, list[LayerPlan]], profile_table=None,
                     seq_len: int | None = None, profile_meta: dict | None = None):
    """The measured table; `profile_table`'s KL predicts each configuration, priced for the plan's reads at
    `seq_len` tokens (sensprof.pricing) when the profile's meta is given."""
    import pandas as pd

    if profile_table is not None and seq_len and profile_meta is not None:
        from ..planning.pricing import priced_at

        profile_table = priced_at(profile_table, profile_meta.get("reads", "streaming"),
                                  int(profile_meta["settings"]["seq_len"]), int(seq_len), profile_meta.get("layers"))

    plan_bits = predicted_summary(plan.layers)["avg_bits"]
    joint = plan.predicted.joint_factor_at(int(seq_len)) if seq_len else None
    bound_plan = not (plan.solver.select or {}).get("uniform_won")  # a uniform setting that won reads measured cells
    rows = []
    for name, layers in configs.items():
        s = predicted_summary(layers)
        m = measured[name]
        # measured is KL: predict KL whatever optimised; the plan's sum as the selection that chose it summed it
        pred = total = predicted_damage(profile_table, layers, "kl", upper_bound=name == "plan" and bound_plan)
        served = None
        if name == "plan" and seq_len and pred == pred:  # what plan and export print for it at this length
            from ..planning.prediction import for_plan

            served = for_plan(plan, int(seq_len), pred, engine=False)
        if served is not None:
            pred = served.kl
        elif name == "plan" and joint:  # the interaction --select-measured measured on its own windows
            pred *= joint
        rows.append({"config": name, "avg_bits": s["avg_bits"], "bytes_per_token": s["bytes_per_token"],
                     "vs_bf16": s["bytes_per_token"] / (s["bf16_bytes_per_token"]),
                     "memory_vs_plan": "plan" if name == "plan" else (
                         ">=" if s["avg_bits"] >= plan_bits - 1e-9 else "<"),
                     "predicted_kl": pred, "per_layer_sum": total, "measured_kl": m["kl"], "kl_std": m["kl_std"], "dnll": m["dnll"],
                     "dppl": m["dppl"], "measured_over_predicted": m["kl"] / pred if pred and pred > 0 else float("nan")})
    return pd.DataFrame(rows)


def format_table(df) -> str:
    w = max([len("configuration"), *(len(c) for c in df.config)]) + 1  # vLLM's rows name their kept layers
    lines = [f"{'configuration':<{w}}{'bits':>6}{'xbf16':>7}{'mem':>5}{'pred KL':>10}{'meas KL':>10}"
             f"{'meas/pred':>10}{'dPPL':>9}"]
    for r in df.itertuples():
        lines.append(f"{r.config:<{w}}{r.avg_bits:>6.2f}{r.vs_bf16:>7.3f}{r.memory_vs_plan:>5}"
                     f"{r.predicted_kl:>10.2e}{r.measured_kl:>10.2e}{r.measured_over_predicted:>10.2f}{r.dppl:>9.4f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- windows and lengths a plan is judged on


def validation_windows(plan: Plan, tokenizer, windows: int | None, seq_len: int | None, text=None):
    """Windows from the profile's text that the profile did not use (nor `plan --select-measured`); with `text`
    (read_user_text's), windows of that text, refused where it holds any of the profile's windows."""
    from ..data import bos_prefix, overlapping_slots, text_windows

    settings = plan.profile.settings
    seq = seq_len or settings["seq_len"]
    if seq < 2:
        raise SensprofError(f"--seq-len {seq} is too short; use at least 2")
    count = settings["windows"] if windows is None else windows
    if text is not None:
        return user_windows(plan, tokenizer, text, seq, count, settings["seed"] + 1)[0]
    exclude = set(plan.profile.window_slots or [])
    if seq != settings["seq_len"]:  # other slot boundaries: leave out every window that overlaps a profiled one
        prefix = len(bos_prefix(tokenizer))
        exclude = overlapping_slots(exclude, settings["seq_len"] - prefix, seq - prefix)
    body, name = profile_text(plan, tokenizer)
    chosen_on = getattr(getattr(plan, "solver", None), "select", None)  # plan --select-measured chose on these
    if chosen_on and chosen_on.get("window_slots") and not chosen_on.get("text"):  # slots of the profile's text
        prefix = len(bos_prefix(tokenizer))
        exclude = set(exclude) | overlapping_slots(chosen_on["window_slots"], chosen_on["seq_len"] - prefix,
                                                   seq - prefix)
    ids, _, _, _ = text_windows(tokenizer, body, name, seq, count, settings["seed"] + 1, exclude)
    return ids


def profile_text(plan: Plan, tokenizer=None) -> tuple[str, str]:
    """The text the plan's profile read (its chats rendered by `tokenizer`), refused unless it is that text,
    unchanged (its digest)."""
    from ..data import load_text, text_digest

    files = list(plan.profile.text_files or [])
    check_plan_text(plan)
    gone = [f for f in files if not os.path.isfile(f)]
    if gone:
        raise SensprofError(f"the plan's profile text {gone[0]!r} is not there; restore the text the profile was "
                            "made from, or re-profile and re-plan")
    text, name = load_text(files, tokenizer, builtin=plan.profile.settings.get("text"))
    want = plan.profile.settings.get("text_digest")
    if (want or files) and text_digest(text) != want:  # a plan names its text: read only that text, unchanged
        raise SensprofError(
            f"the plan's profile text ({', '.join(map(repr, files)) or 'the built-in corpus'}) is not the text that "
            f"was profiled (digest {text_digest(text)} now, {want or 'none'} in the plan); restore that text, or "
            "re-profile and re-plan")
    return text, name


def check_plan_text(plan: Plan) -> None:
    """The plan's profile text is read only if it is a regular file under the plan file's folder or the current
    folder (files.check_recorded_files): a plan from elsewhere could name /proc/self/environ or a FIFO."""
    from ..files import check_recorded_files

    roots = getattr(plan.profile, "text_roots", lambda: None)()
    check_recorded_files(plan.profile.text_files, roots, "the plan's profile text", ", or re-profile and re-plan")


def read_user_text(profile_digest: str | None, files: list[str], flag: str = "--text",
                   chosen_digest: str | None = None):
    """`validate --text`, `plan`/`sweep --select-text`: the user's files, folders and JSONL (data.read_texts: refused
    in one line when missing, empty, binary or bad JSONL), refused too when it is the profile's own text
    (`profile_digest`) or the text the plan was chosen on (`chosen_digest`): before the model loads, except for
    chats, which need its chat template (user_windows checks those). Returns the data.Text."""
    from ..data import read_texts

    text = read_texts([files] if isinstance(files, str) else list(files), flag)
    if not text.has_chats:
        refuse_known_text(text.digest(), text.name, profile_digest, chosen_digest, flag)
    return text


def read_select_text(profile_dir: str, files: list[str] | None, windows: int):
    """`plan`/`sweep --select-text`: read_user_text's data.Text (None without files), refused without a selection."""
    if not files:
        return None
    if not windows:
        raise SensprofError("--select-text is the text --select-measured chooses on, and --select-measured is 0; "
                            "pass --select-measured N, or drop --select-text")
    from ..profiling.table import load_meta

    return read_user_text(load_meta(profile_dir)["settings"].get("text_digest"), files, "--select-text")


def refuse_known_text(digest: str, name: str, profile_digest: str | None, chosen_digest: str | None,
                      flag: str) -> None:
    if digest == profile_digest:
        raise SensprofError(f"{flag} {name} is the text the plan was profiled on; pass text the profile did not see "
                            f"(or leave {flag} out for the profile's unseen windows)")
    if chosen_digest and digest == chosen_digest:
        raise SensprofError(f"{flag} {name} is the text `plan --select-text` chose the plan on; judge it on other text")


def user_windows(plan: Plan, tokenizer, text, seq_len: int, count: int, seed: int, flag: str = "--text"):
    """(ids, slots): windows of the user's text (read_user_text's data.Text, its chats rendered by the model's chat
    template), refused where it holds any profiled window."""
    from ..data import PROFILE_FLAGS, SELECT_FLAGS, text_digest, text_windows

    body = text.render(tokenizer)
    if text.has_chats:  # read_user_text could not render these before the model loaded
        chosen = (getattr(getattr(plan, "solver", None), "select", None) or {}).get("text_digest") \
            if flag == "--text" else None
        refuse_known_text(text_digest(body), text.name, plan.profile.settings.get("text_digest"), chosen, flag)
    _refuse_profile_overlap(plan, tokenizer, body, text.name, flag)
    ids, _, _, slots = text_windows(tokenizer, body, text.name, seq_len, count, seed,
                                    flags=SELECT_FLAGS if flag == "--select-text" else PROFILE_FLAGS)
    return ids, slots


OVERLAP = 32  # tokens in a row shared with a profile window that make a validation window not unseen


def _refuse_profile_overlap(plan: Plan, tokenizer, text: str, name: str, flag: str) -> None:
    """Refuse a text that holds OVERLAP tokens in a row of any window the profile measured: windows drawn from it
    could be the profiled ones."""
    from ..data import bos_prefix, text_windows, tokenize

    settings = plan.profile.settings
    prefix = len(bos_prefix(tokenizer))
    body, text_name = profile_text(plan, tokenizer)
    profiled, _, _, _ = text_windows(tokenizer, body, text_name, settings["seq_len"], settings["windows"],
                                     settings["seed"])
    seen = {tuple(row[i:i + OVERLAP]) for row in profiled[:, prefix:].tolist()
            for i in range(max(1, len(row) - OVERLAP + 1))}
    tokens = tokenize(tokenizer, text)
    if any(tuple(tokens[i:i + OVERLAP]) in seen for i in range(max(1, len(tokens) - OVERLAP + 1))):
        raise SensprofError(f"{flag} {name} holds {OVERLAP} or more tokens in a row of the windows the plan was "
                            "profiled on; pass text the profile did not see")


def validate_plan(plan: Plan, loaded, windows=None, seq_len=None, progress=None, text=None, baselines=None):
    """Measured table of the plan beside the reference configurations and `baselines` ({name: layers}, the best
    uniform configurations within its memory: sensprof.validation.baselines) (on `text`, read_user_text's, if
    given)."""
    path = plan.profile.locate()
    profile = plan_profile(plan, path) if path else None  # a profile that is not the plan's: refused first
    ids = validation_windows(plan, loaded.tokenizer, windows, seq_len, text)
    references = _Distinct()
    for name, layers in {**(baselines or {}), **reference_configs(plan)}.items():
        references.setdefault(name, layers)
    configs = {"plan": plan.layers, **references}
    measured = measure(loaded.model, ids, configs, progress, reads=plan_reads(plan))
    if path is None:
        print(f"sensprof: note: {plan.profile.missing_note()}", file=sys.stderr)
    return validation_table(plan, measured, configs, profile.table if profile else None, int(ids.shape[1]),
                            profile.meta if profile else None)


def plan_profile(plan: Plan, path: str):
    """The profile the plan was made from, at `path`, refused unless it is that profile: the model fingerprint and
    the settings the plan recorded (a plan copied beside another model's profile must not predict from it)."""
    from ..profiling.table import load_profile

    profile = load_profile(path)
    fp, settings = profile.meta["model"]["fingerprint"], profile.meta["settings"]
    want = plan.profile.settings
    diffs = [k for k in sorted(set(want) | set(settings)) if want.get(k) != settings.get(k)]
    if fp != plan.profile.fingerprint or diffs:
        what = (f"model fingerprint {fp} there, {plan.profile.fingerprint} in the plan" if fp != plan.profile.fingerprint
                else f"settings differ in {', '.join(diffs[:3])}")
        raise SensprofError(f"the plan's profile {path!r} is not the profile it was made from ({what}); keep the "
                            "plan beside its own profile, or re-plan from this one")
    return profile


def validation_lengths(plan: Plan, spec, model) -> list[int]:
    """--seq-len for validate: a length or a list; default the profile's length and 4x it (within the model)."""
    from ..models import max_positions

    from ..data import parse_seq_lens

    own = int(plan.profile.settings["seq_len"])
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
            mine, theirs = float(g[g.config == "plan"].measured_kl.iloc[0]), float(best.measured_kl)
            ratios[int(n)] = (mine / theirs if theirs > 0 else (math.inf if mine > 0 else 1.0), best.config)
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
