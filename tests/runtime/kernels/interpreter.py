"""Test code run under TRITON_INTERPRET=1, which must be set before triton is imported, so not in pytest's own
process. One Python imports torch, triton and the kernels once (~4 s, paid per test when each test started its own
Python) and runs each test's code in a child forked from it: every test still starts from that clean state."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from sensprof.runtime.kernels import triton_available

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
TESTS = Path(__file__).parents[2]  # on the path of the server too: conftest, runtime.kernels.packed, ...
TIMEOUT_S = 600

_SERVER = """
import json, os, sys, traceback
sys.path.insert(0, {tests!r})
import torch, triton
from sensprof.runtime.kernels import reference, triton_kernels
import runtime.kernels.packed
protocol = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # anything else printed here goes to stderr, never into the protocol
protocol.write("ready\\n")
protocol.flush()
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, job["out"]), (2, job["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        rc = 0
        try:
            exec(compile(job["code"], "<test code>", "exec"), {{"__name__": "__main__"}})
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    _, status = os.waitpid(pid, 0)
    protocol.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\\n")
    protocol.flush()
"""

_server: subprocess.Popen | None = None


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
        _server = subprocess.Popen([sys.executable, "-c", _SERVER.format(tests=str(TESTS))], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        atexit.register(_stop, _server)
        _read_line(_server, TIMEOUT_S)
    return _server


def _stop(server: subprocess.Popen) -> None:
    """The server and any child of it still running (a test's code that hung)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _read_line(server: subprocess.Popen, timeout: float) -> str:
    if not select.select([server.stdout], [], [], timeout)[0]:
        _stop(server)
        raise AssertionError(f"the interpreted test code did not finish within {timeout:.0f} s")
    line = server.stdout.readline()
    if not line:
        raise AssertionError(f"the Triton interpreter process died (exit code {server.wait()})")
    return line


def run_interpreted(code: str) -> str:
    """Run `code` (indented as in the test) under the Triton interpreter; its stdout, after asserting it exited 0
    (else its stderr's tail is the failure)."""
    server = _start()
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        server.stdin.write(json.dumps({"code": textwrap.dedent(code), "out": out, "err": err}) + "\n")
        server.stdin.flush()
        rc = json.loads(_read_line(server, TIMEOUT_S))
        stdout, stderr = (Path(p).read_text() if os.path.exists(p) else "" for p in (out, err))
    assert rc == 0, f"exit code {rc}: {stderr[-3000:]}"
    return stdout
