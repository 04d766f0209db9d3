"""Files: atomic writes, JSON in and out, versioned-artifact checks, writable outputs, file-name cleaning.

Every file is written to a temporary name and renamed, so a kill at any moment leaves the old version or the
new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys
import tempfile

from .errors import SensprofError


def atomic_write_text(path: str, text: str) -> None:
    _atomic_write(path, text, "w", "utf-8")


def atomic_write_bytes(path: str, data: bytes) -> None:
    _atomic_write(path, data, "wb", None)


def _atomic_write(path: str, data, mode: str, encoding: str | None) -> None:
    d = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
        with os.fdopen(fd, mode, encoding=encoding) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):  # a full disk, a quota, a folder made read-only mid-run: the old file is intact
            raise write_error(path, e) from None
        raise


def write_error(path: str, e: OSError) -> SensprofError:
    """An OSError while writing `path`, as the one-line error the CLI prints (the file itself is unchanged)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return SensprofError(f"no space left writing {path!r} ({e.strerror}); nothing written so far was lost: free "
                             "space on that disk (or pass an output path on another one) and run the same command "
                             "again")
    return SensprofError(f"cannot write {path!r} ({e.strerror or e}); check that folder and its permissions, then "
                         "run the same command again")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n")


def read_json(path: str, what: str, not_json: str | None = None):
    """JSON from `path`; `not_json`: the message for a file that is not JSON at all (empty, binary), instead of
    calling it a corrupt profile file."""
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):  # a FIFO would hang the open
        raise SensprofError(f"{what} {path!r} is not a regular file (a FIFO or a device), which sensprof does not "
                            "read; pass the file sensprof wrote")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise SensprofError(f"{what} {path!r} is missing; re-run `sensprof profile` into that directory") from None
    except IsADirectoryError:
        raise SensprofError(f"{what} {path!r} is a folder, not a file; pass the file itself") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SensprofError(not_json or f"{what} {path!r} is corrupt (not valid JSON); delete it and re-run "
                            "`sensprof profile`") from None


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


LOCK = ".sensprof.lock"  # inside an output folder while a run writes it (removed when the run ends)


@contextlib.contextmanager
def output_lock(folder: str, flag: str = "--out", lock_path: str | None = None):
    """Hold an exclusive lock on `folder` (one writer per output folder) for the block.

    The lock is an OS file lock (flock) on `lock_path` (default: LOCK inside the folder), so the kernel drops it
    when the process dies, kill -9 included: a stale lock file is taken over, with a note, by locking that same
    file (never removed and made anew, so two live runs cannot both hold it). A second run while it is
    held gets one line naming the holder (its PID and command, written into the lock file). A folder the lock
    created is removed again at the end if the run left nothing in it."""
    import fcntl

    lock = lock_path or os.path.join(folder, LOCK)
    parent = os.path.dirname(os.path.abspath(lock))
    created = []  # the folders made for the lock, innermost first
    d = parent
    while not os.path.isdir(d):
        created.append(d)
        d = os.path.dirname(d)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise SensprofError(f"cannot write to {flag} {folder!r} ({e.strerror or e}); pass a path in a writable "
                            "directory") from None
    while True:
        try:  # O_NONBLOCK: a FIFO planted there must not hang the open
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                         0o666)
        except OSError as e:
            raise SensprofError(f"cannot lock {flag} {folder!r} ({e.strerror or e}): {lock!r} must be a plain file "
                                "sensprof can write; remove it, or pass another " + flag) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a FIFO, a device, or a hard link to another file
            os.close(fd)
            what = "is not a plain file" if not stat.S_ISREG(st.st_mode) else "is a hard link to another file"
            raise SensprofError(f"cannot lock {flag} {folder!r}: {lock!r} {what}, which sensprof neither writes nor "
                                "removes; remove it yourself, or pass another " + flag)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "a process that has not said which"
            os.close(fd)
            raise SensprofError(f"{flag} {folder!r} is being written by another sensprof run ({holder}); wait for it "
                                f"to finish, or pass another {flag}") from None
        try:  # the holder before us may have removed the file we opened: then lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            left = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()  # a holder's line: it was killed
            if left:
                print(f"sensprof: note: taking over {lock!r}, left by a run that is no longer running ({left[:160]})",
                      file=sys.stderr)
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {' '.join(['sensprof', *sys.argv[1:]])[:300]}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # before the lock is released, so a waiter finds it gone and locks a new one
        os.close(fd)
        for d in created:
            try:
                os.rmdir(d)  # only if empty: the run wrote nothing there
            except OSError:
                break


def check_recorded_files(paths, roots, what: str, fix: str) -> None:
    """A file that a plan or a profile records (its profile's text) is read only if it is a regular file under
    `roots` (the folder of the plan or profile the user named, and the current folder; None: a record made in this
    process, read where it points), since a plan or profile from elsewhere could name any file. Checked by its
    name alone, before anything opens it; a file that is not there is left to the caller's own message."""
    for p in paths or []:
        if not os.path.lexists(p):
            continue
        real = os.path.realpath(p)
        where = [os.path.realpath(r) for r in roots] if roots is not None else None
        if where is not None and not any(os.path.commonpath([real, r]) == r for r in where):
            raise SensprofError(f"{what} {p!r} lies outside {roots[0]!r} and the current folder, and sensprof reads a "
                                "text file that a plan or profile records only from there (one from elsewhere could "
                                f"name any file); run sensprof from a folder that holds it{fix}")
        if not stat.S_ISREG(os.stat(real).st_mode) or real.split(os.sep)[1:2] in (["proc"], ["sys"], ["dev"]):
            raise SensprofError(f"{what} {p!r} is not a regular file (a folder, FIFO, device or /proc file), which "
                                f"sensprof does not read as text; restore the text the profile was made from{fix}")


def check_no_symlinks(folder: str, names, flag: str = "--out") -> None:
    """Refuse an output folder whose own entries (`names`: parts/, meta.json, ...) are symbolic links: sensprof
    would write (and clean temporary files) through them, outside the folder the user named."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise SensprofError(f"{flag} {folder!r} holds {name!r} as a symbolic link, which sensprof does not write "
                                "through; replace it with a real folder or file, or pass another " + flag)


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
