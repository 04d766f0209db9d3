"""`sensprof profile --ray`: a local Ray cluster of 2 CPU workers on the tiny Llama gives the very tables of a
local run, resumes and merges like one, survives a worker killed mid-run, and refuses bad input in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pandas as pd
import pytest
from conftest import one_error_line, run_cli

from sensprof import api
from sensprof.profiling.distributed import EXIT_HOOK, shard_order
from sensprof.errors import SensprofError

SCHEMES = "int4_c32,int2_t32,int4_t32_r16,int2_c32_pre"
TABLES = ("profile.csv", "heads.csv", "windows.csv", "stats.csv", "calibration.json")
RUN = dict(schemes=SCHEMES, seq_len=32, windows=2, progress=False)


def _bytes(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def _assert_same_tables(a, b):
    for name in TABLES:
        assert _bytes(a, name) == _bytes(b, name), name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local Ray cluster of 2 CPUs for the module; its workers inherit the kill hook's variable (the hook
    fires only while the file it names exists)."""
    ray = pytest.importorskip("ray")
    flag = str(tmp_path_factory.mktemp("hook") / "exit-once")
    old = os.environ.get(EXIT_HOOK)
    os.environ[EXIT_HOOK] = flag
    session = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=session)
    yield flag
    ray.shutdown()
    shutil.rmtree(session, ignore_errors=True)
    if old is None:
        del os.environ[EXIT_HOOK]
    else:
        os.environ[EXIT_HOOK] = old


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir):
    """A local run of the tiny Llama (all layers): what every Ray run must reproduce byte for byte."""
    d = str(tmp_path_factory.mktemp("ref") / "local")
    prof = api.profile(tiny_model_dir, out_dir=d, **RUN)
    assert prof.meta["complete"] and len(prof.table) == 3 * 7
    return d


def test_two_workers_give_the_local_table(cluster, reference, tiny_model_dir, tmp_path):
    out = str(tmp_path / "ray")
    prof = api.profile(tiny_model_dir, out_dir=out, ray=True, ray_workers=2, **RUN)
    _assert_same_tables(out, reference)
    meta, ref_meta = (json.loads(_bytes(d, "meta.json")) for d in (out, reference))
    assert meta["settings"] == ref_meta["settings"] and meta["layers"] == ref_meta["layers"]
    assert meta["ray"] == {"workers": 2, "workers_lost": 0}
    assert meta["complete"] and meta["layers_done"] == [0, 1, 2] and meta["window_slots"] == ref_meta["window_slots"]
    assert set(meta["cost_s"]) == set(ref_meta["cost_s"])
    for layer in range(3):  # each layer's part: both tensors' rows, K first, as a local run writes it
        name = f"parts/layer_{layer:04d}.json"
        ours, theirs = (json.loads(_bytes(d, name)) for d in (out, reference))
        assert ours["rows"] == theirs["rows"] and ours["heads"] == theirs["heads"]
    assert prof.table.equals(pd.read_csv(os.path.join(reference, "profile.csv")))


def test_killed_worker_shard_is_retried_elsewhere(cluster, reference, tiny_model_dir, tmp_path):
    open(cluster, "w").close()  # arm the hook: the first worker to start a shard exits (os._exit)
    out = str(tmp_path / "ray")
    prof = api.profile(tiny_model_dir, out_dir=out, ray=True, ray_workers=2, **RUN)
    assert not os.path.exists(cluster), "no worker was killed"
    assert prof.meta["ray"] == {"workers": 2, "workers_lost": 1}
    _assert_same_tables(out, reference)


def test_ray_run_resumes_and_merges_as_a_local_one(cluster, reference, tiny_model_dir, tmp_path):
    resumed = str(tmp_path / "resumed")
    api.profile(tiny_model_dir, out_dir=resumed, layers="0", **RUN)  # a local run of layer 0...
    part0 = _bytes(resumed, "parts/layer_0000.json")
    prof = api.profile(tiny_model_dir, out_dir=resumed, ray=True, **RUN)  # ...finished on Ray
    assert _bytes(resumed, "parts/layer_0000.json") == part0  # layer 0 was not redone
    assert prof.meta["complete"] and prof.meta["ray"]["workers"] == 2
    _assert_same_tables(resumed, reference)

    local0, ray12 = str(tmp_path / "local0"), str(tmp_path / "ray12")
    shutil.copytree(resumed, local0)
    for layer in (1, 2):
        os.unlink(os.path.join(local0, f"parts/layer_{layer:04d}.json"))
    api.profile(tiny_model_dir, out_dir=ray12, layers="1-2", ray=True, **RUN)
    merged = api.merge([local0, ray12], str(tmp_path / "merged"))
    assert merged["complete"]
    _assert_same_tables(str(tmp_path / "merged"), reference)


@pytest.fixture
def temp_root():
    """A TMPDIR of its own (short: Ray's socket paths must fit in 107 bytes), to see what a run leaves in it."""
    root = tempfile.mkdtemp(prefix="t-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _leftovers(root, within_s=30.0) -> list[str]:
    """What is still in `root` after waiting up to `within_s` for it to empty."""
    _wait_until(lambda: not os.listdir(root), within_s)
    return os.listdir(root)


def test_cli_starts_its_own_cluster(reference, tiny_model_dir, tmp_path, temp_root):
    """Without an address the command starts (and stops) a Ray cluster on this machine; stderr stays clean, and
    the cluster's session folder (Ray's default: a new one in /tmp/ray per run) is gone with it."""
    pytest.importorskip("ray")
    out = tmp_path / "cli"
    r = subprocess.run([sys.executable, "-m", "sensprof", "profile", "--model", tiny_model_dir, "--schemes", SCHEMES,
                        "--seq-len", "32", "--ray", "--ray-workers", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": temp_root})
    assert r.returncode == 0, r.stderr
    assert _leftovers(temp_root, within_s=0) == []
    assert f"wrote {out}/" in r.stdout
    lines = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    assert lines[0].startswith("sensprof: 2 Ray workers (0 GPU, 1 CPU each) are loading")
    assert all(ln.startswith(("sensprof: ", "profiling:")) for ln in lines), lines
    _assert_same_tables(str(out), reference)


def test_shards_longest_first():
    """A shard's cost: its cells times the layers it replays (its own to the last) plus the head."""
    order = shard_order({0: [("K", 2), ("V", 2)], 2: [("K", 4)], 3: [("V", 1)]}, n_layers=4)
    assert order == [(2, "K", 4), (0, "K", 2), (0, "V", 2), (3, "V", 1)]  # costs 12, 10, 10, 2


# ---------------------------------------------------------------- bad input: one line, exit 2


def test_ray_not_installed(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    msg = one_error_line(*run_cli(capsys, "profile", "--model", tmp_path / "never-loaded", "--ray"))
    assert msg == "sensprof: error: --ray needs Ray, which is not installed; pip install 'sensprof[ray]'"


@pytest.mark.parametrize("address, match", [
    ("127.0.0.1:1", "cannot reach the Ray cluster at '127.0.0.1:1' ("),
    ("ray://127.0.0.1:1", "cannot reach the Ray cluster at 'ray://127.0.0.1:1' ("),
    ("head-node", "'head-node' is not a Ray address; pass host:6379, ray://host:10001 or auto"),
])
def test_unreachable_or_malformed_address(capsys, tmp_path, address, match):
    pytest.importorskip("ray")
    msg = one_error_line(*run_cli(capsys, "profile", "--model", tmp_path / "never-loaded", "--ray", address))
    assert match in msg


def test_worker_that_cannot_load_the_model_is_reported_once(cluster, capsys, tmp_path):
    d = tmp_path / "broken-model"
    d.mkdir()
    (d / "config.json").write_text("{")  # every worker fails to read it
    rc, out, err = run_cli(capsys, "profile", "--model", d, "--ray", "--ray-workers", "2", "--out", tmp_path / "o")
    assert rc == 2 and "Traceback" not in err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert len(errors) == 1, err
    assert errors[0].startswith("sensprof: error: ") and "pass a model directory with a valid config.json" in errors[0]
    assert errors[0].endswith("(2 of 2 Ray workers)")
    assert err.count("valid config.json") == 1


@pytest.mark.parametrize("argv, match", [
    (["--ray", "--ray-workers", "3"], "--ray-workers 3 needs 3 CPU slots; the Ray cluster has 2: pass fewer"),
    (["--ray", "--ray-workers", "0"], "--ray-workers 0 is too few; use at least 1"),
    (["--ray", "--ray-gpus-per-worker", "2"], "--ray-gpus-per-worker needs GPUs, and the Ray cluster has none"),
    (["--ray-workers", "2"], "--ray-workers and --ray-gpus-per-worker need --ray"),
])
def test_bad_worker_options(cluster, capsys, tmp_path, argv, match):
    msg = one_error_line(*run_cli(capsys, "profile", "--model", tmp_path / "never-loaded", "--quiet", *argv))
    assert match in msg


def test_a_loaded_model_cannot_go_to_ray(tiny_tokenizer):
    from conftest import make_tiny_model

    with pytest.raises(SensprofError, match="pass a model id, path or alias, not a loaded model"):
        api.profile(make_tiny_model("llama"), tokenizer=tiny_tokenizer, ray=True, **RUN)


# ---------------------------------------------------------------- a cluster sensprof started dies with it (issue 24)


def _gone(pids, within_s=60.0) -> list[int]:
    """The pids still running (zombies count as gone) after waiting up to `within_s` for them to end."""
    psutil = pytest.importorskip("psutil")

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    _wait_until(lambda: not any(alive(p) for p in pids), within_s)
    return [p for p in pids if alive(p)]


def _wait_until(done, within_s: float) -> None:
    import time

    deadline = time.monotonic() + within_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)


# A driver that starts a process tree which ignores SIGTERM (as Ray's agents did), shares its fate, says the pids.
FATE_DRIVER = """
import subprocess, sys, time
from sensprof.reaper import fate_share
stubborn = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \\
           "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, " \\
           "signal.SIG_IGN); time.sleep(600)']); time.sleep(600)"
p = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
time.sleep(0.5)
import psutil
kids = psutil.Process(p.pid).children(recursive=True)
while not kids:
    time.sleep(0.1)
    kids = psutil.Process(p.pid).children(recursive=True)
fate_share([p.pid])
print(p.pid, *[k.pid for k in kids], flush=True)
time.sleep(600)
"""


def test_processes_sharing_the_drivers_fate_die_with_a_kill_9():
    import signal

    pytest.importorskip("psutil")
    driver = subprocess.Popen([sys.executable, "-c", FATE_DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in driver.stdout.readline().split()]
        assert len(pids) == 2
        assert _gone(pids, within_s=0) == pids  # alive while the driver lives
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        assert _gone(pids) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()


# `sensprof profile --ray` that stops once its cluster's workers are up and says the pids of the Ray processes (the
# ones `ray.init` started and everything below them: the raylet's agents and the worker).
RAY_DRIVER = """
import os, sys, time
import psutil
import ray
import sensprof.profiling.distributed as d

def profile(self, *a, **k):
    node = ray._private.worker._global_node
    procs = [psutil.Process(i.process.pid) for infos in node.all_processes.values() for i in infos]
    pids = {p.pid for q in procs for p in [q, *q.children(recursive=True)]}
    print("PIDS", *sorted(pids), flush=True)
    time.sleep(600)

d.RayProfiler.profile = profile
from sensprof.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_of_profile_ray_leaves_no_ray_running(tiny_model_dir, tmp_path, temp_root):
    """The local cluster `profile --ray` started (dashboard and runtime-env agents, ~216 MB) stayed alive,
    parented to PID 1, after the driver was killed. The Ray processes are stopped (SIGSTOP) before the kill, so
    none can end on its own: each must be killed because the driver died, and their session folder removed."""
    import signal

    pytest.importorskip("ray")
    driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER, "profile", "--model", tiny_model_dir, "--schemes",
                               "int4_c32", "--seq-len", "32", "--ray", "--ray-workers", "1", "--quiet", "--out",
                               str(tmp_path / "p")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": temp_root})
    pids = []
    try:
        line = ""
        for line in driver.stdout:
            if line.startswith("PIDS"):
                break
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) >= 5, line  # gcs, raylet, its agents, the worker, ...
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        assert _gone(pids, within_s=120) == []
        assert _leftovers(temp_root) == []  # the cluster's session folder, removed once its processes are gone
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()
        for pid in pids:  # whatever is left of a failed run: never leak a stopped cluster
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
