"""One profile of more windows from profiles of the same cells on other windows of the same text.

More windows are what steadies a plan (docs/plan-quality.md: on SmolLM2-135M three windows met targets that one
missed); profiling them later and merging costs only the new windows. Each cell's KL on each window is kept
(`kl_windows`), so the merged KL and its spread are exactly those of one profile of all the windows; dNLL and the
local metrics are windows-weighted means (each window is the same number of positions; out_rel_l2, a ratio
over all positions, so approximately); calibration takes each
head's largest absmax, the cache statistics their windows-weighted mean (their maxima the largest).
"""

from __future__ import annotations

import math
import os

from ..errors import SensprofError

WINDOW_SETTINGS = ("windows", "seed")  # what may differ between profiles merged by windows
WEIGHTED = ("dnll", "attn_kl", "out_rel_l2")
STATS_MAX = ("outlier_ratio_max", "absmax")


def is_window_merge(settings: list[dict]) -> bool:
    """The profiles' settings differ, and only in which windows of the text they read."""
    def rest(s):
        return {k: v for k, v in s.items() if k not in WINDOW_SETTINGS}

    return any(s != settings[0] for s in settings) and all(rest(s) == rest(settings[0]) for s in settings)


def check_window_merge(dirs: list[str], metas: list[dict]) -> None:
    """Refuse what a window merge cannot join exactly: partial or screened profiles, profiles at several lengths,
    and windows read twice."""
    seen: dict[int, str] = {}
    for d, m in zip(dirs, metas):
        if not m.get("complete"):
            raise SensprofError(f"{d!r} is a partial profile; merge its layers first (`sensprof merge` of one "
                                "profile's parts), then merge windows")
        if m["settings"].get("screen"):
            raise SensprofError(f"{d!r} was profiled with --screen, whose predicted cells carry no per-window KL; "
                                "merge windows of profiles measured whole (no --screen)")
        if m.get("lengths"):
            raise SensprofError(f"{d!r} is a profile at several lengths; merge windows of single-length profiles")
        slots = m.get("window_slots")
        if not isinstance(slots, list) or len(slots) != m["settings"]["windows"]:
            raise SensprofError(f"{d!r} does not record which windows it read (a profile older than window slots); "
                                "re-profile it to merge windows")
        for s in slots:
            if s in seen:
                raise SensprofError(f"{d!r} and {seen[s]!r} both read window slot {s} of the text; profile the "
                                    "second with another --seed (merging would count that window twice)")
            seen[s] = d


def _merge_rows(rows_by_input: list[list[dict]], weights: list[int], where: str, key, cells: bool) -> list[dict]:
    """Rows keyed by `key`, one per input and cell (or head): each metric the windows-weighted mean; a cell's KL
    from its windows."""
    first = {key(r): r for r in rows_by_input[0]}
    others = [{key(r): r for r in rows} for rows in rows_by_input[1:]]
    if any(set(o) != set(first) for o in others):
        raise SensprofError(f"the profiles hold different cells in {where}; merge windows of profiles of the same "
                            "menus")
    total = sum(weights)
    out = []
    for k, r in first.items():
        rows = [r] + [o[k] for o in others]
        merged = dict(r)
        for col in WEIGHTED:
            if col in r:
                merged[col] = sum(w * x[col] for w, x in zip(weights, rows)) / total
        if cells:
            if any(not isinstance(x.get("kl_windows"), list) for x in rows):
                raise SensprofError(f"{where} holds a cell without its per-window KL ({r['tensor']} {r['scheme']}); "
                                    "re-profile it to merge windows")
            kls = [kl for x in rows for kl in x["kl_windows"]]
            mean = sum(kls) / len(kls)
            merged["kl_windows"] = kls
            merged["kl"] = max(mean, 0.0)
            merged["kl_std"] = math.sqrt(sum((kl - mean) ** 2 for kl in kls) / (len(kls) - 1)) if len(kls) > 1 else 0.0
            merged["measured"] = all(x.get("measured", True) for x in rows)
        out.append(merged)
    return out


def merge_parts(parts_by_input: list[dict[int, dict]], weights: list[int]) -> dict[int, dict]:
    """Per layer, one part whose cells cover every input's windows."""
    out = {}
    for layer, part in parts_by_input[0].items():
        parts = [p[layer] for p in parts_by_input]
        where = f"layer {layer}"
        out[layer] = {**part,
                      "rows": _merge_rows([p["rows"] for p in parts], weights, where,
                                          lambda r: (r["tensor"], r["scheme"]), True),
                      "heads": _merge_rows([p["heads"] for p in parts], weights, where,
                                           lambda r: (r["tensor"], r["scheme"], r["head"]), False),
                      "wall_time_s": sum(float(p.get("wall_time_s", 0.0)) for p in parts)}
    return out


def merge_calibration(calibrations: list[dict]) -> dict:
    """Each layer's, tensor's and KV head's largest absmax: the range every merged window needs."""
    out = {}
    for layer, by_tensor in calibrations[0].items():
        out[layer] = {t: [max(vals) for vals in zip(*(c[layer][t] for c in calibrations))] for t in by_tensor}
    return out


def merge_stats(tables: list, weights: list[int]):
    """stats.csv of all the windows: maxima the largest, the other statistics windows-weighted means."""
    import pandas as pd

    key = ["layer", "layer_kind", "tensor"]
    first = tables[0].set_index(key)
    total = sum(weights)
    merged = first.copy()
    for col in first.columns:
        cols = [t.set_index(key)[col].reindex(first.index) for t in tables]
        merged[col] = (pd.concat(cols, axis=1).max(axis=1) if col in STATS_MAX
                       else sum(w * c for w, c in zip(weights, cols)) / total)
    return merged.reset_index()[tables[0].columns]


def merged_meta(metas: list[dict], dirs: list[str]) -> dict:
    """The first input's meta with every input's windows: their count, slots and tokens, and the time they cost."""
    base = metas[0]
    windows = sum(m["settings"]["windows"] for m in metas)
    meta = {**base, "settings": {**base["settings"], "windows": windows},
            "window_slots": [s for m in metas for s in m["window_slots"]],
            "token_count": sum(int(m.get("token_count", 0)) for m in metas),
            "wall_time_s": sum(float(m.get("wall_time_s", 0.0)) for m in metas),
            "merged_from": [os.path.abspath(d) for d in dirs], "windows_merged": True}
    if all(isinstance(m.get("memory"), dict) for m in metas):
        meta["memory"] = {k: max(float(m["memory"].get(k, 0.0)) for m in metas) for k in base["memory"]}
    if all(isinstance(m.get("cost_s"), dict) for m in metas):
        meta["cost_s"] = {k: sum(float(m["cost_s"].get(k, 0.0)) for m in metas) for k in base["cost_s"]}
    return meta
