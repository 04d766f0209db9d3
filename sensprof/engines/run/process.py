"""Run an engine's runner script (vllm_runner.py, llamacpp_runner.py) in the engine's Python, in its own process,
with a JSON job; a failure becomes one line holding the engine's own last error."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

from ...errors import SensprofError
from ...files import atomic_write_text
from ...reaper import fate_share

RUNNERS = {"vllm": "vllm_runner.py", "llamacpp": "llamacpp_runner.py"}
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b(: |$)")  # Python's "KeyError: ..." lines
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Killed|Segmentation fault|out of memory)", re.I)
_WARNING_LINE = re.compile(r"warn", re.I)
# what glibc, the C++ runtime or CPython print as a process dies of a signal
_CRASH_LINE = re.compile(r"corrupted|malloc\b|free\(\)|double free|Fatal glibc error|terminate called|"
                         r"Segmentation fault|Fatal Python error", re.I)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _clip(line: str, limit: int) -> str:
    """A line for a one-line error: whole, or cut to `limit` characters with an ellipsis."""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _error_line(text: str) -> str | None:
    """The engine output's last exception line, else its last line that speaks of an error and is no warning."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln) and not _WARNING_LINE.search(ln)
              and not ln.startswith(("File ", "Traceback"))]
    line = (exceptions or errors or [None])[-1]
    return line if line is None else _clip(line, 400)


def last_error(text: str) -> str:
    """The line of an engine's output that says what went wrong: its last exception line, else its last line that
    speaks of an error and is no warning, else its last line."""
    found = _error_line(text)
    if found is not None:
        return found
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or ["(no output)"]
    return _clip(lines[-1], 400)


def crash_note(text: str) -> str | None:
    """Where a process that died of a signal was: the first message glibc, the C++ runtime or CPython printed as it
    died, and the innermost Python frame of the dump faulthandler writes (the runners enable it); None without them."""
    lines = text.splitlines()
    said = next((ln.strip() for ln in lines if _CRASH_LINE.search(ln) and not _WARNING_LINE.search(ln)), None)
    frame = None
    for header, first in zip(lines, lines[1:]):  # faulthandler: a thread's header, then its innermost frame
        match = _FRAME.match(first)
        if match and header.startswith(("Current thread", "Thread ")) and "most recent call first" in header:
            path = match.group(1).split("site-packages/")[-1]
            frame = f"in {match.group(3)} at {path}:{match.group(2)}"
            break
    return "; ".join(_clip(p, 200) for p in (said, frame) if p) or None


def failure_reason(text: str, errors: list[str], returncode: int) -> str:
    """Why an engine run failed: the error its runner wrote, else its output's error line; a run killed by a signal
    says so, quoting an error line only where there is one (not a progress or INFO line that merely came last), and
    where the output shows how a process died (crash_note), that too."""
    found = errors[-1] if errors else _error_line(text)
    if returncode < 0:
        found = f"the process was killed by signal {-returncode}" + (f" after: {found}" if found else "")
    else:
        found = found or last_error(text)
    note = crash_note(text)
    return f"{found} ({note})" if note and note not in found else found


def run_job(engine: str, python: str, job: dict, workdir: str, log_path: str, timeout: float | None = None) -> None:
    """Write the job into workdir and run the engine's runner on it; its output is kept at log_path only when it
    fails (a successful run writes nothing there, so a file of that name is never touched)."""
    job_path = os.path.join(workdir, f"{engine}-job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    script = os.path.join(os.path.dirname(__file__), RUNNERS[engine])
    run_log = os.path.join(workdir, f"{engine}.log")
    # The engine's temporary files (vLLM's distributed-store file, one per run) go in workdir, removed with it.
    temp = os.path.join(workdir, "tmp")
    os.makedirs(temp, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=temp)
    env.pop("PYTHONPATH", None)  # the engine's environment, not sensprof's
    with open(run_log, "w") as log:
        returncode = _run_in_own_group([python, script, job_path], log, env, timeout, engine, workdir)
    if returncode != 0:
        errors = [open(p).read().strip() for p in _error_files(job)]
        with open(run_log, errors="replace") as f:
            text = f.read()
        atomic_write_text(log_path, text)
        why = failure_reason(text, errors, returncode)
        raise SensprofError(f"{engine} failed: {why}; its full log: {log_path}")


# The engine's process first waits for sensprof to arm the reaper (a kill -9 in between closes the pipe: it exits
# unstarted), then becomes the engine's Python running the runner, with /dev/null as its input.
_WAIT_FOR_REAPER = ("import os, sys\nif not os.read(0, 2): sys.exit(1)\nos.dup2(os.open(os.devnull, os.O_RDONLY), 0)\n"
                    "os.execv(sys.argv[1], sys.argv[1:])")


def _run_in_own_group(cmd: list[str], log, env: dict, timeout: float | None, engine: str, workdir: str) -> int:
    """Run the engine in a session of its own and end the whole group on every way out (its engine-core
    processes included): a time-out, Ctrl-C, SIGTERM; a reaper does the same, and removes `workdir`, if sensprof
    itself is killed (kill -9)."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", _WAIT_FOR_REAPER, *cmd], stdout=log, stderr=subprocess.STDOUT,
                            env=env, stdin=subprocess.PIPE, start_new_session=True)
    reaper = None
    try:
        reaper = fate_share([proc.pid], remove=workdir)
        with contextlib.suppress(OSError):  # the engine starts only now that a kill -9 of sensprof would end it
            proc.stdin.write(b"go")
            proc.stdin.close()
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SensprofError(f"{engine} did not finish within {timeout:.0f} s; use fewer or shorter windows "
                            "(--windows, --seq-len)") from None
    finally:
        _end_group(proc)
        if reaper is not None:
            reaper.release()


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the engine's process group (its runner, vLLM's engine core), and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _error_files(job: dict) -> list[str]:
    return [c["out"] + ".error" for c in job.get("configs", []) if "out" in c and os.path.exists(c["out"] + ".error")]
