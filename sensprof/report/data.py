"""The numbers each report figure plots, extracted from the profile, stats, sweep and plan tables.

Pure pandas (no matplotlib, no torch): every function returns exactly what its figure draws, so the tests
can check the figures' numbers against the CSV files directly.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pandas as pd

from ..errors import SensprofError
from ..memory import bits_per_element
from ..artifacts import Plan, load_plan
from ..planning.plan import held_avg_bits, predicted_summary
from ..schemes import get_scheme
from ..profiling.table import summed_damage

METRICS = {
    "kl": "KL(baseline ‖ quantized) of the next token, mean per token",
    "dnll": "ΔNLL of the next token (nats per token)",
    "attn_kl": "KL of the layer's attention probabilities",
    "out_rel_l2": "relative L2 error of the layer's attention output",
}
STATS_TENSORS = {"K_pre": "K before RoPE", "K": "K after RoPE", "V": "V"}
SWEEP_COLUMNS = ["budget_avg_bits", "avg_bits", "predicted_damage", "plan"]

REFERENCE_SCHEMES = ("int4_per_token_head", "q4_0", "int4_c32", "fp8_e4m3")  # the K-vs-V figure's, first found


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise SensprofError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    return metric


def scheme_order(table, tensor: str | None = None) -> list[str]:
    """The profile's schemes (of one tensor, or all), cheapest first, ties by name."""
    t = table if tensor is None else table[table.tensor == tensor]
    bits = t.groupby("scheme").bits.first()
    return sorted(bits.index, key=lambda s: (float(bits[s]), s))


def damage_matrix(table, tensor: str, metric: str = "kl"):
    """Heatmap data: rows = layers (ascending), columns = the schemes profiled for `tensor` (cheapest first)."""
    check_metric(metric)
    t = table[table.tensor == tensor]
    m = t.pivot_table(index="layer", columns="scheme", values=metric, aggfunc="first")
    m = m.reindex(index=sorted(table.layer.unique()), columns=scheme_order(table, tensor))
    m.index.name, m.columns.name = "layer", "scheme"
    return m.astype(float)


def scheme_bits(table) -> dict[str, float]:
    """Bits per element of each profiled scheme, as the profile recorded them."""
    return {s: float(b) for s, b in table.groupby("scheme").bits.first().items()}


def common_schemes(table) -> list[str]:
    """Schemes profiled for both K and V (in scheme_order)."""
    return [s for s in scheme_order(table) if set(table[table.scheme == s].tensor) >= {"K", "V"}]


def split_reference(reference: str) -> tuple[str, str]:
    """'int4_c32 / int4_t32' -> (K scheme, V scheme); one name -> that scheme for both."""
    k, _, v = reference.partition("/")
    return k.strip(), (v or k).strip()


def pick_reference_scheme(table, scheme: str | None = None) -> str:
    """The scheme the K-vs-V figure compares at: the given one (checked), else a common default, else (per-tensor
    menus) a key layout and a value layout of equal bits, written 'K / V'."""
    both = common_schemes(table)
    if scheme is not None and "/" in scheme:
        k, v = split_reference(scheme)
        for tensor, name in (("K", k), ("V", v)):
            if name not in set(table[table.tensor == tensor].scheme):
                raise SensprofError(f"--reference-scheme {scheme!r}: {name!r} was not profiled for {tensor}; pass "
                                    "schemes the profile holds")
        return f"{k} / {v}"
    if scheme is not None:
        if scheme not in both:
            where = "was profiled for K only" if scheme in set(table.scheme) else "is not in the profile"
            raise SensprofError(f"--reference-scheme {scheme!r} {where}; pass one profiled for both K and V: "
                                f"{', '.join(both) or '(none)'}")
        return scheme
    for s in REFERENCE_SCHEMES:
        if s in both:
            return s
    if not both:
        bits_k = table[table.tensor == "K"].groupby("scheme").bits.first()
        bits_v = table[table.tensor == "V"].groupby("scheme").bits.first()
        pairs = [(k, v) for k in scheme_order(table, "K") for v in scheme_order(table, "V")
                 if abs(bits_k[k] - bits_v[v]) < 1e-9]
        if not pairs:
            raise SensprofError("the profile has no scheme measured for both K and V, nor a K and a V scheme of equal "
                                "bits, so K and V cannot be compared; pass --reference-scheme K_SCHEME/V_SCHEME")
        k, v = min(pairs, key=lambda p: (abs(bits_k[p[0]] - 5.0), p))
        return f"{k} / {v}"
    return both[0]


def layer_kinds(table) -> pd.Series:
    """layer -> 'full' / 'sliding' (the profile's `layer_kind` column)."""
    return table.groupby("layer").layer_kind.first().sort_index()


def kv_sensitivity(table, scheme: str, metric: str = "kl"):
    """Per layer at one scheme: K damage, V damage and K/V (NaN where either is <= 0)."""
    check_metric(metric)
    ks, vs = split_reference(scheme)
    k = table[(table.tensor == "K") & (table.scheme == ks)].set_index("layer")[metric]
    v = table[(table.tensor == "V") & (table.scheme == vs)].set_index("layer")[metric]
    df = pd.DataFrame({"layer_kind": layer_kinds(table), "K": k, "V": v})
    df.index.name = "layer"
    ok = (df.K > 0) & (df.V > 0)
    df["K_over_V"] = (df.K / df.V).where(ok)
    return df.reset_index()


def outlier_ratios(stats):
    """Per layer: channel outlier ratio (max/median of per-channel absmax) of K before / after RoPE and of V."""
    missing = {"layer", "layer_kind", "tensor", "outlier_ratio"} - set(stats.columns)
    if missing:
        raise SensprofError(f"stats.csv lacks columns {', '.join(sorted(missing))}; re-run `sensprof profile`")
    wide = stats.pivot_table(index="layer", columns="tensor", values="outlier_ratio", aggfunc="first")
    kinds = stats.groupby("layer").layer_kind.first()
    df = pd.DataFrame({"layer_kind": kinds})
    for t in STATS_TENSORS:
        df[t] = wide[t].astype(float) if t in wide.columns else float("nan")
    df.index.name = "layer"
    return df.sort_index().reset_index()


# --------------------------------------------------------------------------- configurations (uniform, plans)


def _layer_shapes(meta) -> list[SimpleNamespace]:
    return [SimpleNamespace(layer=i["index"], kv_heads=i["kv_heads"], head_dim=i["head_dim"], kind=i.get("kind"),
                            window=i.get("window")) for i in meta["layers"]]


def config_bits(meta, pairs) -> float:
    """Average stored bits per element (memory.py's formula, via plan.predicted_summary) of per-layer pairs."""
    layers = [SimpleNamespace(k_scheme=k, v_scheme=v, kv_heads=s.kv_heads, head_dim=s.head_dim)
              for s, (k, v) in zip(_layer_shapes(meta), pairs)]
    return predicted_summary(layers)["avg_bits"]


def config_bits_at(meta, pairs, n_tokens: int) -> float:
    """Average bits per element a cache of n_tokens really holds (plan.held_avg_bits): the full-precision sink,
    residual and incomplete-group tokens that the long-context average leaves out are counted at 16 bits."""
    layers = [SimpleNamespace(k_scheme=k, v_scheme=v, kv_heads=s.kv_heads, head_dim=s.head_dim, kind=s.kind,
                              window=s.window) for s, (k, v) in zip(_layer_shapes(meta), pairs)]
    return held_avg_bits(layers, n_tokens)


def predicted_kl(table, pairs) -> float:
    """Sum of the profile's per-layer KL for per-layer (K, V) schemes ('none' costs 0); NaN if a cell is missing."""
    return summed_damage(table, pairs)


def uniform_pairs(table, every: bool = False) -> dict[str, tuple[str, str]]:
    """Uniform configurations the profile can predict: each scheme on K and V, and KIVI pairs (int<b>_c<G> keys,
    int<b>_t<G> values); with `every`, also every key scheme with every value scheme of the menu."""
    out = {f"uniform {s}": (s, s) for s in common_schemes(table)}
    if every:
        for k in scheme_order(table, "K"):
            for v in scheme_order(table, "V"):
                if k != v and not any(get_scheme(x).is_engine or get_scheme(x).query for x in (k, v)):
                    out[f"uniform {k} / {v}"] = (k, v)
    ks, vs = set(table[table.tensor == "K"].scheme), set(table[table.tensor == "V"].scheme)
    for k in scheme_order(table, "K"):
        sch = get_scheme(k)
        if sch.granularity == "channel" and sch.format == "int" and not (sch.pre_rope or sch.residual or sch.sink):
            v = k.replace("_c", "_t", 1)
            if v in vs and k in ks:
                out[f"uniform KIVI-{sch.bits} ({k} / {v})"] = (k, v)
    return out


def uniform_configs(table, meta, every: bool = False):
    """Uniform configurations: avg bits and predicted KL (sum over layers of the profile's KL)."""
    n = len(meta["layers"])
    rows = [{"config": name, "k_scheme": k, "v_scheme": v, "avg_bits": config_bits(meta, [(k, v)] * n),
             "predicted_kl": predicted_kl(table, [(k, v)] * n)} for name, (k, v) in uniform_pairs(table, every).items()]
    df = pd.DataFrame(rows, columns=["config", "k_scheme", "v_scheme", "avg_bits", "predicted_kl"])
    return df.sort_values(["avg_bits", "config"]).reset_index(drop=True)


def near_frontier(df, slack: float = 1.5):
    """Rows no cheaper-or-equal row beats by more than `slack` in predicted KL: the uniform configurations worth
    measuring (the prediction ranks them, the measurement decides)."""
    keep = []
    for r in df.itertuples():
        cheaper = df[(df.avg_bits <= r.avg_bits + 1e-9) & (df.index != r.Index)]
        keep.append(not (cheaper.predicted_kl * slack < r.predicted_kl).any())
    return df[keep]


def plan_strip(plan: Plan):
    """The plan per layer: K and V scheme and their bits per element (memory.bits_per_element)."""
    rows = [{"layer": p.layer, "layer_kind": p.kind, "k_scheme": p.k_scheme, "v_scheme": p.v_scheme,
             "k_bits": bits_per_element(get_scheme(p.k_scheme), p.head_dim),
             "v_bits": bits_per_element(get_scheme(p.v_scheme), p.head_dim),
             "k_damage": p.k_damage, "v_damage": p.v_damage} for p in plan.layers]
    return pd.DataFrame(rows)


def engine_checks(plan_path: str) -> list[tuple[str, str]]:
    """(engine, CSV) of each `sensprof validate --engine` result beside the plan."""
    stem = os.path.splitext(plan_path)[0]
    return [(e, f"{stem}.engine-{e}.csv") for e in ("vllm", "llamacpp") if os.path.isfile(f"{stem}.engine-{e}.csv")]


ENGINE_COLUMNS = ("config", "engine", "seq_len", "tokens", "predicted_kl", "emulated_kl", "engine_kl", "kl_ratio",
                  "emulated_dnll", "engine_dnll", "dnll_diff", "dnll_diff_se", "dnll_corr", "agrees")


def read_engine_check(csv: str):
    """The columns of an engine check the report shows; a damaged file is refused with the fix."""
    import pandas as pd

    try:
        df = pd.read_csv(csv)
    except (OSError, ValueError) as e:
        raise SensprofError(f"cannot read {csv}: {e}; re-run `sensprof validate PLAN --engine ...`") from None
    missing = [c for c in ENGINE_COLUMNS if c not in df.columns]
    if missing or df.empty:
        raise SensprofError(f"{csv} is not a `sensprof validate --engine` table (missing {missing or 'rows'}); re-run it")
    floor = df["engine_floor_kl"] if "engine_floor_kl" in df.columns else 0.0  # llama.cpp's; absent before it existed
    drawn = df["numerics_draws"] if "numerics_draws" in df.columns else 0
    # what the engine was held to: the emulation (llama.cpp's: in its numerics); in llama.cpp tables made before
    # those numerics were emulated, the float32 emulation plus the engine's floor
    compared = df["emulated_kl"] + floor * (drawn == 0)
    return df[list(ENGINE_COLUMNS)].assign(engine_floor_kl=floor, numerics_draws=drawn, compared_kl=compared)


def validation_path(plan_path: str) -> str:
    """Where `sensprof validate` writes its table by default: beside the plan."""
    return os.path.splitext(plan_path)[0] + ".validation.csv"


def check_plan_matches(plan: Plan, meta, where: str) -> None:
    plan.check_model(meta["model"]["fingerprint"], f"the profile's model {meta['model']['id']}",
                     f"pass plans made from this profile's model (not {where!r})")
    if len(plan.layers) != len(meta["layers"]):
        raise SensprofError(f"plan {where!r} has {len(plan.layers)} layers, the profile {len(meta['layers'])}; "
                            "pass plans made from this profile")


def load_report_plan(path: str, meta) -> Plan:
    plan = load_plan(path)
    check_plan_matches(plan, meta, path)
    return plan


def plan_damage(plan: Plan, plan_path: str, table, meta):
    """Predicted (and, if `sensprof validate` wrote its CSV beside the plan, measured) KL of the plan and of
    uniform configurations. Returns (DataFrame config/avg_bits/predicted_kl/measured_kl, validation path or None).

    Predicted KL is the sum of the profile's per-layer KL; with a validation CSV both columns are that file's
    (measured on windows the profile did not use)."""
    vpath = validation_path(plan_path)
    cols = ["config", "avg_bits", "predicted_kl", "measured_kl"]
    if os.path.isfile(vpath):
        try:
            v = pd.read_csv(vpath)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            raise SensprofError(f"{vpath!r} is corrupt; re-run `sensprof validate {plan_path}`") from None
        missing = set(cols) - set(v.columns)
        if missing or "plan" not in set(v.config):
            raise SensprofError(f"{vpath!r} is not a `sensprof validate` table (lacks "
                                f"{', '.join(sorted(missing)) or 'the plan row'}); re-run `sensprof validate {plan_path}`")
        if "seq_len" in v.columns:  # validated at several lengths: the report shows the profile's length
            v = v[v.seq_len == v.seq_len.iloc[0]]
        df = v[cols].copy()
        df = pd.concat([df[df.config == "plan"], df[df.config != "plan"]])
        return df.reset_index(drop=True).astype({"avg_bits": float, "predicted_kl": float, "measured_kl": float}), vpath
    pairs = [(p.k_scheme, p.v_scheme) for p in plan.layers]
    rows = [{"config": "plan", "avg_bits": plan.predicted.avg_bits, "predicted_kl": predicted_kl(table, pairs),
             "measured_kl": float("nan")}]
    u = uniform_configs(table, meta)
    rows += [{"config": r.config, "avg_bits": r.avg_bits, "predicted_kl": r.predicted_kl, "measured_kl": float("nan")}
             for r in u.itertuples()]
    return pd.DataFrame(rows, columns=cols), None


# --------------------------------------------------------------------------- sweeps


def _sweep_plan(path: str, sweep_dir: str) -> Plan | None:
    for p in (path, os.path.join(sweep_dir, os.path.basename(str(path)))):
        if isinstance(p, str) and os.path.isfile(p):
            try:
                return load_plan(p)
            except SensprofError:
                return None
    return None


def sweep_uniform(sweep_dir: str):
    """The uniform configurations a validated sweep measured (its uniform.csv), or None."""
    path = os.path.join(sweep_dir, "uniform.csv")
    if not os.path.exists(path):
        return None
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise SensprofError(f"{path!r} is corrupt; re-run `sensprof sweep --validate`") from None
    if not {"config", "avg_bits", "measured_kl"} <= set(df.columns):
        raise SensprofError(f"{path!r} lacks config/avg_bits/measured_kl; re-run `sensprof sweep --validate`")
    return df


def sweep_points(sweep_dir: str, table, meta):
    """A sweep directory's plans: target, avg bits, predicted KL, measured KL (NaN without --validate), frontier.

    The target and objective come from the plan files; with an objective other than KL the predicted KL is
    recomputed from the profile, so it can sit beside the measured KL."""
    if os.path.isfile(sweep_dir):
        raise SensprofError(f"sweep directory {sweep_dir!r} is a file, not a folder; pass the folder `sensprof "
                            "sweep` wrote (it holds sweep.csv)")
    if not os.path.isdir(sweep_dir):
        raise SensprofError(f"sweep directory {sweep_dir!r} does not exist; write one with "
                            "`sensprof sweep PROFILE_DIR --out DIR`")
    csv = os.path.join(sweep_dir, "sweep.csv")
    if not os.path.isfile(csv):
        raise SensprofError(f"{sweep_dir!r} holds no sweep.csv; pass a directory written by `sensprof sweep`")
    try:
        df = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise SensprofError(f"{csv!r} is corrupt; re-run `sensprof sweep`") from None
    missing = set(SWEEP_COLUMNS) - set(df.columns)
    if missing:
        raise SensprofError(f"{csv!r} lacks columns {', '.join(sorted(missing))}; re-run `sensprof sweep`")
    rows = []
    for r in df.itertuples():
        plan = _sweep_plan(r.plan, sweep_dir)
        target, objective = (plan.target, plan.objective) if plan else (None, "kl")
        if plan is not None:
            check_plan_matches(plan, meta, str(r.plan))
        pred = float(r.predicted_damage)
        if objective != "kl":
            pred = predicted_kl(table, [(p.k_scheme, p.v_scheme) for p in plan.layers])
        rows.append({"target": target, "objective": objective, "budget_avg_bits": float(r.budget_avg_bits),
                     "avg_bits": float(r.avg_bits), "predicted_kl": pred,
                     "measured_kl": float(getattr(r, "measured_kl", float("nan"))),
                     "engine": str(getattr(r, "engine", "")), "frontier": bool(getattr(r, "frontier", True)),
                     "avg_bits_at_len": float(getattr(r, "avg_bits_at_len", float("nan"))),
                     "validation_tokens": str(getattr(r, "validation_tokens", ""))})
    out = pd.DataFrame(rows)
    if out.empty:
        raise SensprofError(f"{csv!r} has no rows; re-run `sensprof sweep` with feasible --avg-bits")
    known = out.target.dropna()
    out["target"] = known.iloc[0] if len(known) else os.path.basename(os.path.normpath(sweep_dir))
    return out.sort_values("avg_bits").reset_index(drop=True)


def held_at_validation_length(sweeps, uniform, uniform_measured, meta):
    """The frontier's memory axis as a cache of the validation length holds it, where every validated sweep was
    measured at one length: (sweeps, uniform, uniform_measured) with avg_bits replaced, and that length; else None."""
    tokens = {str(t).partition("x")[2] for _, df in sweeps for t in df.validation_tokens}
    if len(tokens) != 1 or not next(iter(tokens)).isdigit() or uniform_measured is None \
            or "avg_bits_at_len" not in uniform_measured or any(df.avg_bits_at_len.isna().any() for _, df in sweeps):
        return None
    n = int(next(iter(tokens)))
    layers = len(meta["layers"])
    held = {c: b for c, b in zip(uniform_measured.config, uniform_measured.avg_bits_at_len)}
    for r in uniform.itertuples():
        if r.config not in held and isinstance(getattr(r, "k_scheme", None), str):
            held[r.config] = config_bits_at(meta, [(r.k_scheme, r.v_scheme)] * layers, n)
    uniform = uniform[uniform.config.isin(held)]
    return ([(label, df.assign(avg_bits=df.avg_bits_at_len)) for label, df in sweeps],
            uniform.assign(avg_bits=[held[c] for c in uniform.config]),
            uniform_measured.assign(avg_bits=uniform_measured.avg_bits_at_len), n)


def damage_by_length(profile):
    """Rows tensor, scheme, seq_len, KL summed over layers, for a profile holding several --seq-len; empty otherwise."""
    from ..profiling.table import length_profiles

    rows = []
    by_len = length_profiles(profile)
    if len(by_len) > 1:
        for n, p in by_len.items():
            for (tensor, scheme), g in p.table.groupby(["tensor", "scheme"]):
                rows.append({"tensor": tensor, "scheme": scheme, "seq_len": n, "kl_sum": float(g.kl.sum())})
    return pd.DataFrame(rows, columns=["tensor", "scheme", "seq_len", "kl_sum"])
