"""The profile directory: interrupted runs resume, foreign directories are refused, partial profiles merge."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from conftest import VOCAB, make_tiny_model, tiny_config

import sensprof.profiling.profile as profile_mod
from sensprof.errors import SensprofError
from sensprof.profiling.profile import run_profile
from sensprof.schemes import parse_schemes
from sensprof.specs import parse_layers
from sensprof.profiling.table import load_profile, merge_profiles

SCHEMES = "int4_c32,int2_t32,int4_t32_r16,int2_c32_pre"
TABLES = ("profile.csv", "heads.csv", "windows.csv", "stats.csv", "calibration.json")


def _ids(seq_len=64):
    return torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))[:, :seq_len]


def _bytes(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def _parts(d):
    p = os.path.join(d, "parts")
    return sorted(n for n in os.listdir(p) if n.startswith("layer_") and n.endswith(".json")) if os.path.isdir(p) else []


def _assert_same_tables(a, b, names=TABLES):
    for name in names:
        assert _bytes(a, name) == _bytes(b, name), name


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted in-process profile of the tiny Llama (all layers)."""
    d = str(tmp_path_factory.mktemp("ref") / "full")
    model = make_tiny_model("llama")
    prof = run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=d, progress=False)
    assert prof.meta["complete"] and len(prof.table) == 3 * 7
    return model, d


# ---------------------------------------------------------------- (a) interrupted in process, resumed


def test_resume_after_in_process_interruption(reference, tmp_path, monkeypatch):
    model, ref_dir = reference
    out = str(tmp_path / "run")
    real = profile_mod.profile_layer
    calls = []

    def failing(model_, session, layer, *a, **k):
        calls.append(layer)
        if len(calls) > 1:
            raise Interrupted("stopped after one layer")
        return real(model_, session, layer, *a, **k)

    monkeypatch.setattr(profile_mod, "profile_layer", failing)
    with pytest.raises(Interrupted):
        run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=out, progress=False)
    assert calls == [0, 1]
    assert _parts(out) == ["layer_0000.json"]
    meta = json.loads(_bytes(out, "meta.json"))
    assert meta["layers_done"] == [0] and meta["complete"] is False
    assert model.config._attn_implementation == "eager"  # the exception left the model clean
    partial = load_profile(out)
    assert set(partial.table.layer) == {0}
    with pytest.raises(SensprofError, match="partial"):
        load_profile(out, require_complete=True)
    part0 = _bytes(out, "parts/layer_0000.json")

    resumed = []

    def spy(model_, session, layer, *a, **k):
        resumed.append(layer)
        return real(model_, session, layer, *a, **k)

    monkeypatch.setattr(profile_mod, "profile_layer", spy)
    prof = run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=out, progress=False)
    assert resumed == [1, 2]  # layer 0 was not redone...
    assert _bytes(out, "parts/layer_0000.json") == part0  # ...and its part was kept as written
    assert prof.meta["complete"] is True and prof.meta["layers_done"] == [0, 1, 2]
    _assert_same_tables(out, ref_dir)
    assert _parts(out) == _parts(ref_dir)

    # the same command once more only reads the finished profile
    resumed.clear()
    again = run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=out, progress=False)
    assert resumed == []
    assert again.table.equals(prof.table)


# ---------------------------------------------------------------- (b) kill -9 of the CLI, resumed


@pytest.fixture(scope="module")
def deep_model_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama with 16 layers, so a CLI run lasts long enough to be killed between parts."""
    cfg, cls = tiny_config("llama")
    cfg.num_hidden_layers = 16
    torch.manual_seed(0)
    model = cls(cfg).eval()
    d = tmp_path_factory.mktemp("deep-llama")
    model.save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return str(d)


def _cli_env():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    return env


def _profile_args(model_dir, out):
    return ["profile", "--model", model_dir, "--seq-len", "64", "--windows", "2", "--schemes",
            "int4_c32,int2_t32,fp8_e4m3,q4_0", "--out", out, "--quiet", "--device", "cpu"]


# The CLI in a subprocess that stops dead right after writing one layer's part file (before the tables and
# meta.json catch up, the worst moment for a kill) and says so, so the test kills it there every time.
STOP_AFTER_PART = """
import os, sys, time
import sensprof.profiling.profile as profile
real = profile.write_json
stop = "layer_%04d.json" % int(os.environ["STOP_AFTER_LAYER"])

def write_json(path, obj):
    real(path, obj)
    if os.path.basename(path) == stop:
        print("PART WRITTEN", flush=True)
        time.sleep(600)

profile.write_json = write_json
from sensprof.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def deep_reference(deep_model_dir, tmp_path_factory):
    """The uninterrupted CLI run of the 16-layer model."""
    from sensprof.cli import main

    ref = str(tmp_path_factory.mktemp("deep-ref") / "uninterrupted")
    assert main(_profile_args(deep_model_dir, ref)) == 0
    return ref


def _kill_after_part(cmd_args, layer, cwd) -> None:
    """Run the CLI until it has written `layer`'s part, then kill -9 it there."""
    proc = subprocess.Popen([sys.executable, "-c", STOP_AFTER_PART, *cmd_args], cwd=cwd,
                            env={**_cli_env(), "STOP_AFTER_LAYER": str(layer)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        lines = []
        for line in proc.stdout:  # ends if the run exits without writing that part
            lines.append(line)
            if line.strip() == b"PART WRITTEN":
                break
        else:
            pytest.fail("the run ended before writing the part; it said:\n" + b"".join(lines).decode()[-3000:])
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("layer", [6, 15], ids=["mid-run", "after-the-last-part"])
def test_resume_after_kill_9(deep_model_dir, deep_reference, tmp_path, layer):
    out = str(tmp_path / "killed")
    args = _profile_args(deep_model_dir, out)
    _kill_after_part(args, layer, tmp_path)
    done_before = _parts(out)
    assert done_before == [f"layer_{i:04d}.json" for i in range(layer + 1)]
    meta = json.loads(_bytes(out, "meta.json"))
    assert meta["layers_done"] == list(range(layer)) and meta["complete"] is False  # meta.json is a layer behind
    kept = {name: _bytes(out, os.path.join("parts", name)) for name in done_before}
    with open(os.path.join(out, ".tmp-abcdprofile.csv"), "w") as f:  # what a kill during an atomic write leaves
        f.write("layer,layer_kind\n0,fu")

    r = subprocess.run([sys.executable, "-m", "sensprof", *args], cwd=tmp_path, env=_cli_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _parts(out) == [f"layer_{i:04d}.json" for i in range(16)]
    for name, data in kept.items():  # finished layers were not redone
        assert _bytes(out, os.path.join("parts", name)) == data, name
    meta = json.loads(_bytes(out, "meta.json"))
    assert meta["complete"] is True and meta["layers_done"] == list(range(16))
    _assert_same_tables(out, deep_reference)
    assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    prof = load_profile(out, require_complete=True)
    assert len(prof.table) == 16 * 8


def test_complete_rerun_rebuilds_tables_left_behind(reference, tmp_path, monkeypatch):
    """Every part written but the tables and meta.json a layer behind (a kill between them): re-running the same
    profile computes nothing, rebuilds profile.csv, heads.csv and meta.json from parts/ and drops temp files."""
    import pandas as pd

    model, ref_dir = reference
    out = str(tmp_path / "behind")
    shutil.copytree(ref_dir, out)
    meta = json.loads(_bytes(out, "meta.json"))
    meta.update(layers_done=[0, 1], complete=False)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)
    for name in ("profile.csv", "heads.csv"):
        t = pd.read_csv(os.path.join(out, name))
        t[t.layer < 2].to_csv(os.path.join(out, name), index=False)
    for name in (".tmp-x1meta.json", os.path.join("parts", ".tmp-x2layer_0002.json")):
        with open(os.path.join(out, name), "w") as f:
            f.write("{")
    with pytest.raises(SensprofError, match="partial"):
        load_profile(out, require_complete=True)

    calls = []
    monkeypatch.setattr(profile_mod, "profile_layer", lambda *a, **k: calls.append(a[2]))
    prof = run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=out, progress=False)
    assert calls == []
    assert prof.meta["complete"] is True and prof.meta["layers_done"] == [0, 1, 2]
    _assert_same_tables(out, ref_dir)
    assert json.loads(_bytes(out, "meta.json")) == json.loads(_bytes(ref_dir, "meta.json"))
    assert not [n for d in (out, os.path.join(out, "parts")) for n in os.listdir(d) if n.startswith(".tmp-")]
    stamp = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in ("profile.csv", "heads.csv", "meta.json")}
    run_profile(model, _ids(), parse_schemes(SCHEMES), out_dir=out, progress=False)  # up to date: nothing rewritten
    assert {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in stamp} == stamp


# ---------------------------------------------------------------- (c) directories that are not this profile


@pytest.fixture
def small_profile_dir(reference, tmp_path):
    """A profile of layer 0 only (cheap), written by the reference settings."""
    model, _ = reference
    d = str(tmp_path / "small")
    run_profile(model, _ids(), parse_schemes(SCHEMES), layers=[0], out_dir=d, progress=False)
    return model, d


@pytest.mark.parametrize("change,key", [("schemes", "schemes"), ("seq_len", "seq_len"), ("model", "model_fingerprint"),
                                        ("variants_per_pass", "variants_per_pass"), ("seed", "seed")])
def test_out_dir_with_other_settings_is_refused(small_profile_dir, change, key):
    model, d = small_profile_dir
    ids, schemes, kw = _ids(), parse_schemes(SCHEMES), {}
    if change == "schemes":
        schemes = parse_schemes("int4_c32,int2_t32")
    elif change == "seq_len":
        ids = _ids(32)
    elif change == "model":
        model = make_tiny_model("llama", seed=1)
    elif change == "variants_per_pass":
        kw["variants_per_pass"] = 2
    else:
        kw["seed"] = 7
    before = {n: _bytes(d, n) for n in ("meta.json", "profile.csv", "parts/layer_0000.json")}
    with pytest.raises(SensprofError, match="different model or settings") as e:
        run_profile(model, ids, schemes, out_dir=d, progress=False, **kw)
    assert key in str(e.value)
    assert {n: _bytes(d, n) for n in before} == before  # nothing was touched
    assert _parts(d) == ["layer_0000.json"]


def test_cli_refuses_out_dir_with_other_seq_len(tiny_model_dir, tmp_path, capsys):
    from sensprof.cli import main

    out = str(tmp_path / "cli")
    args = ["profile", "--model", tiny_model_dir, "--windows", "2", "--schemes", "int4_c32,int2_t32", "--layers", "0",
            "--out", out, "--quiet", "--device", "cpu"]
    assert main(args + ["--seq-len", "32"]) == 0
    capsys.readouterr()
    before = _bytes(out, "profile.csv")
    assert main(args + ["--seq-len", "48"]) == 2
    err = capsys.readouterr().err
    assert "different model or settings" in err and "seq_len" in err
    assert main(["profile", "--model", tiny_model_dir, "--windows", "2", "--schemes", "int4_c32", "--layers", "0",
                 "--out", out, "--quiet", "--device", "cpu", "--seq-len", "32"]) == 2
    err = capsys.readouterr().err
    assert "different model or settings" in err and "schemes" in err
    assert _bytes(out, "profile.csv") == before


def test_out_dir_of_a_model_with_other_later_weights_is_refused(small_profile_dir):
    _, d = small_profile_dir
    other = make_tiny_model("llama")
    with torch.no_grad():
        other.model.layers[2].self_attn.k_proj.weight.mul_(-3.0)
        other.model.layers[1].mlp.down_proj.weight.normal_()
    with pytest.raises(SensprofError, match="different model or settings"):
        run_profile(other, _ids(), parse_schemes(SCHEMES), out_dir=d, progress=False)


def test_foreign_directories_are_refused(reference, tmp_path):
    model, _ = reference
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    with pytest.raises(SensprofError, match="not empty"):
        run_profile(model, _ids(), parse_schemes("int4_t32"), out_dir=str(foreign), progress=False)
    assert sorted(os.listdir(foreign)) == ["notes.txt"]
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(SensprofError, match="is a file"):
        run_profile(model, _ids(), parse_schemes("int4_t32"), out_dir=str(a_file), progress=False)
    other_kind = tmp_path / "other-kind"
    other_kind.mkdir()
    (other_kind / "meta.json").write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(SensprofError, match="another kind"):
        run_profile(model, _ids(), parse_schemes("int4_t32"), out_dir=str(other_kind), progress=False)
    # an empty directory is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    prof = run_profile(model, _ids(), parse_schemes("int4_t32"), layers=[2], out_dir=str(empty), progress=False)
    assert set(prof.table.layer) == {2}


# ---------------------------------------------------------------- (d) --layers split and merge


def test_layers_split_then_merge_equals_full_run(reference, tmp_path):
    model, ref_dir = reference
    a, b, merged = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "merged")
    run_profile(model, _ids(), parse_schemes(SCHEMES), layers=parse_layers("0", 3), out_dir=a, progress=False)
    run_profile(model, _ids(), parse_schemes(SCHEMES), layers=parse_layers("1-2", 3), out_dir=b, progress=False)
    assert _parts(a) == ["layer_0000.json"] and _parts(b) == ["layer_0001.json", "layer_0002.json"]
    for d in (a, b):
        with pytest.raises(SensprofError, match="partial"):
            load_profile(d, require_complete=True)
    meta = merge_profiles([a, b], merged)
    assert meta["complete"] is True and meta["layers_done"] == [0, 1, 2]
    _assert_same_tables(merged, ref_dir)
    prof = load_profile(merged, require_complete=True)
    assert prof.table.equals(load_profile(ref_dir).table)
    # the other order gives the same profile
    merged2 = str(tmp_path / "merged2")
    merge_profiles([b, a], merged2)
    _assert_same_tables(merged2, ref_dir, names=("profile.csv", "heads.csv"))
    # a partial merge stays partial
    meta = merge_profiles([b], str(tmp_path / "only-b"))
    assert meta["complete"] is False and meta["layers_done"] == [1, 2]


def test_merging_profiles_of_other_settings_is_refused(reference, tmp_path):
    model, _ = reference
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_profile(model, _ids(), parse_schemes(SCHEMES), layers=[0], out_dir=a, progress=False)
    run_profile(model, _ids(), parse_schemes("int4_c32"), layers=[1], out_dir=b, progress=False)
    with pytest.raises(SensprofError, match="other settings"):
        merge_profiles([a, b], str(tmp_path / "merged"))
    assert not os.path.exists(tmp_path / "merged")
    with pytest.raises(SensprofError):
        merge_profiles([], str(tmp_path / "merged"))


def test_windows_table_holds_each_cells_kl_per_window(reference):
    """windows.csv: each cell's KL on each of the profile's windows, whose mean and spread are profile.csv's."""
    import numpy as np

    _, ref_dir = reference
    prof = load_profile(ref_dir)
    w = prof.windows
    assert list(w.columns) == ["layer", "tensor", "scheme", "window", "kl"]
    assert sorted(set(w.window)) == [0, 1] and len(w) == 2 * len(prof.table)
    by_cell = w.groupby(["layer", "tensor", "scheme"]).kl
    table = prof.table.set_index(["layer", "tensor", "scheme"]).sort_index()
    np.testing.assert_allclose(by_cell.mean().sort_index().to_numpy(), table.kl.to_numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(by_cell.std().sort_index().to_numpy(), table.kl_std.to_numpy(), rtol=1e-5, atol=1e-12)
    assert (w.groupby("window").kl.sum() > 0).all()  # both windows carry damage, not copies of one


def test_profile_without_windows_table_still_loads(profile_copy):
    os.remove(os.path.join(profile_copy, "windows.csv"))  # a profile written before windows.csv
    prof = load_profile(profile_copy, require_complete=True)
    assert prof.windows is None and len(prof.table) == 3 * 7


@pytest.mark.parametrize("damage, match", [("negative", "negative"), ("cut", "truncated"), ("layout", "layout"),
                                           ("twice", "2 times")])
def test_damaged_windows_table_is_reported(profile_copy, damage, match):
    path = os.path.join(profile_copy, "windows.csv")
    lines = open(path).read().splitlines()
    if damage == "negative":
        lines[1] = ",".join(lines[1].split(",")[:4] + ["-0.5"])
    elif damage == "layout":
        lines[0] = "layer,tensor,scheme,slot,kl"
    elif damage == "twice":
        lines.append(lines[1])
    with open(path, "w") as f:
        f.write("\n".join(lines) + ("" if damage == "cut" else "\n"))
    if damage == "cut":
        with open(path, "a") as f:
            f.write("0,K,int4_c32,1")
    with pytest.raises(SensprofError, match=match) as e:
        load_profile(profile_copy)
    assert "windows.csv" in str(e.value) and "sensprof profile" in str(e.value)


# ---------------------------------------------------------------- (e) damaged profile directories


@pytest.fixture
def profile_copy(reference, tmp_path):
    _, ref_dir = reference
    d = str(tmp_path / "copy")
    shutil.copytree(ref_dir, d)
    assert load_profile(d, require_complete=True).meta["complete"]
    return d


@pytest.mark.parametrize("content", ["{not json", "", "\xff\xfe garbage"])
def test_corrupt_meta_is_reported(profile_copy, content):
    with open(os.path.join(profile_copy, "meta.json"), "w", encoding="latin-1") as f:
        f.write(content)
    with pytest.raises(SensprofError, match="corrupt"):
        load_profile(profile_copy)


@pytest.mark.parametrize("name", ["profile.csv", "heads.csv", "stats.csv"])
def test_missing_table_is_reported(profile_copy, name):
    os.remove(os.path.join(profile_copy, name))
    with pytest.raises(SensprofError, match=f"lacks {name}"):
        load_profile(profile_copy)


@pytest.mark.parametrize("name", ["profile.csv", "heads.csv", "stats.csv", "windows.csv"])
@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00garbage\n"])
def test_unreadable_table_is_reported_by_name(profile_copy, name, content):
    """Each of the four tables is read by one reader: emptied or not text, it names itself and the fix."""
    with open(os.path.join(profile_copy, name), "wb") as f:
        f.write(content)
    with pytest.raises(SensprofError, match=f"{name} of profile .* is corrupt; .*sensprof profile"):
        load_profile(profile_copy)


def test_other_damage_is_reported(profile_copy, tmp_path):
    os.remove(os.path.join(profile_copy, "calibration.json"))
    with pytest.raises(SensprofError, match="missing"):
        load_profile(profile_copy)
    with pytest.raises(SensprofError, match="does not exist"):
        load_profile(str(tmp_path / "nowhere"))
    os.remove(os.path.join(profile_copy, "meta.json"))
    with pytest.raises(SensprofError, match="missing"):
        load_profile(profile_copy)


def test_atomic_writes_get_the_mode_a_plain_open_would(tmp_path):
    import os
    import stat

    from sensprof.files import atomic_write_bytes, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(str(tmp_path / "a.txt"), "x")
        atomic_write_bytes(str(tmp_path / "b.png"), b"\x89PNG")
    finally:
        os.umask(old)
    for name in ("a.txt", "b.png"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.png"]  # no temp files left


# ---------------------------------------------------------------- (f) one writer per output folder (issue 24)


FAST = ["--device", "cpu", "--seq-len", "32", "--windows", "2", "--schemes", "fp8_e4m3", "--quiet"]


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, tiny_tokenizer):
    """Another tiny Llama (other weights, 2 layers): the model a careless second run profiles into the same --out."""
    cfg, cls = tiny_config("llama")
    cfg.num_hidden_layers = 2
    torch.manual_seed(1)
    d = tmp_path_factory.mktemp("other-llama")
    cls(cfg).eval().save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return str(d)


def _run_while_locked(monkeypatch, module, name, argv, seen):
    """Patch module.name so that, the first time the running command calls it (holding its folder's lock), a
    second command `argv` runs in this process; its exit code goes to `seen`."""
    from sensprof.cli import main

    real = getattr(module, name)

    def wrapper(*a, **k):
        if not seen:
            seen.append(main([str(x) for x in argv]))
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapper)


def _the_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("sensprof: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_second_profile_into_a_folder_being_written_is_refused(monkeypatch, capsys, tiny_model_dir, other_model_dir,
                                                               tmp_path):
    """Two runs with different models into one --out both said `wrote DIR/`; the folder held one profile."""
    from sensprof.cli import main

    out, seen = tmp_path / "p", []
    _run_while_locked(monkeypatch, profile_mod.PartsStore, "add", ["profile", "--model", other_model_dir, *FAST,
                                                                   "--out", out], seen)
    assert main(["profile", "--model", tiny_model_dir, *FAST, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert seen == [2]
    line = _the_error(err)
    assert f"--out {str(out)!r} is being written by another sensprof run (pid {os.getpid()}: sensprof" in line
    assert "wait for it to finish, or pass another --out" in line
    prof = load_profile(str(out), require_complete=True)  # the first run's profile, whole
    assert len(prof.meta["layers"]) == 3 and prof.meta["model"]["id"] == tiny_model_dir
    assert ".sensprof.lock" not in os.listdir(out)


@pytest.mark.parametrize("command", ["merge", "sweep", "report"])
def test_second_merge_sweep_report_into_a_folder_being_written_is_refused(monkeypatch, capsys, tiny_model_dir,
                                                                         tmp_path, command):
    import sensprof.report as report_mod
    import sensprof.planning.sweep as sweep_mod
    import sensprof.profiling.table as table_mod
    from sensprof.cli import main

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d, layers in ((a, "0"), (b, "1-2")):
        assert main(["profile", "--model", tiny_model_dir, *FAST, "--layers", layers, "--out", d]) == 0
    full = str(tmp_path / "full")
    assert main(["merge", a, b, "--out", full]) == 0
    out = tmp_path / "out"
    argv, (module, name) = {
        "merge": (["merge", a, b, "--out", out], (table_mod, "write_tables")),
        "sweep": (["sweep", full, "--avg-bits", "8,16", "--out", out], (sweep_mod, "make_plan")),
        "report": (["report", full, "--out", out], (report_mod, "atomic_write_text")),
    }[command]
    seen = []
    _run_while_locked(monkeypatch, module, name, argv, seen)
    capsys.readouterr()
    assert main([str(x) for x in argv]) == 0
    assert seen == [2]
    assert "is being written by another sensprof run (pid" in _the_error(capsys.readouterr().err)
    assert ".sensprof.lock" not in os.listdir(out)


# Holds --out's lock as a running profile does, says so, and waits to be killed.
HOLD_LOCK = """
import sys, time
from sensprof.files import output_lock
with output_lock(sys.argv[1]):
    print("LOCKED", flush=True)
    time.sleep(600)
"""


def test_kill_9_leaves_no_stale_lock(capsys, tiny_model_dir, tmp_path):
    """The kernel drops the lock of a killed run: the folder is refused while the holder lives (naming it), and
    the next run after a kill -9 goes ahead."""
    from sensprof.cli import main

    out = tmp_path / "p"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], env=_cli_env(), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"LOCKED"
        assert main(["profile", "--model", tiny_model_dir, *FAST, "--out", str(out)]) == 2
        line = _the_error(capsys.readouterr().err)
        assert f"is being written by another sensprof run (pid {holder.pid}: sensprof " in line
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=60) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
    assert os.path.exists(out / ".sensprof.lock")  # left by the kill: taken over, not obeyed
    assert main(["profile", "--model", tiny_model_dir, *FAST, "--out", str(out)]) == 0
    assert load_profile(str(out), require_complete=True).meta["complete"]
    assert ".sensprof.lock" not in os.listdir(out)


def test_sigterm_ends_a_profile_as_ctrl_c_does(tiny_model_dir, tmp_path):
    """SIGTERM runs the cleanups (the lock, temporary files) and the same command resumes."""
    out = str(tmp_path / "p")
    args = ["profile", "--model", tiny_model_dir, *FAST, "--out", out]
    proc = subprocess.Popen([sys.executable, "-c", STOP_AFTER_PART, *args], cwd=tmp_path,
                            env={**_cli_env(), "STOP_AFTER_LAYER": "0"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "PART WRITTEN":
                break
        assert os.path.exists(os.path.join(out, ".sensprof.lock"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert "Traceback" not in err and "interrupted; run the same command again to resume" in err
    assert ".sensprof.lock" not in os.listdir(out) and not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    r = subprocess.run([sys.executable, "-m", "sensprof", *args], cwd=tmp_path, env=_cli_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert load_profile(out, require_complete=True).meta["layers_done"] == [0, 1, 2]
