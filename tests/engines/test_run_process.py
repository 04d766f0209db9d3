"""An engine job leaves nothing running and nothing on disk, however sensprof's side of it ends
(sensprof/engines/run/process.py): the engine runs in a session of its own, its whole group is killed on a time-out,
Ctrl-C or SIGTERM, and a reaper kills it and removes the job's folder after a kill -9 of sensprof."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# An "engine Python" whose runner starts a child that outlives it (as vLLM's engine core does), says both pids in a
# file beside the job, and sleeps (or, ENDS, exits at once).
FAKE_ENGINE = f"""#!{sys.executable}
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(os.path.dirname(sys.argv[2]), "pids"), "w") as f:
    f.write(f"{{os.getpid()}} {{child.pid}}")
if not ENDS:
    time.sleep(600)
"""

# sensprof's side: runs one job in the fake engine (the SIGTERM handler is the CLI's: it raises SystemExit).
DRIVER = """
import signal, sys
from sensprof.engines.run.process import run_job
# Ctrl-C raises KeyboardInterrupt even where the suite runs as a background job (whose shell leaves SIGINT ignored,
# and an ignored signal stays ignored in every child: then nothing would end the driver)
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[4] == "cli":
    def terminated(signum, frame):
        raise SystemExit(2)
    signal.signal(signal.SIGTERM, terminated)
run_job("vllm", sys.argv[1], {"configs": []}, sys.argv[2], sys.argv[3])
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(done, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.2)
    return done()


@pytest.mark.parametrize("how", ["kill -9", "SIGINT", "SIGTERM"])
def test_nothing_of_the_engine_survives_sensprof(tmp_path, how):
    pytest.importorskip("psutil")
    engine = tmp_path / "python"
    engine.write_text(FAKE_ENGINE.replace("ENDS", "False"))
    engine.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    errors = open(tmp_path / "driver.err", "wb")  # kept for the failure message
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(engine), str(work), str(tmp_path / "e.log"),
                               "cli" if how == "SIGTERM" else "plain"], stderr=errors)
    try:
        assert _wait_for(lambda: (work / "pids").exists() and (work / "pids").read_text().count(" ") == 1)
        pids = [int(x) for x in (work / "pids").read_text().split()]
        time.sleep(1.5)  # the reaper has seen the child
        assert all(_alive(p) for p in pids)
        driver.send_signal({"kill -9": signal.SIGKILL, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}[how])
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"sensprof did not end within 60 s of {how}; its stderr: "
                        f"{(tmp_path / 'driver.err').read_text(errors='replace')[-2000:]!r}")
        assert _wait_for(lambda: not any(_alive(p) for p in pids)), f"left running after {how}: {pids}"
        if how == "kill -9":  # nobody else will remove the job's folder: the reaper does
            assert _wait_for(lambda: not work.exists())
    finally:
        if driver.poll() is None:
            driver.kill()
        errors.close()
        for p in [int(x) for x in (work / "pids").read_text().split()] if (work / "pids").exists() else []:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_a_job_that_ends_normally_releases_its_reaper(tmp_path):
    """The engine's group is ended after a normal exit too (a child it left is killed), the folder is left for
    sensprof to read, and no reaper stays behind."""
    import psutil

    from sensprof.engines.run.process import run_job

    engine = tmp_path / "python"
    engine.write_text(FAKE_ENGINE.replace("ENDS", "True"))
    engine.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run_job("vllm", str(engine), {"configs": []}, str(work), str(tmp_path / "e.log"))
    pids = [int(x) for x in (work / "pids").read_text().split()]
    assert _wait_for(lambda: not any(_alive(p) for p in pids)) and work.exists()
    assert _wait_for(lambda: {p.pid for p in psutil.Process().children(recursive=True) if _alive(p.pid)} <= before, 10)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs Linux CPU affinity and a machine of two cores to tell them apart")
def test_the_llamacpp_runner_starts_a_thread_per_core_it_may_use():
    """llama.cpp's threads spin, so the runner starts one per core its process may run on (taskset, a cpuset, a pinned
    pytest worker), not one per core of the machine (os.cpu_count(): two threads fighting over one core)."""
    runner = os.path.join(os.path.dirname(__file__), "..", "..", "sensprof", "engines", "run", "llamacpp_runner.py")
    script = ("import os, runpy; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
              f"print(runpy.run_path({runner!r})['_usable_cores']())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
