"""The report's figures: matplotlib `Figure` objects drawn on the Agg canvas (no pyplot, no display, no global
backend change). Colours: viridis / cividis colour maps and the Okabe-Ito palette, so they read for colour-blind
eyes; categories also differ by marker or hatch, never by colour alone."""

from __future__ import annotations

import io
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize, SymLogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .data import METRICS, STATS_TENSORS

# Okabe & Ito (2008), colour-universal design
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}
SERIES = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442"]
K_STYLE = {"color": OKABE_ITO["orange"], "marker": "o"}
V_STYLE = {"color": OKABE_ITO["blue"], "marker": "s"}
SLIDING_SHADE = {"color": "#999999", "alpha": 0.22, "lw": 0}
DPI = 110


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _layer_ticks(ax, layers) -> None:
    layers = list(layers)
    step = 1 if len(layers) <= 40 else math.ceil(len(layers) / 40)
    ax.set_xticks(layers[::step])
    ax.tick_params(axis="x", labelsize=8 if len(layers) > 20 else 9)


def _shade_sliding(ax, kinds) -> bool:
    """Grey band behind every sliding-window layer; True if there was one."""
    any_sliding = False
    for layer, kind in kinds.items():
        if kind == "sliding":
            ax.axvspan(layer - 0.5, layer + 0.5, **SLIDING_SHADE)
            any_sliding = True
    return any_sliding


def _sliding_legend_handle():
    return Patch(facecolor=SLIDING_SHADE["color"], alpha=SLIDING_SHADE["alpha"], label="sliding-window layer")


def _value_norm(values):
    """A log colour norm over the positive values, or a symmetric-log one (diverging map) if any is negative.
    Returns (norm, colour map name, how zero/negative cells were handled)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    pos = v[v > 0]
    if len(v) and (v < 0).any():
        top = float(np.abs(v).max()) or 1.0
        nz = np.abs(v[v != 0])
        lin = float(np.percentile(nz, 10)) if len(nz) else top / 100
        return SymLogNorm(linthresh=max(lin, top * 1e-6), vmin=-top, vmax=top, base=10), "RdBu_r", "symlog"
    if not len(pos):
        return Normalize(0, 1), "viridis", "linear"
    lo, hi = float(pos.min()), float(pos.max())
    if hi <= lo:
        lo, hi = lo / 10, hi * 10
    return LogNorm(vmin=lo, vmax=hi), "viridis", "log"


def damage_heatmaps(mk, mv, metric: str, bits: dict, model_id: str) -> Figure:
    """K and V heatmaps (layer on x, scheme on y), one shared log colour scale."""
    import matplotlib

    n_layers = max(len(mk.index), len(mv.index))
    rows = len(mk.columns) + len(mv.columns)
    fig = new_figure(max(7.5, 0.34 * n_layers + 3.8), max(4.0, 0.34 * rows + 2.2))
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[max(len(mk.columns), 1), max(len(mv.columns), 1)])
    norm, cmap_name, mode = _value_norm(np.concatenate([mk.to_numpy().ravel(), mv.to_numpy().ravel()]))
    cmap = matplotlib.colormaps[cmap_name].with_extremes(bad="#dddddd")
    annotate = n_layers * max(len(mk.columns), len(mv.columns)) <= 120
    im = None
    for ax, m, tensor in zip(axes, (mk, mv), ("K", "V")):
        z = m.to_numpy(dtype=float).T  # schemes x layers
        shown = z.copy()
        if mode == "log":
            shown[shown <= 0] = norm.vmin  # exact zero: the lowest colour (the tables keep the 0)
        im = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                       extent=(m.index.min() - 0.5, m.index.max() + 0.5, len(m.columns) - 0.5, -0.5))
        ax.set_yticks(range(len(m.columns)))
        ax.set_yticklabels([f"{s} ({bits.get(s, float('nan')):g} b)" for s in m.columns], fontsize=8)
        ax.set_ylabel(f"{tensor} scheme\n(bits/element)", fontsize=9)
        ax.set_title(f"{'Keys' if tensor == 'K' else 'Values'}: {tensor} of one layer quantized", fontsize=10, loc="left")
        if annotate:
            for j, layer in enumerate(m.index):
                for i in range(len(m.columns)):
                    val = z[i, j]
                    if np.isfinite(val):
                        r, g, b, _ = cmap(norm(shown[i, j]))
                        ax.text(layer, i, "0" if val == 0 else f"{val:.1e}", ha="center", va="center", fontsize=6,
                                color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")
        _layer_ticks(ax, m.index)
    axes[-1].set_xlabel("layer")
    scale = {"log": "log scale", "symlog": "symmetric log scale", "linear": "linear scale"}[mode]
    cb = fig.colorbar(im, ax=list(axes), shrink=0.9, pad=0.01)
    cb.set_label(f"{METRICS[metric]} ({scale})", fontsize=9)
    missing = mk.isna().to_numpy().any() or mv.isna().to_numpy().any()
    fig.suptitle(f"Measured damage per layer and scheme: {model_id}"
                 + ("\n(grey: not profiled for that tensor)" if missing else ""), fontsize=11)
    return fig


def kv_sensitivity(df, scheme: str, metric: str, model_id: str) -> Figure:
    """K and V damage per layer at one scheme, and their ratio; sliding-window layers shaded."""
    n = len(df)
    fig = new_figure(max(7.5, 0.3 * n + 3), 6.2)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    kinds = df.set_index("layer").layer_kind
    sliding = _shade_sliding(ax, kinds)
    _shade_sliding(ax2, kinds)
    ax.plot(df.layer, df.K, label=f"K (keys) at {scheme}", lw=1.2, ms=5, **K_STYLE)
    ax.plot(df.layer, df.V, label=f"V (values) at {scheme}", lw=1.2, ms=5, ls="--", **V_STYLE)
    vals = np.concatenate([df.K.to_numpy(float), df.V.to_numpy(float)])
    vals = vals[np.isfinite(vals)]
    if len(vals) and (vals <= 0).any():
        nz = np.abs(vals[vals != 0])
        ax.set_yscale("symlog", linthresh=float(nz.min()) if len(nz) else 1e-9)
        ax.set_ylabel(f"{metric}\n(symmetric log scale)")
    else:
        ax.set_yscale("log")
        ax.set_ylabel(f"{metric}\n(log scale)")
    handles, _ = ax.get_legend_handles_labels()
    if sliding:
        handles.append(_sliding_legend_handle())
    ax.legend(handles=handles, fontsize=8, loc="best")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(f"{METRICS[metric]}, one layer's K or V quantized at {scheme}"
                 + ("" if sliding else " (all layers full attention)"), fontsize=10, loc="left")
    ratio = df.K_over_V.to_numpy(float)
    ax2.bar(df.layer, np.where(np.isfinite(ratio), ratio, 0), color=OKABE_ITO["green"], width=0.7,
            label="K / V")
    ax2.axhline(1.0, color=OKABE_ITO["black"], lw=0.8, ls=":", label="K = V")
    if np.isfinite(ratio).any() and (ratio[np.isfinite(ratio)] > 0).all():
        ax2.set_yscale("log")
    ax2.set_ylabel("K / V\n(log scale)")
    ax2.set_xlabel("layer")
    ax2.legend(fontsize=8, loc="best")
    ax2.grid(True, axis="y", which="major", alpha=0.3)
    _layer_ticks(ax2, df.layer)
    fig.suptitle(f"Key vs Value sensitivity per layer: {model_id}", fontsize=11)
    return fig


def outlier_ratios(df, model_id: str) -> Figure:
    """Per-layer channel outlier ratio of K before and after RoPE and of V."""
    n = len(df)
    fig = new_figure(max(7.5, 0.3 * n + 3), 4.2)
    ax = fig.subplots()
    sliding = _shade_sliding(ax, df.set_index("layer").layer_kind)
    styles = {"K_pre": {"color": OKABE_ITO["purple"], "marker": "^", "ls": ":"},
              "K": {"color": OKABE_ITO["orange"], "marker": "o", "ls": "-"},
              "V": {"color": OKABE_ITO["blue"], "marker": "s", "ls": "--"}}
    for t, label in STATS_TENSORS.items():
        if df[t].notna().any():
            ax.plot(df.layer, df[t], label=label, lw=1.2, ms=5, **styles[t])
    vals = df[list(STATS_TENSORS)].to_numpy(float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals) and vals.max() / vals.min() > 10:
        ax.set_yscale("log")
        ax.set_ylabel("outlier ratio (log scale)")
    else:
        ax.set_ylabel("outlier ratio")
    ax.axhline(1.0, color=OKABE_ITO["black"], lw=0.6, ls=":")
    handles, _ = ax.get_legend_handles_labels()
    if sliding:
        handles.append(_sliding_legend_handle())
    ax.legend(handles=handles, fontsize=8, loc="best")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("layer")
    _layer_ticks(ax, df.layer)
    ax.set_title("max / median over channels of the per-channel absmax (1 = no outlier channel)", fontsize=9,
                 loc="left")
    fig.suptitle(f"Channel outliers of the cached tensors: {model_id}", fontsize=11)
    return fig


def frontier(sweeps: list, uniform, uniform_measured, model_id: str, xlabel: str | None = None) -> Figure:
    """Memory (avg bits) vs KL: each sweep's planned configurations (predicted solid, measured dashed) and the
    uniform configurations (predicted filled, measured hollow)."""
    fig = new_figure(10.5, 5.6)
    ax = fig.subplots()
    for i, (label, df) in enumerate(sweeps):
        c = SERIES[i % len(SERIES)]
        d = df[df.predicted_kl > 0]
        ax.plot(d.avg_bits, d.predicted_kl, color=c, marker="o", lw=1.6, ms=6, label=f"plans, {label}: predicted")
        m = df[df.measured_kl > 0]
        if len(m):
            ax.plot(m.avg_bits, m.measured_kl, color=c, marker="o", mfc="white", lw=1.4, ls="--", ms=6,
                    label=f"plans, {label}: measured")
    markers = ["s", "D", "v", "P", "X", "<", ">", "h", "p", "*", "d", "8"]
    measured_by_name = {}
    if uniform_measured is not None and len(uniform_measured):
        measured_by_name = dict(zip(uniform_measured.config, uniform_measured.measured_kl))
    any_measured = False
    if uniform is not None and len(uniform) > len(markers):  # a whole menu's pairs: dots and the measured envelope
        p = uniform[uniform.predicted_kl > 0]
        ax.plot(p.avg_bits, p.predicted_kl, ls="none", marker=".", ms=5, color="#999999",
                label="uniform (one K and one V scheme in every layer): predicted")
        m = uniform.assign(measured=[measured_by_name.get(c, float("nan")) for c in uniform.config])
        m = m[m.measured > 0].sort_values("avg_bits")
        if len(m):
            ax.plot(m.avg_bits, m.measured, ls="none", marker="o", ms=6, mfc="none", color=OKABE_ITO["black"],
                    label="uniform: measured")
            env = m.measured.cummin()  # at each memory, the best uniform configuration that needs no more
            ax.step(m.avg_bits, env, where="post", color=OKABE_ITO["black"], lw=1.0,
                    label="best uniform with no more memory (measured)")
        uniform = None
    if uniform is not None and len(uniform):
        for j, r in enumerate(uniform.itertuples()):
            mk = markers[j % len(markers)]
            if r.predicted_kl > 0:
                ax.plot([r.avg_bits], [r.predicted_kl], ls="none", marker=mk, ms=7, color="#555555",
                        label=f"uniform: {r.config.removeprefix('uniform ')}")
            m = measured_by_name.get(r.config, float("nan"))
            if m > 0:
                any_measured = True
                ax.plot([r.avg_bits], [m], ls="none", marker=mk, ms=9, mfc="none", mew=1.3, color=OKABE_ITO["black"])
    if any_measured:
        ax.plot([], [], ls="none", marker="o", ms=7, color="#555555", label="uniform, filled: predicted")
        ax.plot([], [], ls="none", marker="o", ms=9, mfc="none", mew=1.3, color=OKABE_ITO["black"],
                label="uniform, hollow: measured (validate)")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel or "average stored bits per cached element (scales and zero-points included)")
    ax.set_ylabel("KL(baseline ‖ quantized), mean per token\n(log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(f"Memory vs damage: planned and uniform KV-cache configurations, {model_id}", fontsize=11)
    return fig


def _luma(rgba) -> float:
    r, g, b = rgba[:3]
    return 0.299 * r + 0.587 * g + 0.114 * b


def plan_strip(strip, title: str) -> Figure:
    """The plan as two rows of cells (K, V) per layer, coloured by bits per element, labelled with the scheme.

    Colours are ordinal: each distinct bits value used by the plan gets its own step of cividis (cheapest
    darkest), so 4.5 and 5 bits differ visibly; the colour bar names the values."""
    import matplotlib
    from matplotlib.colors import BoundaryNorm, ListedColormap

    n = len(strip)
    fig = new_figure(max(7.5, 0.42 * n + 2.8), 4.0)
    ax = fig.subplots()
    z = np.vstack([strip.k_bits.to_numpy(float), strip.v_bits.to_numpy(float)])
    levels = sorted(set(z.ravel().tolist()))
    k = len(levels)
    colours = matplotlib.colormaps["cividis"](np.linspace(0.0, 1.0, k) if k > 1 else [0.55])
    cmap = ListedColormap(colours)
    norm = BoundaryNorm(np.arange(-0.5, k), k)
    idx = np.vectorize(levels.index)(z)
    im = ax.imshow(idx, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                   extent=(-0.5, n - 0.5, 1.5, -0.5))
    fs = 7.5 if n <= 32 else 6
    for j, r in enumerate(strip.itertuples()):
        for i, (scheme, b) in enumerate(((r.k_scheme, r.k_bits), (r.v_scheme, r.v_bits))):
            name = "unquantized" if scheme == "none" else scheme
            ax.text(j, i, f"{name}\n{b:g} b", ha="center", va="center", rotation=90, fontsize=fs, linespacing=1.0,
                    color="white" if _luma(colours[levels.index(b)]) < 0.5 else "black")
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["K", "V"], fontsize=11)
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"{x}" for x in strip.layer], fontsize=8 if n > 20 else 9)
    sliding = (strip.layer_kind == "sliding").to_numpy()
    for j in np.flatnonzero(sliding):
        ax.get_xticklabels()[j].set_fontweight("bold")
        ax.plot([j], [1.5], marker="^", color=OKABE_ITO["black"], ms=6, clip_on=False)
    ax.set_ylim(1.5, -0.5)
    ax.set_xlabel("layer" + ("   (▲ and bold number: sliding-window layer)" if sliding.any() else ""))
    ax.vlines(np.arange(0.5, n - 1), -0.5, 1.5, color="white", lw=0.6)
    ax.hlines([0.5], -0.5, n - 0.5, color="white", lw=2)
    cb = fig.colorbar(im, ax=ax, pad=0.01, ticks=range(k), fraction=0.03 if n > 20 else 0.05)
    cb.ax.set_yticklabels([f"{b:g}" for b in levels])
    cb.set_label("bits per element", fontsize=9)
    ax.set_title(title, fontsize=10, loc="left")
    return fig


def plan_damage(df, title: str, measured: bool) -> Figure:
    """Predicted (and measured) KL of the plan and of uniform configurations: horizontal bars, log scale."""
    n = len(df)
    fig = new_figure(10.0, max(3.0, 0.45 * n + 1.9))
    ax = fig.subplots()
    y = np.arange(n)
    h = 0.4 if measured else 0.62
    pred = df.predicted_kl.to_numpy(float)
    meas = df.measured_kl.to_numpy(float)
    ok_p = np.isfinite(pred) & (pred > 0)
    ok_m = np.isfinite(meas) & (meas > 0)
    yp = y - (h / 2 if measured else 0)
    ym = y + h / 2
    ax.barh(yp[ok_p], pred[ok_p], height=h, color=OKABE_ITO["sky"], label="predicted (sum of per-layer KL)")
    if measured:
        ax.barh(ym[ok_m], meas[ok_m], height=h, color=OKABE_ITO["vermillion"], hatch="//", edgecolor="white",
                label="measured (all layers at once, unseen text)")
    positive = np.concatenate([pred[ok_p], meas[ok_m]])
    lo = float(positive.min()) / 3 if len(positive) else 1e-6
    for i in range(n):
        if ok_p[i]:
            ax.text(pred[i], yp[i], f" {pred[i]:.2e}", va="center", fontsize=7)
        else:
            ax.text(lo, yp[i], " predicted: n/a (cell not profiled)" if not np.isfinite(pred[i]) else " predicted: 0",
                    va="center", fontsize=7)
        if measured and ok_m[i]:
            ax.text(meas[i], ym[i], f" {meas[i]:.2e}", va="center", fontsize=7)
    ax.set_xscale("log")
    if len(positive):
        ax.set_xlim(lo, float(positive.max()) * 8)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{c}  ({b:.2f} b)" for c, b in zip(df.config, df.avg_bits)], fontsize=8)
    for lab, c in zip(ax.get_yticklabels(), df.config):
        if c == "plan":
            lab.set_fontweight("bold")
    return _finish_kl_bars(fig, ax, n, title,
                           "KL(baseline ‖ quantized), mean per token (log scale); label: configuration (bits per element)")


def _finish_kl_bars(fig, ax, n: int, title: str, xlabel: str) -> Figure:
    """The common end of a horizontal KL bar chart: rows top-down, grid, legend above, title."""
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncols=2, borderaxespad=0, frameon=False)
    fig.suptitle(title, fontsize=11)
    return fig


def damage_by_length(df, model_id: str) -> Figure:
    """KL summed over layers vs context length, one line per scheme; keys left, values right."""
    fig = new_figure(11.0, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, tensor in zip(axes, ("K", "V")):
        d = df[df.tensor == tensor]
        for i, (scheme, g) in enumerate(d.groupby("scheme", sort=False)):
            g = g.sort_values("seq_len")
            g = g[g.kl_sum > 0]
            if len(g):
                ax.plot(g.seq_len, g.kl_sum, marker="os^Dv<>ph*"[i % 10], color=SERIES[i % len(SERIES)], lw=1.2,
                        ms=5, label=scheme)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per window (profile --seq-len)")
        ax.set_title("keys" if tensor == "K" else "values", fontsize=10, loc="left")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=6.5, ncol=2)
    axes[0].set_ylabel("KL summed over layers\n(one tensor of one layer quantized at a time; log)")
    fig.suptitle(f"Damage vs context length: {model_id}", fontsize=11)
    return fig


def engine_check(df, title: str) -> Figure:
    """`validate --engine`: the KL the running engine measured beside sensprof's emulation of the same configuration
    on the same tokens, per configuration and length; a configuration outside the agreement bounds is marked."""
    n = len(df)
    fig = new_figure(10.0, max(3.0, 0.45 * n + 1.9))
    ax = fig.subplots()
    y = np.arange(n)
    h = 0.4
    emu = df.compared_kl.to_numpy(float)  # what the engine was held to (report.data.read_engine_check)
    eng = df.engine_kl.to_numpy(float)
    drawn = df.numerics_draws > 0
    label = "sensprof's emulation" + (" in the engine's numerics" if drawn.any() else "") + (
        " + the engine's floor" if ((df.engine_floor_kl > 0) & ~drawn).any() else "")
    ax.barh(y - h / 2, emu, height=h, color=OKABE_ITO["sky"], label=label)
    ax.barh(y + h / 2, eng, height=h, color=OKABE_ITO["vermillion"], hatch="//", edgecolor="white",
            label="the running engine")
    for i in range(n):
        ax.text(eng[i], y[i] + h / 2, f" {eng[i]:.2e} (x{eng[i] / emu[i]:.2f})" if emu[i] > 0 else f" {eng[i]:.2e}",
                va="center", fontsize=7)
    ax.set_xscale("log")
    positive = np.concatenate([emu[emu > 0], eng[eng > 0]])
    if len(positive):
        ax.set_xlim(float(positive.min()) / 3, float(positive.max()) * 8)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{c} @ {n}" + ("" if ok else "  (disagrees)") for c, n, ok in
                        zip(df.config, df.seq_len, df.agrees)], fontsize=8)
    return _finish_kl_bars(fig, ax, n, title, "KL(engine's own baseline ‖ quantized), mean per token (log scale); "
                                              "label: configuration @ tokens")


def plans_side_by_side(strips: list, names: list[str], labels: list[list[str]], title: str) -> Figure:
    """Several plans of one model, one band per plan (its K row over its V row), layers aligned, coloured on one
    bits-per-element scale; each layer's cell pair labelled with what the plan serves there (`labels`: a vLLM
    per-layer plan's dtype, otherwise the K/V schemes)."""
    import matplotlib
    from matplotlib.colors import BoundaryNorm, ListedColormap

    n = max(len(s) for s in strips)
    rows = 2 * len(strips)
    fig = new_figure(max(7.5, 0.42 * n + 3.2), 1.0 + 1.1 * len(strips) + 0.6)
    ax = fig.subplots()
    z = np.full((rows, n), np.nan)
    for p, s in enumerate(strips):
        z[2 * p, :len(s)] = s.k_bits.to_numpy(float)
        z[2 * p + 1, :len(s)] = s.v_bits.to_numpy(float)
    levels = sorted(set(z[~np.isnan(z)].ravel().tolist()))
    k = len(levels)
    colours = matplotlib.colormaps["cividis"](np.linspace(0.0, 1.0, k) if k > 1 else [0.55])
    idx = np.where(np.isnan(z), np.nan, np.vectorize(lambda b: levels.index(b) if b == b else 0)(z))
    im = ax.imshow(np.ma.masked_invalid(idx), aspect="auto", cmap=ListedColormap(colours),
                   norm=BoundaryNorm(np.arange(-0.5, k), k), interpolation="nearest",
                   extent=(-0.5, n - 0.5, rows - 0.5, -0.5))
    fs = 6.5 if n <= 32 else 5
    for p, s in enumerate(strips):
        for j, (r, label) in enumerate(zip(s.itertuples(), labels[p])):
            top = levels.index(r.k_bits)
            ax.text(j, 2 * p + 0.5, label, ha="center", va="center", rotation=90, fontsize=fs, linespacing=1.0,
                    color="white" if _luma(colours[top]) < 0.5 else "black")
    ax.set_yticks(range(rows))
    ax.set_yticklabels([f"{name} {t}" for name in names for t in ("K", "V")], fontsize=8)
    ax.set_xticks(range(n))
    ax.set_xticklabels([str(x) for x in range(n)], fontsize=8 if n > 20 else 9)
    ax.hlines(np.arange(1.5, rows - 1, 2), -0.5, n - 0.5, color="white", lw=3)
    ax.vlines(np.arange(0.5, n - 1), -0.5, rows - 0.5, color="white", lw=0.6)
    ax.set_xlabel("layer")
    cb = fig.colorbar(im, ax=ax, pad=0.01, ticks=range(k), fraction=0.03 if n > 20 else 0.05)
    cb.ax.set_yticklabels([f"{b:g}" for b in levels])
    cb.set_label("bits per element", fontsize=9)
    ax.set_title(title, fontsize=10, loc="left")
    return fig
