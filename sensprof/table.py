"""The profile artifact on disk: metadata, per-layer parts, combined tables; validation and merge.

Every file is written atomically (temp file + rename), so a kill at any moment leaves either the
old or the new version, never a torn one; parts are per layer, so a resumed run redoes at most one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from .errors import SensprofError

FORMAT_VERSION = 1
KIND = "sensprof-profile"
META, CALIBRATION, PARTS = "meta.json", "calibration.json", "parts"
LENGTHS = "lengths"  # a profile of several --seq-len: the longest in the directory, each other in lengths/<L>/
TABLE, HEADS, STATS = "profile.csv", "heads.csv", "stats.csv"
# measured: False for a cell whose KL a screened profile (--screen) predicted instead of measuring
TABLE_COLUMNS = ["layer", "layer_kind", "tensor", "scheme", "bits", "kl", "kl_std", "dnll", "attn_kl", "out_rel_l2",
                 "measured"]
HEAD_COLUMNS = ["layer", "tensor", "scheme", "head", "attn_kl", "out_rel_l2"]
STATS_COLUMNS = ["layer", "layer_kind", "tensor", "outlier_ratio", "outlier_ratio_max", "kurtosis", "absmax"]
OWN_FILES = {META, CALIBRATION, PARTS, TABLE, HEADS, STATS, LENGTHS}


def atomic_write_text(path: str, text: str) -> None:
    _atomic_write(path, text, "w", "utf-8")


def atomic_write_bytes(path: str, data: bytes) -> None:
    _atomic_write(path, data, "wb", None)


def _atomic_write(path: str, data, mode: str, encoding: str | None) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n")


def read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise SensprofError(f"{what} {path!r} is missing; re-run `sensprof profile` into that directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SensprofError(f"{what} {path!r} is corrupt (not valid JSON); delete it and re-run `sensprof profile`") from None


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
    import pandas as pd

    atomic_write_text(path, pd.DataFrame(rows, columns=columns).to_csv(index=False))


def part_path(out_dir: str, layer: int) -> str:
    return os.path.join(out_dir, PARTS, f"layer_{layer:04d}.json")


def check_out_dir(out_dir: str, settings: dict) -> dict | None:
    """Return the existing metadata to resume from, or None for a fresh directory.

    Refuses a directory that holds something else, or a profile of another model or settings.
    """
    if not os.path.exists(out_dir):
        return None
    if not os.path.isdir(out_dir):
        raise SensprofError(f"--out {out_dir!r} is a file; pass a directory path")
    entries = {e for e in os.listdir(out_dir) if not e.startswith(".tmp-")}
    if not entries:
        return None
    if META not in entries:
        if entries - OWN_FILES:
            raise SensprofError(
                f"--out {out_dir!r} is not empty and holds no sensprof profile; pass a new or empty directory")
        return None
    meta = load_meta(out_dir)
    old = meta.get("settings", {})
    diffs = [f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now" for k in sorted(set(old) | set(settings))
             if old.get(k) != settings.get(k)]
    if diffs:
        raise SensprofError(
            f"--out {out_dir!r} holds a profile of a different model or settings ({'; '.join(diffs[:3])}); "
            "pass another --out or delete that directory")
    return meta


def check_artifact(obj, kind: str, version: int, where: str, what: str, command: str) -> None:
    """Refuse an artifact of another kind or format version (the habit of versioned configs)."""
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise SensprofError(f"{where!r} is not a sensprof {what} (it is of another kind); pass one written by "
                            f"`sensprof {command}`")
    if obj.get("format_version") != version:
        raise SensprofError(
            f"{where!r} holds a {what} format version {obj.get('format_version')!r}; this sensprof reads version "
            f"{version}: re-run `sensprof {command}`")


def load_meta(out_dir: str) -> dict:
    meta = read_json(os.path.join(out_dir, META), "profile metadata")
    check_artifact(meta, KIND, FORMAT_VERSION, out_dir, "profile", "profile")
    return meta


def load_parts(out_dir: str) -> dict[int, dict]:
    d = os.path.join(out_dir, PARTS)
    parts = {}
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if name.startswith("layer_") and name.endswith(".json"):
                part = read_json(os.path.join(d, name), "profile part")
                parts[int(part["layer"])] = part
    return parts


def write_tables(out_dir: str, parts: dict[int, dict]) -> None:
    rows = [{"measured": True, **r} for layer in sorted(parts) for r in parts[layer]["rows"]]
    heads = [r for layer in sorted(parts) for r in parts[layer]["heads"]]
    write_csv(os.path.join(out_dir, TABLE), rows, TABLE_COLUMNS)
    write_csv(os.path.join(out_dir, HEADS), heads, HEAD_COLUMNS)


@dataclass
class Profile:
    """A profile as the Python API returns it: pandas tables plus the metadata."""

    table: object  # DataFrame, one row per layer x tensor x scheme
    heads: object  # DataFrame, local metrics per query head
    stats: object  # DataFrame, per-layer statistics of the cached tensors
    meta: dict
    calibration: dict
    path: str | None = None


def load_profile(out_dir: str, require_complete: bool = False) -> Profile:
    import pandas as pd

    if not os.path.isdir(out_dir):
        raise SensprofError(f"profile directory {out_dir!r} does not exist; run `sensprof profile --out {out_dir}`")
    meta = load_meta(out_dir)
    if require_complete and not meta.get("complete"):
        missing = sorted(set(range(len(meta["layers"]))) - set(meta.get("layers_done", [])))
        raise SensprofError(
            f"profile {out_dir!r} is partial (layers {compact_ranges(missing)} missing); finish it with "
            "`sensprof profile` or join its parts with `sensprof merge`")
    try:
        table = pd.read_csv(os.path.join(out_dir, TABLE))
        heads = pd.read_csv(os.path.join(out_dir, HEADS))
        stats = pd.read_csv(os.path.join(out_dir, STATS))
    except FileNotFoundError as e:
        raise SensprofError(f"profile {out_dir!r} lacks {os.path.basename(e.filename)}; re-run `sensprof profile`") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise SensprofError(f"profile {out_dir!r} has a corrupt table; delete it and re-run `sensprof profile`") from None
    if list(table.columns) == TABLE_COLUMNS[:-1]:  # written before --screen: every cell measured
        table["measured"] = True
    if list(table.columns) != TABLE_COLUMNS:
        raise SensprofError(f"profile {out_dir!r} has an unexpected table layout; re-run `sensprof profile`")
    calibration = read_json(os.path.join(out_dir, CALIBRATION), "calibration")
    return Profile(table, heads, stats, meta, calibration, out_dir)


def default_out_dir(model: str) -> str:
    """profiles/<model name>, the name cleaned for a directory."""
    import re

    name = os.path.basename(model.rstrip("/")) if os.path.exists(model) else model
    return os.path.join("profiles", re.sub(r"[^A-Za-z0-9._-]+", "_", name.removesuffix(".gguf")))


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
    """Join profiles of the same model and settings computed for different layers (e.g. on several machines)."""
    import shutil

    if not dirs:
        raise SensprofError("merge needs at least one profile directory")
    metas = [load_meta(d) for d in dirs]
    base = metas[0]
    for d, m in zip(dirs[1:], metas[1:]):
        if m["settings"] != base["settings"]:
            keys = [k for k in base["settings"] if base["settings"].get(k) != m["settings"].get(k)]
            raise SensprofError(
                f"{d!r} was profiled with other settings than {dirs[0]!r} (differs in {', '.join(keys)}); "
                "only parts of one profile can be merged")
    check_out_dir(out_dir, base["settings"])
    parts: dict[int, dict] = {}
    for d in dirs:
        for layer, part in load_parts(d).items():
            if layer in parts and parts[layer]["rows"] != part["rows"]:
                raise SensprofError(
                    f"layer {layer} appears in two inputs with different results; merge each layer from one run only")
            parts.setdefault(layer, part)
    os.makedirs(os.path.join(out_dir, PARTS), exist_ok=True)
    for layer, part in parts.items():
        write_json(part_path(out_dir, layer), part)
    for name in (CALIBRATION, STATS):
        src = os.path.join(dirs[0], name)
        if os.path.abspath(src) != os.path.abspath(os.path.join(out_dir, name)):
            shutil.copyfile(src, os.path.join(out_dir, name + ".tmp-merge"))
            os.replace(os.path.join(out_dir, name + ".tmp-merge"), os.path.join(out_dir, name))
    write_tables(out_dir, parts)
    meta = dict(base)
    meta["layers_done"] = sorted(parts)
    meta["complete"] = len(parts) == len(base["layers"])
    meta["wall_time_s"] = sum(float(m.get("wall_time_s", 0.0)) for m in metas)
    meta["merged_from"] = [os.path.abspath(d) for d in dirs]
    write_json(os.path.join(out_dir, META), meta)
    return meta


def compact_ranges(xs) -> str:
    xs = sorted(xs)
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def parse_layers(spec: str | None, n_layers: int) -> list[int]:
    """'0-11', '3', '0,5,7-9' -> sorted indices; refuses out-of-range or malformed specs."""
    if spec is None or spec == "" or spec == "all":
        return list(range(n_layers))
    out = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(part)
        except ValueError:
            raise SensprofError(f"--layers {spec!r} is malformed; use e.g. 0-11 or 0,3,5-7") from None
        if lo > hi or lo < 0 or hi >= n_layers:
            raise SensprofError(
                f"--layers {spec!r} is out of range: the model has layers 0-{n_layers - 1}")
        out.update(range(lo, hi + 1))
    return sorted(out)
