"""The profile artifact on disk: metadata, per-layer parts, combined tables; validation and merge.

Every file is written atomically (temp file + rename), so a kill at any moment leaves either the
old or the new version, never a torn one; parts are per layer, so a resumed run redoes at most one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import SensprofError
from ..files import (LOCK, atomic_write_bytes, atomic_write_text, check_artifact, check_no_symlinks, check_writable,
                    output_lock, read_json, safe_name, write_json)
from ..specs import compact_ranges
from .merge_windows import (check_window_merge, is_window_merge, merge_calibration, merge_parts, merge_stats,
                            merged_meta)

FORMAT_VERSION = 1
KIND = "sensprof-profile"
META, CALIBRATION, PARTS = "meta.json", "calibration.json", "parts"
LENGTHS = "lengths"  # a profile of several --seq-len: the longest in the directory, each other in lengths/<L>/
TABLE, HEADS, STATS = "profile.csv", "heads.csv", "stats.csv"
# each measured cell's KL on each profile window (0 = the first of meta.json's window_slots), whose mean and spread
# profile.csv holds: how much of a cell one window carries; profiles written before it have no windows.csv
WINDOWS = "windows.csv"
# measured: False for a cell whose KL a screened profile (--screen) predicted instead of measuring
TABLE_COLUMNS = ["layer", "layer_kind", "tensor", "scheme", "bits", "kl", "kl_std", "dnll", "attn_kl", "out_rel_l2",
                 "measured"]
OBJECTIVES = {"kl": "kl", "dnll": "dnll", "local": "out_rel_l2"}  # --objective -> the profile.csv column it sums
HEAD_COLUMNS = ["layer", "tensor", "scheme", "head", "attn_kl", "out_rel_l2"]
WINDOW_COLUMNS = ["layer", "tensor", "scheme", "window", "kl"]
STATS_COLUMNS = ["layer", "layer_kind", "tensor", "outlier_ratio", "outlier_ratio_max", "kurtosis", "absmax"]
OWN_FILES = {META, CALIBRATION, PARTS, TABLE, HEADS, STATS, WINDOWS, LENGTHS}


def _csv_text(rows: list[dict], columns: list[str]) -> str:
    import pandas as pd

    return pd.DataFrame(rows, columns=columns).to_csv(index=False)


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
    atomic_write_text(path, _csv_text(rows, columns))


def remove_temp_files(out_dir: str) -> None:
    """Delete the temporary files a killed run left in a profile directory (atomic writes not renamed yet)."""
    for d in (out_dir, os.path.join(out_dir, PARTS)):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.startswith(".tmp-") and os.path.isfile(os.path.join(d, name)):
                    os.unlink(os.path.join(d, name))


def part_path(out_dir: str, layer: int) -> str:
    return os.path.join(out_dir, PARTS, f"layer_{layer:04d}.json")


def check_out_dir(out_dir: str, settings: dict) -> dict | None:
    """Return the existing metadata to resume from, or None for a fresh directory.

    Refuses a directory that cannot be written, holds something else, or a profile of another model or settings.
    Resuming, removes the temporary files of a killed run and rebuilds the tables and meta.json's layers_done
    from parts/ (sync_with_parts), so a kill right after a part is written loses nothing.
    """
    check_writable(out_dir)
    if not os.path.exists(out_dir):
        return None
    check_no_symlinks(out_dir, sorted(OWN_FILES))
    entries = {e for e in os.listdir(out_dir) if not e.startswith(".tmp-") and e != LOCK}
    if not entries:
        remove_temp_files(out_dir)
        return None
    if META not in entries:
        if entries - OWN_FILES:
            raise SensprofError(
                f"--out {out_dir!r} is not empty and holds no sensprof profile; pass a new or empty directory")
        if _part_names(out_dir):
            raise SensprofError(
                f"--out {out_dir!r} holds profile parts but no meta.json, so which model and settings they belong "
                "to is unknown; pass another --out, or delete that directory and re-run `sensprof profile`")
        remove_temp_files(out_dir)
        return None
    meta = load_meta(out_dir)
    old = meta.get("settings", {})
    implied = {"reads": "streaming"}  # a setting left out of meta.json where it has its default (profile.py)
    diffs = [f"{k}: {old.get(k, implied.get(k))!r} there, {settings.get(k, implied.get(k))!r} now"
             for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if diffs:
        raise SensprofError(
            f"--out {out_dir!r} holds a profile of a different model or settings ({'; '.join(diffs[:3])}); "
            "pass another --out or delete that directory")
    remove_temp_files(out_dir)
    return sync_with_parts(out_dir, meta)


LAYER_KEYS = ("index", "kind", "window", "kv_heads", "head_dim")


def check_profile_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise SensprofError(f"profile directory {out_dir!r} is a file, not a folder; pass the folder `sensprof "
                            "profile` wrote (it holds meta.json)")
    if not os.path.isdir(out_dir):
        raise SensprofError(f"profile directory {out_dir!r} does not exist; run `sensprof profile --out {out_dir}`")


def load_meta(out_dir: str) -> dict:
    check_profile_dir(out_dir)
    path = os.path.join(out_dir, META)
    meta = read_json(path, "profile metadata")
    check_artifact(meta, KIND, FORMAT_VERSION, out_dir, "profile", "profile")
    layers, model = meta.get("layers"), meta.get("model")
    problem = None
    if not isinstance(meta.get("settings"), dict):
        problem = "it has no 'settings'"
    elif not isinstance(model, dict) or not {"id", "fingerprint"} <= set(model):
        problem = "it has no 'model' id and fingerprint"
    elif not isinstance(layers, list) or not layers:
        problem = "it has no 'layers'"
    elif any(not isinstance(x, dict) or not set(LAYER_KEYS) <= set(x) for x in layers) or \
            [x["index"] for x in layers] != list(range(len(layers))):
        problem = f"its 'layers' are not layers 0-{len(layers) - 1} with {', '.join(LAYER_KEYS)}"
    elif bad := next((x for x in layers if not all(_positive_int(x[k]) for k in ("kv_heads", "head_dim"))), None):
        problem = (f"its layer {bad['index']} has kv_heads {bad['kv_heads']!r} and head_dim {bad['head_dim']!r}, "
                   "which must be positive integers")
    elif not isinstance(meta.get("layers_done", []), list) or \
            not set(meta.get("layers_done", [])) <= set(range(len(layers))):
        problem = "its 'layers_done' are not layer indices"
    if problem:
        raise SensprofError(f"profile metadata {path!r} is damaged ({problem}); delete that directory and re-run "
                            "`sensprof profile`")
    return meta


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _part_names(out_dir: str) -> list[str]:
    d = os.path.join(out_dir, PARTS)
    return sorted(n for n in os.listdir(d) if n.startswith("layer_") and n.endswith(".json")) if os.path.isdir(d) else []


REDO_PART = "delete it and re-run the same `sensprof profile` command to redo that layer"


def load_parts(out_dir: str, meta: dict | None = None) -> dict[int, dict]:
    """The per-layer parts of a profile directory; with `meta` (the profile's meta.json), each is checked to be a
    layer of that model, named for its layer, with each cell once and finite, non-negative damage."""
    d = os.path.join(out_dir, PARTS)
    parts = {}
    for name in _part_names(out_dir):
        path = os.path.join(d, name)
        part = read_json(path, "profile part")
        if not (isinstance(part, dict) and isinstance(part.get("layer"), int)
                and isinstance(part.get("rows"), list) and isinstance(part.get("heads"), list)):
            raise SensprofError(f"profile part {path!r} is damaged (no layer, rows and heads); {REDO_PART}")
        if meta is not None:
            check_part(part, name, path, meta)
        parts[part["layer"]] = part
    return parts


def check_part(part: dict, name: str, path: str, meta: dict) -> None:
    """Refuse a part that does not belong to the profile `meta` describes (see load_parts)."""
    import pandas as pd

    layer, n = part["layer"], len(meta["layers"])
    stem = name.removeprefix("layer_").removesuffix(".json")
    if not stem.isdigit() or int(stem) != layer:
        raise SensprofError(f"profile part {path!r} holds layer {layer} but is named for another; {REDO_PART}")
    if not 0 <= layer < n:
        raise SensprofError(f"profile part {path!r} holds layer {layer}, which the profiled model (layers 0-{n - 1}) "
                            f"does not have; {REDO_PART}")
    rows = part["rows"]
    if any(not isinstance(r, dict) for r in rows + part["heads"]):
        raise SensprofError(f"profile part {path!r} is damaged (a row is not an object); {REDO_PART}")
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    check_cells(table, f"profile part {path!r}", REDO_PART)
    if len(table) and (table.layer.astype(int) != layer).any():
        raise SensprofError(f"profile part {path!r} of layer {layer} holds rows of another layer; {REDO_PART}")
    dup = table.duplicated(["tensor", "scheme"])
    if dup.any():
        r = table[dup].iloc[0]
        raise SensprofError(f"profile part {path!r} holds the cell layer {layer} {r.tensor} {r.scheme} twice; "
                            f"{REDO_PART}")


def window_rows(parts: dict[int, dict]) -> list[dict]:
    """windows.csv's rows: the per-window KL a part's measured cells carry (screened cells have none)."""
    return [{"layer": r["layer"], "tensor": r["tensor"], "scheme": r["scheme"], "window": w, "kl": max(kl, 0.0)}
            for layer in sorted(parts) for r in parts[layer]["rows"] for w, kl in enumerate(r.get("kl_windows") or [])]


def _table_texts(parts: dict[int, dict]) -> dict[str, str]:
    rows = [{"measured": True, **r} for layer in sorted(parts) for r in parts[layer]["rows"]]
    heads = [r for layer in sorted(parts) for r in parts[layer]["heads"]]
    return {TABLE: _csv_text(rows, TABLE_COLUMNS), HEADS: _csv_text(heads, HEAD_COLUMNS),
            WINDOWS: _csv_text(window_rows(parts), WINDOW_COLUMNS)}


def write_tables(out_dir: str, parts: dict[int, dict]) -> None:
    for name, text in _table_texts(parts).items():
        atomic_write_text(os.path.join(out_dir, name), text)


def sync_with_parts(out_dir: str, meta: dict) -> dict:
    """Bring profile.csv, heads.csv, windows.csv and meta.json's layers_done / complete up to what parts/ holds (a
    kill after a part is written and before they are leaves them behind); rewrites only what differs. Returns meta."""
    parts = load_parts(out_dir, meta)
    for name, text in _table_texts(parts).items():
        path = os.path.join(out_dir, name)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                same = f.read() == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            atomic_write_text(path, text)
    done = {"layers_done": sorted(parts), "complete": len(parts) == len(meta["layers"])}
    if any(meta.get(k) != v for k, v in done.items()):
        meta = {**meta, **done}
        write_json(os.path.join(out_dir, META), meta)
    return meta


METRICS = ("bits", "kl", "kl_std", "dnll", "attn_kl", "out_rel_l2")
# dnll may be negative (quantization noise can lower the NLL a little); the others are distances
NONNEGATIVE = ("layer", "head", "bits", "kl", "kl_std", "attn_kl", "out_rel_l2")


def check_cells(table, where: str, fix: str) -> None:
    """Refuse a table (profile.csv, heads.csv or a part's rows) with a value that is not a number, NaN, infinite,
    or a negative distance in a metric column: the planner would fail on it or trust it."""
    import numpy as np
    import pandas as pd

    for col in [c for c in ("layer", "head", *METRICS) if c in table.columns]:
        values = pd.to_numeric(table[col], errors="coerce")
        for bad, why in ((values.isna() & table[col].notna(), "not a number"), (~np.isfinite(values), "not finite"),
                         ((values < 0) & (col in NONNEGATIVE), "negative, which a distance cannot be")):
            if bad.any():
                i = bad.idxmax()
                v = table[col][i]
                cell = " ".join(f"{'head ' if c == 'head' else ''}{table[c][i]}"
                                for c in ("layer", "tensor", "scheme", "head") if c in table)
                shown = v if isinstance(v, str) else f"{float(v):g}"
                raise SensprofError(f"{where} has {col} = {shown} at layer {cell}, which is {why}; {fix}")


def check_rows(table, key: list[str], n_layers: int, where: str, fix: str) -> None:
    """Refuse a table with a cell twice (the planner would read one copy and the plan record another) or a
    layer the profiled model does not have."""
    if not set(key) <= set(table.columns) or table.empty:
        return
    layers = table.layer.astype(float)
    out = (layers < 0) | (layers >= n_layers) | (layers != layers.round())
    if out.any():
        raise SensprofError(f"{where} has layer {float(layers[out.idxmax()]):g}, which the profiled model (layers "
                            f"0-{n_layers - 1}) does not have; {fix}")
    dup = table.duplicated(key)
    if dup.any():
        r = table[dup].iloc[0]
        cell = " ".join(f"{'head ' if c == 'head' else ''}{r[c]}" for c in key)
        times = int((table[key] == r[key]).all(axis=1).sum())
        raise SensprofError(f"{where} holds the cell layer {cell} {times} times; {fix}")


def _check_whole_line(path: str, where: str, fix: str) -> None:
    """sensprof writes each table whole, ending in a newline; a last line without one was cut off."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would hang the open
        raise SensprofError(f"{where} is not a regular file (a folder, FIFO or device); {fix}")
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                raise SensprofError(f"{where} is truncated (its last line is cut off); {fix}")


def expected_cells(meta: dict, layers) -> set[tuple[int, str, str]]:
    """The (layer, tensor, scheme) cells a profile of these settings holds for `layers`, as the profiler picks
    them: each tensor's menu, less schemes for the other tensor and pre-RoPE keys of layers without RoPE."""
    from ..schemes import get_scheme

    settings, has_rope = meta["settings"], meta.get("has_rope") or []
    out = set()
    for tensor in ("K", "V"):
        for name in settings.get(f"{tensor.lower()}_schemes") or []:
            try:
                s = get_scheme(name)
            except SensprofError:  # a scheme this version does not know: its cells are not checked
                continue
            if s.applies_to(tensor) and not s.is_identity:
                out |= {(i, tensor, name) for i in layers
                        if not s.pre_rope or (has_rope[i] if i < len(has_rope) else True)}
    return out


def check_absmax(by_tensor, where: str, fix: str) -> None:
    """Calibration absmax (tensor -> per-KV-head values) must be finite numbers >= 0: they become scales."""
    import math

    if not isinstance(by_tensor, dict):
        raise SensprofError(f"{where} has calibration {str(by_tensor)[:60]} where tensor -> absmax belongs; {fix}")
    for tensor, values in by_tensor.items():
        if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                               or not math.isfinite(v) or v < 0 for v in values):
            raise SensprofError(f"{where} has a {tensor} calibration absmax that is not finite numbers >= 0 "
                                f"({str(values)[:60]}); {fix}")


@dataclass
class Profile:
    """A profile as the Python API returns it: pandas tables plus the metadata."""

    table: object  # DataFrame, one row per layer x tensor x scheme
    heads: object  # DataFrame, local metrics per query head
    stats: object  # DataFrame, per-layer statistics of the cached tensors
    meta: dict
    calibration: dict
    path: str | None = None
    windows: object = None  # DataFrame of WINDOW_COLUMNS, or None for a profile written before windows.csv


def load_profile(out_dir: str, require_complete: bool = False) -> Profile:
    meta = load_meta(out_dir)
    if require_complete and not meta.get("complete"):
        missing = sorted(set(range(len(meta["layers"]))) - set(meta.get("layers_done", [])))
        raise SensprofError(
            f"profile {out_dir!r} is partial (layers {compact_ranges(missing)} missing); finish it with "
            "`sensprof profile` or join its parts with `sensprof merge`")
    rebuild = "re-run the same `sensprof profile` (or `sensprof merge`) command: it rebuilds the table from parts/"
    redo = "delete it and re-run the same `sensprof profile` command (finished layers are kept)"
    table, heads, stats = (_read_table(out_dir, name, redo if name == STATS else rebuild)
                           for name in (TABLE, HEADS, STATS))
    if list(table.columns) == TABLE_COLUMNS[:-1]:  # written before --screen: every cell measured
        table["measured"] = True
    if list(table.columns) != TABLE_COLUMNS:
        raise SensprofError(f"profile {out_dir!r} has an unexpected table layout; re-run `sensprof profile`")
    check_cells(table, f"{TABLE} of profile {out_dir!r}", rebuild)
    check_cells(heads, f"{HEADS} of profile {out_dir!r}", rebuild)
    for name, t, key in ((TABLE, table, ["layer", "tensor", "scheme"]), (HEADS, heads, ["layer", "tensor", "scheme",
                                                                                         "head"])):
        check_rows(t, key, len(meta["layers"]), f"{name} of profile {out_dir!r}", rebuild)
    missing = expected_cells(meta, meta.get("layers_done", [])) - set(
        zip(table.layer.astype(int), table.tensor.astype(str), table.scheme.astype(str)))
    if missing:
        layer, tensor, scheme = min(missing)
        raise SensprofError(f"{TABLE} of profile {out_dir!r} is incomplete: it lacks {len(missing)} cells of the "
                            f"layers meta.json lists as done (e.g. layer {layer} {tensor} {scheme}); {rebuild}")
    windows = _load_windows(out_dir, meta, rebuild)
    calibration = read_json(os.path.join(out_dir, CALIBRATION), "calibration")
    if not isinstance(calibration, dict):
        raise SensprofError(f"calibration of profile {out_dir!r} is not a mapping of layers; {redo}")
    for layer, by_tensor in calibration.items():
        check_absmax(by_tensor, f"calibration.json of profile {out_dir!r} (layer {layer})", redo)
    return Profile(table, heads, stats, meta, calibration, out_dir, windows)


def _read_table(out_dir: str, name: str, fix: str):
    """One of the profile's CSV tables, its last line whole (a write cut short says so in one line)."""
    import pandas as pd

    path, where = os.path.join(out_dir, name), f"{name} of profile {out_dir!r}"
    if not os.path.exists(path):
        raise SensprofError(f"profile {out_dir!r} lacks {name}; re-run `sensprof profile`")
    _check_whole_line(path, where, fix)
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise SensprofError(f"{where} is corrupt; {fix}") from None


def _load_windows(out_dir: str, meta: dict, fix: str):
    """windows.csv, checked as profile.csv is; None where the profile predates it."""
    if not os.path.exists(os.path.join(out_dir, WINDOWS)):
        return None
    where = f"{WINDOWS} of profile {out_dir!r}"
    windows = _read_table(out_dir, WINDOWS, fix)
    if list(windows.columns) != WINDOW_COLUMNS:
        raise SensprofError(f"{where} has an unexpected layout; {fix}")
    check_cells(windows, where, fix)
    check_rows(windows, ["layer", "tensor", "scheme", "window"], len(meta["layers"]), where, fix)
    return windows


def usable_cells(profile):
    """The profile's rows, less those a since-corrected emulation measured (schemes.REVISIONS), said once."""
    import sys

    from ..schemes import scheme_revision

    recorded = profile.meta.get("schemes", {})
    stale = sorted(n for n in set(profile.table.scheme)
                   if recorded.get(n, {}).get("revision", 1) < scheme_revision(n))
    if stale:
        print(f"sensprof: note: ignoring {', '.join(stale)}: this profile measured them with an earlier emulation; "
              "re-profile them (`sensprof profile --schemes ...` into a new --out) to plan with them", file=sys.stderr)
    return profile.table[~profile.table.scheme.isin(stale)]


def summed_damage(table, pairs, column: str = "kl") -> float:
    """The additive prediction: per-layer (K, V) schemes' `column` summed over layers ('none' costs 0); NaN where
    the table lacks a cell (or there is no table)."""
    if table is None:
        return float("nan")
    idx = table.set_index(["layer", "tensor", "scheme"])[column]
    total = 0.0
    for layer, (k, v) in enumerate(pairs):
        for tensor, s in (("K", k), ("V", v)):
            if s == "none":
                continue
            if (layer, tensor, s) not in idx.index:
                return float("nan")
            total += float(idx.loc[(layer, tensor, s)])
    return total


def default_out_dir(model: str) -> str:
    """profiles/<model name>, the name cleaned for a directory."""
    return os.path.join("profiles", safe_name(model))


def length_dir(out_dir: str, seq_len: int) -> str:
    return os.path.join(out_dir, LENGTHS, str(seq_len))


def length_profiles(profile: Profile) -> dict[int, Profile]:
    """seq_len -> profile, for a profile written with several --seq-len (just itself otherwise)."""
    own = int(profile.meta["settings"]["seq_len"])
    out = {own: profile}
    for n in profile.meta.get("lengths") or []:
        if int(n) != own and profile.path and os.path.isdir(length_dir(profile.path, int(n))):
            out[int(n)] = load_profile(length_dir(profile.path, int(n)))
    return dict(sorted(out.items()))


def merge_profiles(dirs: list[str], out_dir: str) -> dict:
    """Join profiles of the same model and settings computed for different layers (e.g. on several machines), or
    whole profiles of the same settings on other windows of the same text (merge_windows)."""
    if not dirs:
        raise SensprofError("merge needs at least one profile directory")
    for d in dirs:
        if os.path.abspath(d) == os.path.abspath(out_dir) or (os.path.exists(out_dir) and os.path.exists(d)
                                                              and os.path.samefile(d, out_dir)):
            raise SensprofError(f"merge --out {out_dir!r} is also one of its inputs, which it would rewrite; pass a "
                                "new directory as --out")
    metas = [load_meta(d) for d in dirs]
    base = metas[0]
    if is_window_merge([m["settings"] for m in metas]):
        return _merge_windows(dirs, metas, out_dir)
    for d, m in zip(dirs[1:], metas[1:]):
        if m["settings"] != base["settings"]:
            keys = [k for k in base["settings"] if base["settings"].get(k) != m["settings"].get(k)]
            raise SensprofError(
                f"{d!r} was profiled with other settings than {dirs[0]!r} (differs in {', '.join(keys)}); "
                "only parts of one profile can be merged")
    check_writable(out_dir)
    with output_lock(out_dir):
        check_out_dir(out_dir, base["settings"])
        parts: dict[int, dict] = {}
        for d, m in zip(dirs, metas):
            check_no_symlinks(d, [PARTS], "merge input")
            if len(m["layers"]) != len(base["layers"]):
                raise SensprofError(f"{d!r} is a profile of {len(m['layers'])} layers, {dirs[0]!r} of "
                                    f"{len(base['layers'])}; only parts of one profile can be merged")
            for layer, part in load_parts(d, m).items():
                if layer in parts and parts[layer]["rows"] != part["rows"]:
                    raise SensprofError(f"layer {layer} appears in two inputs with different results; merge each "
                                        "layer from one run only")
                parts.setdefault(layer, part)
        os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)
        for layer, part in parts.items():
            write_json(part_path(out_dir, layer), part)
        for name in (CALIBRATION, STATS):
            with open(os.path.join(dirs[0], name), "rb") as f:
                atomic_write_bytes(os.path.join(out_dir, name), f.read())
        write_tables(out_dir, parts)
        meta = dict(base)
        meta["layers_done"] = sorted(parts)
        meta["complete"] = len(parts) == len(base["layers"])
        meta["wall_time_s"] = sum(float(m.get("wall_time_s", 0.0)) for m in metas)
        meta["merged_from"] = [os.path.abspath(d) for d in dirs]
        write_json(os.path.join(out_dir, META), meta)
    return meta


def _merge_windows(dirs: list[str], metas: list[dict], out_dir: str) -> dict:
    """merge_profiles of whole profiles on other windows: one profile of all their windows."""
    base = metas[0]
    for d, m in zip(dirs[1:], metas[1:]):
        if len(m["layers"]) != len(base["layers"]) or m["model"] != base["model"]:
            raise SensprofError(f"{d!r} is a profile of another model than {dirs[0]!r}; merge profiles of one model")
    check_window_merge(dirs, metas)
    for d in dirs:
        check_no_symlinks(d, [PARTS], "merge input")
    profiles = [load_profile(d, require_complete=True) for d in dirs]  # every table checked before any is read
    weights = [int(m["settings"]["windows"]) for m in metas]
    parts = merge_parts([load_parts(d, m) for d, m in zip(dirs, metas)], weights)
    meta = merged_meta(metas, dirs)
    check_writable(out_dir)
    with output_lock(out_dir):
        check_out_dir(out_dir, meta["settings"])
        os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)
        for layer, part in parts.items():
            write_json(part_path(out_dir, layer), part)
        write_json(os.path.join(out_dir, CALIBRATION), merge_calibration([p.calibration for p in profiles]))
        stats = merge_stats([p.stats for p in profiles], weights)
        write_csv(os.path.join(out_dir, STATS), stats.to_dict("records"), STATS_COLUMNS)
        write_tables(out_dir, parts)
        write_json(os.path.join(out_dir, META), meta)
    return meta
