"""`sensprof report`: figures (PNG) and one self-contained HTML page from a profile, plans and sweeps.

data.py extracts the numbers each figure plots (pure pandas), plots.py draws them (matplotlib on the Agg
canvas), html.py writes the page. Imports no torch.
"""

from __future__ import annotations

import math
import os

from .. import __version__
from ..errors import SensprofError
from ..files import atomic_write_bytes, atomic_write_text, check_writable, output_lock, safe_name
from ..profiling.table import load_profile
from . import data, plots
from .html import Section, Table, page

HTML_NAME = "report.html"


def _stem(path: str, taken: set[str]) -> str:
    base = safe_name(os.path.splitext(os.path.basename(path))[0])
    stem, i = base, 2
    while stem in taken:
        stem, i = f"{base}-{i}", i + 1
    taken.add(stem)
    return stem


def _round(df, cols=None):
    """Floats rounded to 4 significant digits for the page's tables."""
    out = df.copy()
    for c in cols or out.columns:
        if out[c].dtype.kind == "f":
            out[c] = out[c].map(lambda x: x if math.isnan(x) else float(f"{x:.4g}"))
    return out


def _profile_sections(profile, metric: str, reference: str) -> list[Section]:
    t, meta = profile.table, profile.meta
    model = meta["model"]["id"]
    bits = data.scheme_bits(t)
    mk, mv = data.damage_matrix(t, "K", metric), data.damage_matrix(t, "V", metric)
    summary = []
    for s in data.scheme_order(t):
        row = {"scheme": s, "bits/elt": bits[s]}
        for tensor, m in (("K", mk), ("V", mv)):
            col = m[s] if s in m.columns else None
            ok = col is not None and col.notna().any()
            row[f"mean {tensor}"] = float(col.mean()) if ok else float("nan")
            row[f"max {tensor}"] = float(col.max()) if ok else float("nan")
            row[f"worst {tensor} layer"] = int(col.idxmax()) if ok else "–"
        summary.append(row)
    import pandas as pd

    sections = [Section(
        "Measured damage per layer and scheme", (
            f"Each cell is the damage measured when only that layer's keys (top) or values (bottom) are quantized "
            f"with that scheme and every other layer stays at full precision: {data.METRICS[metric]} "
            f"(column `{metric}` of profile.csv), over {meta.get('token_count', '?')} tokens. Both panels share one "
            "log colour scale, so K and V compare directly; schemes are sorted by storage cost (bits per element, "
            "scales and zero-points included)."
            + (" Grey cells were not profiled (pre-RoPE schemes exist for keys only)."
               if mk.isna().to_numpy().any() or mv.isna().to_numpy().any() else "")),
        "damage_heatmap.png", plots.png_bytes(plots.damage_heatmaps(mk, mv, metric, bits, model)),
        [Table(f"Per scheme: mean and worst layer of {metric}", _round(pd.DataFrame(summary))),
         Table(f"{metric} per layer, K (rows: layers)", _round(mk.reset_index()), collapsed=True),
         Table(f"{metric} per layer, V (rows: layers)", _round(mv.reset_index()), collapsed=True)])]

    kv = data.kv_sensitivity(t, reference, metric)
    sliding = int((kv.layer_kind == "sliding").sum())
    sections.append(Section(
        f"Keys vs values per layer at {reference}", (
            f"The damage ({metric}) of quantizing one layer's keys or its values with {reference}, per layer, and "
            "their ratio K / V (above 1: the keys of that layer are the more fragile). "
            + (f"Shaded: the {sliding} sliding-window layers." if sliding else "All layers use full attention.")),
        "kv_sensitivity.png", plots.png_bytes(plots.kv_sensitivity(kv, reference, metric, model)),
        [Table(f"{metric} per layer at {reference}", _round(kv), collapsed=len(kv) > 12)]))

    out = data.outlier_ratios(profile.stats)
    sections.append(Section(
        "Channel outliers of keys and values", (
            "Per layer, the channel outlier ratio of the cached tensor: the largest per-channel absolute maximum "
            "over the median one (stats.csv, `outlier_ratio`), for keys before RoPE, keys after RoPE (what is "
            "cached) and values. A large ratio means a few channels dominate the range, which hurts per-token "
            "scales and favours per-channel (KIVI-style) key quantization."),
        "outlier_ratio.png", plots.png_bytes(plots.outlier_ratios(out, model)),
        [Table("outlier ratio per layer", _round(out), collapsed=len(out) > 12)],
        note=None if out.K_pre.notna().any() else "stats.csv has no K_pre rows (the model has no RoPE): "
        "only post-RoPE keys and values are shown."))
    return sections


def _sweep_section(sweeps, profile, uniform_measured) -> Section:
    import pandas as pd

    t, meta = profile.table, profile.meta
    labels = []
    for path, df in sweeps:
        label = str(df.target.iloc[0])
        if df.objective.iloc[0] != "kl":
            label += f", objective {df.objective.iloc[0]}"
        if label in [lab for lab, _ in labels]:
            label += f" ({os.path.basename(os.path.normpath(path))})"
        labels.append((label, df))
    uniform = data.uniform_configs(t, meta)
    if uniform_measured is not None and len(uniform_measured):  # a validated sweep's every-pair configurations
        extra = uniform_measured[~uniform_measured.config.isin(uniform.config)]
        if "avg_bits" in extra.columns and len(extra):
            uniform = pd.concat([uniform, extra[["config", "avg_bits"]].assign(
                predicted_kl=extra.get("predicted_kl", float("nan")))], ignore_index=True)
    xlabel = None
    held = data.held_at_validation_length(labels, uniform, uniform_measured, meta)
    if held is not None:  # memory as the validated cache length holds it (full-precision tokens included)
        fig_labels, fig_uniform, fig_measured, n = held
        xlabel = f"bits per element a cache of {n} tokens holds (full-precision sink, residual and waiting tokens included)"
    else:
        fig_labels, fig_uniform, fig_measured = labels, uniform, uniform_measured
    fig = plots.frontier(fig_labels, fig_uniform, fig_measured, meta["model"]["id"], xlabel)
    measured = any(df.measured_kl.notna().any() for _, df in labels)
    tables = [Table(f"sweep {label}", _round(df.drop(columns=["target"]))) for label, df in labels]
    tables.append(Table("uniform configurations (predicted from the profile)", _round(uniform)))
    if uniform_measured is not None and len(uniform_measured):
        tables.append(Table("uniform configurations measured by `sensprof validate`", _round(uniform_measured)))
    zero = pd.concat([df for _, df in labels])
    note = None
    if not measured:
        note = "The sweep has no measured column: re-run `sensprof sweep ... --validate` to add measured KL."
    if (zero.predicted_kl <= 0).any():
        note = (note + " " if note else "") + "Configurations with zero predicted damage (all layers at 16 bits) " \
            "cannot sit on the log axis; they are in the table."
    return Section(
        "Memory vs damage: the planned frontier", (
            "Each sweep's plans (one per --avg-bits budget, per target) by their average stored bits per element "
            "and their KL: predicted as the sum of per-layer KL from the profile (filled markers, solid line) and, "
            "where the sweep was validated, measured with every layer quantized at once on text the profile did "
            "not use (hollow markers, dashed line). Grey markers are uniform configurations (the same scheme in "
            "every layer, or KIVI's per-channel keys with per-token values) predicted the same way; a black hollow "
            "marker of the same shape is that configuration measured by `sensprof validate` of a --plan file, "
            "when its validation CSV exists."),
        "frontier.png", plots.png_bytes(fig), tables, note=note)


def _plan_sections(plan, path: str, stem: str, profile, damage) -> list[Section]:
    strip = data.plan_strip(plan)
    p = plan.predicted
    budget = plan.budget
    bdesc = f"{budget.kind} {budget.value}"
    head = (f"{os.path.basename(path)}: target {plan.target}, objective {plan.objective}, budget {bdesc}, "
            f"{p.avg_bits:.2f} bits/element ({p.fraction_of_bf16:.3f} of bf16)")
    engine = plan.engine_summary()
    strip_sec = Section(
        f"Plan {stem}: scheme per layer", (
            f"{head}; engine: {engine}. Each column is a layer, the top row its key cache and the bottom row its "
            "value cache, coloured by the stored bits per element of the chosen scheme (memory.py's formula, "
            "scales and zero-points included) and labelled with the scheme."),
        f"plan-{stem}-strip.png", plots.png_bytes(plots.plan_strip(strip, f"Plan {stem}: target {plan.target}, "
                                                                              f"{p.avg_bits:.2f} bits/element; {engine}")),
        [Table("per layer", _round(strip), collapsed=len(strip) > 12)])
    df, vpath = damage
    measured = vpath is not None
    if measured:
        text = (f"Predicted KL (sum of the profile's per-layer KL) and measured KL (every layer quantized at once, "
                f"on windows the profile did not use) of the plan and of the uniform configurations, from "
                f"{os.path.basename(vpath)}. Labels give each configuration's bits per element.")
        note = None
        df = df.assign(measured_over_predicted=df.measured_kl / df.predicted_kl.where(df.predicted_kl > 0))
    else:
        text = ("Predicted KL (sum of the profile's per-layer KL) of the plan and of the uniform configurations the "
                "profile can predict. Labels give each configuration's bits per element.")
        note = (f"Predicted only: no {os.path.basename(data.validation_path(path))} beside the plan. Run "
                f"`sensprof validate {path}` to measure it.")
    fig = plots.plan_damage(df, f"Plan {stem}: predicted vs measured KL" if measured else
                            f"Plan {stem}: predicted KL only (not validated: no {os.path.basename(data.validation_path(path))})",
                            measured)
    dmg_sec = Section(f"Plan {stem}: predicted" + (" vs measured" if measured else "") + " damage", text,
                      f"plan-{stem}-damage.png", plots.png_bytes(fig), [Table("KL per configuration", _round(df))],
                      note=note)
    return [strip_sec, dmg_sec, *_engine_sections(path, stem)]


def served_labels(plan) -> list[str]:
    """What each layer of a plan is served as: a vLLM per-layer plan's dtype (sensprof's plugin: `fp8_e4m3`,
    `k:auto/v:int4_t64`, ...), otherwise its K and V schemes."""
    if plan.layer_dtypes:
        return [d.replace("/", "\n") for d in plan.layer_dtypes]
    return [f"{'-' if p.k_scheme == 'none' else p.k_scheme}\n{'-' if p.v_scheme == 'none' else p.v_scheme}"
            for p in plan.layers]


def _side_by_side_section(loaded_plans, stems) -> Section:
    """Every plan of the report in one figure and one table, layers aligned: per-layer vLLM plans (each layer its own
    dtype through sensprof's plugin) beside one-dtype + skip plans and sensprof's own."""
    import pandas as pd

    strips = [data.plan_strip(plan) for _, plan in loaded_plans]
    labels = [served_labels(plan) for _, plan in loaded_plans]
    n = max(len(s) for s in strips)
    table = pd.DataFrame({"layer": range(n), "kind": (list(strips[0].layer_kind) + [""] * n)[:n]})
    for stem, lab in zip(stems, labels):
        table[stem] = [x.replace("\n", " / ") for x in lab] + [""] * (n - len(lab))
    summary = pd.DataFrame([{"plan": stem, "target": plan.target, "engine": plan.engine_summary(),
                             "bits_per_element": plan.predicted.avg_bits, "predicted_damage": plan.predicted.damage}
                            for stem, (_, plan) in zip(stems, loaded_plans)])
    fig = plots.plans_side_by_side(strips, stems, labels, f"{len(stems)} plans side by side")
    return Section(
        "Plans side by side", (
            "Each plan as two rows (its key cache over its value cache) per layer, on one bits-per-element colour "
            "scale, labelled with what the layer is served as: a per-layer vLLM plan's dtype (sensprof's vLLM plugin, "
            "`k:<K>/v:<V>` for Keys and Values in their own formats), otherwise the K and V schemes (- unquantized)."),
        "plans-side-by-side.png", plots.png_bytes(fig),
        [Table("plans", _round(summary)), Table("per layer", table, collapsed=n > 12)])


def _engine_sections(path: str, stem: str) -> list[Section]:
    """One section per `sensprof validate --engine` CSV beside the plan (<plan>.engine-<engine>.csv)."""
    out = []
    for engine, csv in data.engine_checks(path):
        df = data.read_engine_check(csv)
        fig = plots.engine_check(df, f"Plan {stem} in {engine}: the running engine vs sensprof's emulation")
        bad = df[~df.agrees]
        note = None if bad.empty else ("Outside the agreement bounds (KL within 15% or its noise, mean dNLL within its noise, family-wise "
                                       "at 1% false alarms; docs/engines.md): "
                                       + ", ".join(f"{r.config} @ {r.seq_len}" for r in bad.itertuples()))
        out.append(Section(
            f"Plan {stem}: checked in {engine}",
            (f"The plan as exported, run by {df.engine.iloc[0]} on the validation windows, and sensprof's emulation of "
             f"it on the same tokens, each against its own unquantized baseline (from {os.path.basename(csv)}). The "
             "table adds the paired per-token dNLL difference (engine - emulation) with its standard error and the "
             "per-token correlation."),
            f"plan-{stem}-engine-{engine}.png", plots.png_bytes(fig), [Table("engine vs emulation", _round(df))],
            note=note))
    return out


def write_report(profile_dir: str, out_dir: str, plans=(), sweeps=(), metric: str = "kl",
                 reference_scheme: str | None = None) -> list[str]:
    """Write the report's PNGs and report.html into out_dir; returns the written paths (report.html last).

    Every input is checked (SensprofError with a fix) before anything is drawn or written.
    """
    data.check_metric(metric)
    profile = load_profile(profile_dir, require_complete=True)
    if profile.table.empty:
        raise SensprofError(f"profile {profile_dir!r} has no measured rows; re-run `sensprof profile`")
    reference = data.pick_reference_scheme(profile.table, reference_scheme)
    loaded_plans = [(p, data.load_report_plan(p, profile.meta)) for p in plans]
    damages = [data.plan_damage(plan, p, profile.table, profile.meta) for p, plan in loaded_plans]
    loaded_sweeps = [(s, data.sweep_points(s, profile.table, profile.meta)) for s in sweeps]
    check_writable(out_dir)

    sections = _profile_sections(profile, metric, reference)
    by_length = data.damage_by_length(profile)
    if len(by_length):
        sections.append(Section(
            "Damage vs context length", (
                "Each scheme's KL summed over layers (what the profile predicts for that scheme in every layer) at "
                "each profiled length; the planner uses the longest. Per-channel groups, residual windows and "
                "sinks hold a different share of the tokens in full precision at each length, so a scheme that "
                "looks cheap at a short length can cost more at a long one."),
            "damage_by_length.png", plots.png_bytes(plots.damage_by_length(by_length, profile.meta["model"]["id"])),
            [Table("KL summed over layers", _round(by_length.pivot_table(
                index=["tensor", "scheme"], columns="seq_len", values="kl_sum").reset_index()), collapsed=True)]))
    if loaded_sweeps:
        import pandas as pd

        um = []
        for df, vpath in damages:
            if vpath is not None:
                um.append(df[df.config.isin(set(data.uniform_pairs(profile.table)))])
        um += [u for u in (data.sweep_uniform(p) for p, _ in loaded_sweeps) if u is not None]
        uniform_measured = pd.concat(um).drop_duplicates("config").reset_index(drop=True) if um else None
        sections.append(_sweep_section(loaded_sweeps, profile, uniform_measured))
    taken: set[str] = set()
    stems = [_stem(path, taken) for path, _ in loaded_plans]
    if len(loaded_plans) > 1:
        sections.append(_side_by_side_section(loaded_plans, stems))
    for (path, plan), damage, stem in zip(loaded_plans, damages, stems):
        sections += _plan_sections(plan, path, stem, profile, damage)

    meta = profile.meta
    layers = meta["layers"]
    n_sliding = sum(1 for i in layers if i["kind"] == "sliding")
    meta_lines = [
        f"model: {meta['model']['id']} (fingerprint {meta['model']['fingerprint']}, {meta['model'].get('class', '')})",
        (f"profile: {os.path.abspath(profile_dir)}: {len(layers)} layers ({len(layers) - n_sliding} full, "
         f"{n_sliding} sliding), {layers[0]['kv_heads']} KV heads x {layers[0]['head_dim']}, "
         f"{meta.get('token_count', '?')} tokens of {meta.get('text', '?')}, {len(meta.get('schemes', {}))} schemes"),
        f"damage metric: {metric} ({data.METRICS[metric]}); K-vs-V reference scheme: {reference}",
        f"written by sensprof {__version__}",
    ]
    text = page(f"sensprof report: {meta['model']['id']}", meta_lines, sections)
    written = []
    with output_lock(out_dir):  # one writer per folder
        try:
            for s in sections:
                path = os.path.join(out_dir, s.image)
                atomic_write_bytes(path, s.png)
                written.append(path)
            path = os.path.join(out_dir, HTML_NAME)
            atomic_write_text(path, text)
            written.append(path)
        except OSError as e:
            raise SensprofError(f"cannot write the report into {out_dir!r} ({e.strerror or e}); pass a writable "
                                "--out") from None
    return written


__all__ = ["HTML_NAME", "write_report"]
