"""Files: atomic writes, JSON in and out, versioned-artifact checks, writable outputs, file-name cleaning.

Every file is written to a temporary name and renamed, so a kill at any moment leaves the old version or the
new one, never a torn file.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from .errors import SensprofError


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


def check_writable(path: str, flag: str = "--out", kind: str = "dir") -> None:
    """Refuse an output path that cannot be written, before any work: a directory where a file goes (`kind`
    "file") or a file where a directory goes, or one in a read-only place. Probes the nearest existing
    directory with a temporary file, so nothing is created and nothing existing changes."""
    if kind == "file" and os.path.isdir(path):
        raise SensprofError(f"{flag} {path!r} is a directory; pass a file path, e.g. "
                            f"{os.path.join(path, 'out.json')!r}")
    if kind == "dir" and os.path.exists(path) and not os.path.isdir(path):
        raise SensprofError(f"{flag} {path!r} is a file; pass a directory path")
    d = os.path.abspath(path if kind == "dir" else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(d):
        d = os.path.dirname(d)
    try:
        if not os.path.isdir(d):
            raise NotADirectoryError(20, f"{d} is a file")
        fd, probe = tempfile.mkstemp(dir=d, prefix=".tmp-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SensprofError(f"cannot write to {flag} {path!r} ({e.strerror or e}); pass a path in a writable "
                            "directory") from None


def check_artifact(obj, kind: str, version: int, where: str, what: str, command: str) -> None:
    """Refuse an artifact of another kind or format version (the habit of versioned configs)."""
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise SensprofError(f"{where!r} is not a sensprof {what} (it is of another kind); pass one written by "
                            f"`sensprof {command}`")
    if obj.get("format_version") != version:
        raise SensprofError(
            f"{where!r} holds a {what} format version {obj.get('format_version')!r}; this sensprof reads version "
            f"{version}: re-run `sensprof {command}`")


def safe_name(name: str) -> str:
    """A model id or path as a file-name part: a local path's base name, or the whole hub id ('org/name' ->
    'org_name'), .gguf dropped, other characters as '_'."""
    name = str(name).rstrip("/")
    base = os.path.basename(name) if os.path.exists(name) or os.sep in name and name.startswith((".", os.sep)) else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", base.removesuffix(".gguf")) or "model"
