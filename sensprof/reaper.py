"""Processes that die with sensprof, however it ends: a Ray cluster it started, an engine it runs.

A small reaper process of its own holds the other end of a pipe; when sensprof exits — kill -9 included, when the
kernel closes the pipe — it kills the processes it was given and all their descendants, then removes their folders.
A job that ends normally releases its reaper, which then leaves everything as it is.
"""

from __future__ import annotations

import contextlib
import os

# Run by the reaper: it keeps a list of the processes given as PID:START-TIME and all their descendants (Ray's
# dashboard and runtime-env agents, vLLM's engine core: they outlive their parent), refreshed every second until
# its stdin says "release" (then it exits) or reaches EOF (the driver's end of the pipe closed: the driver is
# gone); then it SIGKILLs every one of them still running, skipping any PID since reused by another process, and,
# once they are gone, removes the folders given as RM:PATH and the lock files given as LOCK:PATH, each only while
# it holds that lock itself (files.output_lock's protocol: unlinked before it is released, so no later run that has
# taken the lock over loses it).
_REAPER = """
import fcntl, os, select, shutil, stat, sys, time
import psutil
roots, known, folders, locks = [], {}, [], []
for arg in sys.argv[1:]:
    if arg.startswith(("RM:", "LOCK:")):
        (folders if arg.startswith("RM:") else locks).append(arg.partition(":")[2])
        continue
    pid, _, start = arg.partition(":")
    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(start)) < 1e-3:
            roots.append(p)
    except psutil.Error:
        pass
while True:
    for root in roots:
        try:
            for p in [root, *root.children(recursive=True)]:
                known.setdefault(p.pid, p)
        except psutil.Error:
            pass
    if select.select([0], [], [], 1.0)[0]:
        if os.read(0, 4096):
            sys.exit(0)  # released: the job ended as it should
        break
for p in known.values():
    try:
        p.kill()  # psutil checks the PID still names the process it saw
    except psutil.Error:
        pass
psutil.wait_procs(list(known.values()), timeout=30)
for folder in folders:
    shutil.rmtree(folder, ignore_errors=True)
for lock in locks:
    for _ in range(20):  # the dead driver's lock is released as the kernel closes its files, maybe after its pipe
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            break  # gone, or not a file we may touch
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.1)
                continue
            if os.path.samestat(st, os.stat(lock, follow_symlinks=False)):
                os.unlink(lock)
            break
        except OSError:
            break
        finally:
            os.close(fd)
"""
_reaper_pipes: list[int] = []  # the write ends of reapers never released, held open for the life of the process


class Reaper:
    """A reaper's write end: release() when the job ended normally; dropping it keeps the reaper armed."""

    def __init__(self, write: int | None):
        self.write = write

    def release(self) -> None:
        if self.write is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.write, b"release")
            os.close(self.write)
        with contextlib.suppress(ValueError):
            _reaper_pipes.remove(self.write)
        self.write = None


def fate_share(pids, remove: str = "", lock: str = "") -> Reaper:
    """Make the processes `pids` (and their descendants) die with this process, however it ends: a reaper
    process kills them when this process's end of a pipe closes, then removes the folder `remove` (theirs, or with
    no pids, this process's own work in progress) and the lock file `lock` this process holds (files.output_lock),
    if no other run has taken it over by then."""
    import subprocess
    import sys

    import psutil

    args = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            args.append(f"{pid}:{psutil.Process(pid).create_time()!r}")
    if not args and (pids or not remove):  # nothing of theirs is running any more, and no folder of our own
        return Reaper(None)
    if remove:
        args.append(f"RM:{remove}")
    if lock:
        args.append(f"LOCK:{lock}")
    read, write = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-c", _REAPER, *args], stdin=read, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    finally:
        os.close(read)
    os.set_inheritable(write, False)
    _reaper_pipes.append(write)
    return Reaper(write)
