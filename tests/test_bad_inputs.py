"""Bad inputs: each is refused with one `sensprof: error:` line naming the problem and the fix, exit code 2, no
traceback, and nothing already written is lost or changed. Damaged profiles, plans and model files, budgets
that mean nothing, outputs that cannot be written, prompts and lengths the model cannot take.

(Resuming after a kill -9 is in profiling/test_resume.py.)"""

from __future__ import annotations

import json
import re
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import tiny_config
from conftest import one_error_line
from test_cli import FAST, assert_one_error_line, cli_error, run_cli, save_model_dir
from test_export import make_plan, save, sglang_plan, vllm_plan

from sensprof.errors import SensprofError
from sensprof.artifacts import load_plan
from sensprof.planning.planner import problem_from_table
from sensprof.profiling.table import load_profile


def snapshot(*paths) -> dict:
    """Every file under `paths` (or the file itself) -> its bytes, to show that nothing changed."""
    out = {}
    for p in map(str, paths):
        files = [p] if os.path.isfile(p) else [os.path.join(d, n) for d, _, ns in os.walk(p) for n in ns]
        for f in files:
            with open(f, "rb") as fh:
                out[f] = fh.read()
    return out


def _writable(d) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=d)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o555)
    try:
        if _writable(d):  # root ignores permission bits: sysfs, which no one may create files in, stands in
            if _writable("/sys"):
                pytest.skip("no read-only directory on this machine")
            yield Path("/sys")
        else:
            yield d
    finally:
        d.chmod(0o755)


# --------------------------------------------------------------------------- damaged profiles


@pytest.fixture(scope="module")
def good_profile(tiny_model_dir, tmp_path_factory):
    """A complete profile of the tiny Llama: 3 layers x K/V x 2 schemes."""
    from sensprof.cli import main

    out = tmp_path_factory.mktemp("bad-inputs") / "profile"
    assert main(["profile", "--model", tiny_model_dir, *FAST[:-3], "--schemes", "fp8_e4m3,int4_c32", "--quiet",
                 "--out", str(out)]) == 0
    return str(out)


@pytest.fixture
def profile_copy(good_profile, tmp_path):
    d = str(tmp_path / "copy")
    shutil.copytree(good_profile, d)
    return d


def _edit_table(d, name="profile.csv", **cells):
    """Set cells of the first row, e.g. kl='nan'; the CSV is rewritten as text so any value goes in."""
    t = pd.read_csv(os.path.join(d, name), dtype=str)
    for col, value in cells.items():
        t.loc[0, col] = value
    t.to_csv(os.path.join(d, name), index=False)


def _plan_and_summary_refuse(capsys, d, tmp_path, *expect):
    before = snapshot(d)
    for argv in (["plan", d, "--avg-bits", "8", "--out", tmp_path / "plan.json"], ["summary", d]):
        msg = cli_error(capsys, *argv)
        for e in expect:
            assert e in msg, msg
    assert not (tmp_path / "plan.json").exists()
    assert snapshot(d) == before
    return msg


@pytest.mark.parametrize("col,value,why", [
    ("kl", "nan", "not finite"), ("kl", "inf", "not finite"), ("dnll", "-inf", "not finite"),
    ("kl_std", "NaN", "not finite"), ("attn_kl", "abc", "not a number"), ("bits", "eight", "not a number"),
    ("kl", "-1e-05", "negative"), ("out_rel_l2", "-0.5", "negative"), ("attn_kl", "-1e-300", "negative"),
])
def test_bad_metric_value_in_profile_csv(capsys, profile_copy, tmp_path, col, value, why):
    _edit_table(profile_copy, **{col: value})
    msg = _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "profile.csv", f"{col} = ", why,
                                   "layer 0 K fp8_e4m3", "re-run the same `sensprof profile`", "rebuilds the table")


def test_negative_dnll_is_accepted(capsys, profile_copy, tmp_path):
    """Quantization noise can lower the NLL a little: dnll < 0 is a measurement, not damage to the table."""
    _edit_table(profile_copy, dnll="-2e-06")
    rc, out, err = run_cli(capsys, "plan", profile_copy, "--avg-bits", "8", "--objective", "dnll",
                           "--out", tmp_path / "p.json")
    assert rc == 0, err


def test_bad_value_in_heads_csv(capsys, profile_copy, tmp_path):
    _edit_table(profile_copy, "heads.csv", attn_kl="nan")
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "heads.csv", "attn_kl = nan", "head 0")


def test_nan_reaching_the_solver_from_python():
    """The planner's own guard, for tables that do not come through load_profile."""
    table = pd.DataFrame([{"layer": 0, "tensor": "K", "scheme": "q4_0", "kl": float("nan"), "kl_std": 0.0},
                          {"layer": 0, "tensor": "V", "scheme": "q4_0", "kl": 1e-3, "kl_std": 0.0}])
    with pytest.raises(SensprofError, match="kl of layer 0 K q4_0 is nan, not a finite number"):
        problem_from_table(table, [{"kv_heads": 2, "head_dim": 32}])


@pytest.mark.parametrize("cut", ["mid-line", "mid-number"])
def test_truncated_profile_csv(capsys, profile_copy, tmp_path, cut):
    path = os.path.join(profile_copy, "profile.csv")
    text = open(path).read()
    end = text.rindex("\n", 0, len(text) - 1) + (20 if cut == "mid-line" else 60)
    open(path, "w").write(text[:end])
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "profile.csv", "is truncated",
                             "re-run the same `sensprof profile`")


def test_profile_csv_missing_its_last_rows(capsys, profile_copy, tmp_path):
    """Cut at a line boundary: every line whole, but cells of layers meta.json lists as done are missing (the
    planner called this an infeasible budget, summary crashed)."""
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"))
    t.iloc[:-3].to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "profile.csv", "is incomplete", "lacks 3 cells",
                             "layer 2", "rebuilds the table from parts/")


def test_truncated_table_is_rebuilt_by_rerunning_the_profile(capsys, tiny_model_dir, profile_copy, tmp_path):
    """The fix the messages name works: the same `sensprof profile` command rebuilds the tables from parts/."""
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"))
    good = open(os.path.join(profile_copy, "profile.csv"), "rb").read()
    t.iloc[:-3].to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    rc, out, err = run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST[:-3], "--schemes", "fp8_e4m3,int4_c32",
                           "--quiet", "--out", profile_copy)
    assert rc == 0, err
    assert open(os.path.join(profile_copy, "profile.csv"), "rb").read() == good
    assert run_cli(capsys, "summary", profile_copy)[0] == 0


def test_table_written_before_the_measured_column_still_loads(profile_copy):
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"))
    t.drop(columns=["measured"]).to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    assert load_profile(profile_copy).table.measured.all()


@pytest.mark.parametrize("mutate,expect", [
    (lambda m: m.pop("layers"), "it has no 'layers'"),
    (lambda m: m.update(layers=[]), "it has no 'layers'"),
    (lambda m: m["layers"][1].pop("head_dim"), "are not layers 0-2"),
    (lambda m: m.pop("settings"), "it has no 'settings'"),
    (lambda m: m["model"].pop("fingerprint"), "no 'model' id and fingerprint"),
    (lambda m: m.update(layers_done=[0, 7]), "'layers_done' are not layer indices"),
], ids=["no-layers", "empty-layers", "layer-without-head_dim", "no-settings", "no-fingerprint", "layers_done"])
def test_damaged_meta_json(capsys, profile_copy, tmp_path, mutate, expect):
    path = os.path.join(profile_copy, "meta.json")
    meta = json.load(open(path))
    mutate(meta)
    json.dump(meta, open(path, "w"))
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "meta.json", "is damaged", expect,
                             "re-run `sensprof profile`")


@pytest.mark.parametrize("value", [float("nan"), -1.0, "big"])
def test_bad_calibration_absmax_in_profile(capsys, profile_copy, tmp_path, value):
    path = os.path.join(profile_copy, "calibration.json")
    cal = json.load(open(path))
    cal["1"]["V"][0] = value
    json.dump(cal, open(path, "w"))
    msg = cli_error(capsys, "plan", profile_copy, "--avg-bits", "8", "--out", tmp_path / "p.json")
    assert "calibration.json" in msg and "layer 1" in msg and "not finite numbers >= 0" in msg
    assert "delete it and re-run the same `sensprof profile`" in msg


# --------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("argv,expect", [
    (["--avg-bits", "inf"], "--avg-bits inf: the budget must be positive and finite"),
    (["--avg-bits", "nan"], "--avg-bits nan: the budget must be positive and finite"),
    (["--avg-bits", "17"], "--avg-bits 17 is above 16, the bits of the unquantized bf16 cache"),
    (["--avg-bits", "16.5"], "pass at most 16"),
    (["--gpu-mem-gib", "inf", "--max-model-len", "64", "--max-num-seqs", "1"], "--gpu-mem-gib inf"),
])
def test_meaningless_budget(capsys, good_profile, tmp_path, argv, expect):
    msg = cli_error(capsys, "plan", good_profile, *argv, "--out", tmp_path / "p.json")
    assert expect in msg
    assert not (tmp_path / "p.json").exists()


def test_sixteen_bits_is_the_whole_cache(capsys, good_profile, tmp_path):
    rc, out, err = run_cli(capsys, "plan", good_profile, "--avg-bits", "16", "--out", tmp_path / "p.json")
    assert rc == 0, err
    assert "Infinity" not in (tmp_path / "p.json").read_text()


def test_sweep_refuses_a_meaningless_budget_before_writing_any_plan(capsys, good_profile, tmp_path):
    msg = cli_error(capsys, "sweep", good_profile, "--avg-bits", "4,8,17", "--out", tmp_path / "sweep")
    assert "--avg-bits 17 is above 16" in msg
    assert not (tmp_path / "sweep").exists()


def test_plan_json_is_never_written_with_nan(tmp_path):
    plan = make_plan("sensprof", {}, [("q4_0", "q4_0")] * 3)
    plan = plan.replace(predicted=dataclasses.replace(plan.predicted, damage=float("inf")))
    with pytest.raises(SensprofError, match="NaN or infinite"):
        plan.save(str(tmp_path / "p.json"))
    assert not os.listdir(tmp_path)


# --------------------------------------------------------------------------- damaged plans


def _export(capsys, plan_path, *argv):
    return cli_error(capsys, "export", plan_path, *argv)


@pytest.mark.parametrize("n", [2, 4])
def test_plan_for_another_layer_count_without_model(capsys, tiny_model_dir, tmp_path, n):
    """`export` without --model loads no weights, but reads the config of the model the plan names."""
    plan = vllm_plan(kinds=[("full", None)] * n)
    plan = plan.replace(model_id=tiny_model_dir)
    msg = _export(capsys, save(plan, tmp_path), "--format", "vllm")
    assert f"the plan has {n} layers but {tiny_model_dir} has 3" in msg and "--model" in msg and "re-plan" in msg
    plan = vllm_plan(kinds=[("full", None)] * 3)  # the tiny model's count: no complaint
    plan = plan.replace(model_id=tiny_model_dir)
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "vllm")
    assert rc == 0, err


@pytest.fixture(scope="module")
def real_fingerprint(tiny_model_dir):
    from sensprof.models import fingerprint, load_model

    return fingerprint(load_model(tiny_model_dir, "cpu").model)


@pytest.mark.parametrize("n", [2, 4])
def test_plan_for_another_layer_count_with_model(capsys, tiny_model_dir, real_fingerprint, tmp_path, n):
    plan = make_plan("vllm", {"kv_cache_dtype": "fp8_e4m3", "skip_layers": []}, [("fp8_e4m3", "fp8_e4m3")] * n,
                     [("full", None)] * n, model_id=tiny_model_dir, fingerprint=real_fingerprint)
    msg = _export(capsys, save(plan, tmp_path), "--format", "vllm", "--model", tiny_model_dir)
    assert f"the plan has {n} layers but {tiny_model_dir} has 3" in msg


def test_plan_with_other_layer_shapes_with_model(capsys, tiny_model_dir, real_fingerprint, tmp_path):
    plan = make_plan("vllm", {"kv_cache_dtype": "fp8_e4m3", "skip_layers": []}, [("fp8_e4m3", "fp8_e4m3")] * 3,
                     [("full", None)] * 3, model_id=tiny_model_dir, fingerprint=real_fingerprint)  # head_dim 16
    msg = _export(capsys, save(plan, tmp_path), "--format", "vllm", "--model", tiny_model_dir)
    assert "the plan's layer 0 has 2 KV heads x 16" in msg and "x 32" in msg


@pytest.mark.parametrize("edit,expect", [
    (lambda o: o["layers"].pop(), "lists 2 layers holding"),  # the prediction says 3
    (lambda o: o["layers"].append(dict(o["layers"][-1], layer=3)), "lists 4 layers holding"),
    (lambda o: o["layers"][1].update(layer=5), "not layers 0-N in order"),
    (lambda o: o.update(layers=[]), "not layers 0-N in order"),
    (lambda o: o["layers"][0].update(head_dim=0), "not positive integers"),
    (lambda o: o["layers"][0].update(k_scheme="int3_bogus"), "unknown scheme 'int3_bogus'"),
])
def test_plan_that_contradicts_itself(capsys, tmp_path, edit, expect):
    obj = vllm_plan(kinds=[("full", None)] * 3).to_json()
    edit(obj)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj))
    msg = _export(capsys, path, "--format", "vllm")
    assert expect in msg


@pytest.mark.parametrize("value", [float("nan"), -2.0, float("inf")])
def test_plan_with_bad_calibration_writes_no_scales(capsys, tmp_path, value):
    obj = sglang_plan().to_json()
    obj["layers"][1]["absmax"]["V"][0] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj))
    msg = _export(capsys, path, "--format", "sglang", "--scales-out", tmp_path / "scales.json")
    assert "layer 1" in msg and "V calibration absmax" in msg and "re-profile" in msg
    assert not (tmp_path / "scales.json").exists()
    with pytest.raises(SensprofError, match="calibration absmax"):
        load_plan(str(path))


# --------------------------------------------------------------------------- model files


def _model_dir_without_weights(tmp_path, tiny_model_dir, name):
    d = tmp_path / name
    d.mkdir()
    for f in os.listdir(tiny_model_dir):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(tiny_model_dir, f), d)
    return d


def test_model_dir_with_config_but_no_weights(capsys, tiny_model_dir, tmp_path):
    d = _model_dir_without_weights(tmp_path, tiny_model_dir, "no-weights")
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "has a config.json but no weights" in msg and "pass a complete model directory" in msg
    assert not (tmp_path / "out").exists()


def test_a_profile_that_fails_leaves_no_folders_behind(capsys, tiny_model_dir, tmp_path):
    """The --out lock is taken before the model loads: the folders it made go again when the run fails."""
    d = _model_dir_without_weights(tmp_path, tiny_model_dir, "no-weights")
    cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "new" / "deeper" / "out")
    assert not (tmp_path / "new").exists()


class _Trap:
    """Unpickling this creates a file: the proof that a pickle was executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_weights_are_refused_unread(capsys, tiny_model_dir, tmp_path):
    import pickle

    d = _model_dir_without_weights(tmp_path, tiny_model_dir, "pickled")
    marker = tmp_path / "unpickled"
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": _Trap(str(marker))}, f)
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "pytorch_model.bin" in msg and "pickle weights are not loaded" in msg and "convert to safetensors" in msg
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_truncated_safetensors(capsys, tiny_model_dir, tmp_path):
    d = _model_dir_without_weights(tmp_path, tiny_model_dir, "truncated")
    data = open(os.path.join(tiny_model_dir, "model.safetensors"), "rb").read()
    (d / "model.safetensors").write_bytes(data[: len(data) // 3])
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "weights of" in msg and "truncated or damaged" in msg and "download or save them again" in msg


K_PROJ = "model.layers.1.self_attn.k_proj.weight"


def _model_dir_with_edited_weights(tmp_path, tiny_model_dir, name, edit):
    """A copy of the tiny model whose safetensors weights `edit(weights)` changed in place."""
    from safetensors.torch import load_file, save_file

    d = _model_dir_without_weights(tmp_path, tiny_model_dir, name)
    weights = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    edit(weights)
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def test_safetensors_without_a_layers_tensor_is_refused_not_started_at_random(capsys, tiny_model_dir, tmp_path):
    """transformers fills a tensor missing from the checkpoint with random values and only warns: the profile would
    measure a model that is not the user's."""
    d = _model_dir_with_edited_weights(tmp_path, tiny_model_dir, "missing", lambda w: w.pop(K_PROJ))
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "lack 1 tensor(s) its config needs" in msg and K_PROJ in msg and "pass a complete, unmodified model" in msg
    assert not (tmp_path / "out").exists()


def test_safetensors_with_a_tensor_of_another_shape(capsys, tiny_model_dir, tmp_path):
    d = _model_dir_with_edited_weights(tmp_path, tiny_model_dir, "reshaped",
                                       lambda w: w.update({K_PROJ: w[K_PROJ][:-1].contiguous()}))
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "do not match its config (tensors of other shapes)" in msg and "pass a complete, unmodified model" in msg


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(3)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_head_count(4)
    # a whole tokenizer (tokens, scores, types), so that what is wrong is the weights on every transformers version
    # (5.17 refuses a GGUF Llama tokenizer without scores before it looks at the weights)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + [f"t{i}" for i in range(61)])
    w.add_token_scores([0.0] * 320)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * 61)
    w.add_tensor("token_embd.weight", np.zeros((320, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("keep", [40, 0.5, 0.99], ids=["in-the-header", "in-the-tensors", "the-last-bytes"])
def test_truncated_gguf(capsys, tiny_gguf, tmp_path, keep):
    data = open(tiny_gguf, "rb").read()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    for argv in (["profile", "--model", path, *FAST, "--out", tmp_path / "out"],
                 ["export", save(sglang_plan(model_id=str(path)), tmp_path), "--format", "sglang",
                  "--scales-out", tmp_path / "s.json"]):
        msg = cli_error(capsys, *argv)
        assert "cut.gguf" in msg and "is truncated or damaged" in msg and "download or convert it again" in msg
    assert not (tmp_path / "out").exists() and not (tmp_path / "s.json").exists()


def test_whole_gguf_with_too_few_tensors_is_not_called_truncated(capsys, tiny_gguf, tmp_path):
    """The GGUF parses (gguf's reader says so), but its one tensor is not all its config needs."""
    msg = cli_error(capsys, "profile", "--model", tiny_gguf, *FAST, "--out", tmp_path / "out")
    assert "lack" in msg and "its config needs" in msg and "truncated" not in msg


# --------------------------------------------------------------------------- outputs that cannot be written


def test_export_write_checkpoint_onto_an_existing_file(capsys, tiny_model_dir, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    path = save(vllm_plan(kinds=[("full", None)] * 3), tmp_path)
    msg = _export(capsys, path, "--format", "vllm", "--write-checkpoint", f)
    assert "--write-checkpoint" in msg and "is an existing file" in msg and "pass a new directory path" in msg
    msg = _export(capsys, path, "--format", "vllm", "--write-checkpoint", f / "sub")
    assert "cannot write to --write-checkpoint" in msg
    assert f.read_text() == "mine"


def test_export_scales_out_naming_a_directory(capsys, tmp_path):
    d = tmp_path / "scales"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    msg = _export(capsys, save(sglang_plan(), tmp_path), "--format", "sglang", "--scales-out", d)
    assert "--scales-out" in msg and "is a directory; pass a file path" in msg
    assert snapshot(d) == {str(d / "keep.txt"): b"mine"}


def test_plan_out_naming_a_directory(capsys, good_profile, tmp_path):
    d = tmp_path / "plans"
    d.mkdir()
    msg = cli_error(capsys, "plan", good_profile, "--avg-bits", "8", "--out", d)
    assert "--out" in msg and "is a directory; pass a file path" in msg
    assert os.listdir(d) == []


def test_outputs_in_a_read_only_directory(capsys, tiny_model_dir, good_profile, read_only_dir, tmp_path):
    before = snapshot(good_profile)
    for argv in (["plan", good_profile, "--avg-bits", "8", "--out", read_only_dir / "plan.json"],
                 ["sweep", good_profile, "--avg-bits", "4,8", "--out", read_only_dir / "sweep"],
                 ["profile", "--model", tiny_model_dir, *FAST, "--out", read_only_dir / "profile"],
                 ["merge", good_profile, "--out", read_only_dir / "merged"],
                 ["export", save(sglang_plan(), tmp_path), "--format", "sglang", "--scales-out",
                  read_only_dir / "s.json"]):
        msg = cli_error(capsys, *argv)
        assert "cannot write to" in msg and "pass a path in a writable directory" in msg, argv
    assert snapshot(good_profile) == before


def test_sweep_out_naming_a_file(capsys, good_profile, tmp_path):
    f = tmp_path / "sweep"
    f.write_text("mine")
    msg = cli_error(capsys, "sweep", good_profile, "--avg-bits", "8", "--out", f)
    assert "is a file; pass a directory path" in msg and f.read_text() == "mine"


def test_merge_out_naming_one_of_its_inputs(capsys, tiny_model_dir, tmp_path):
    from sensprof.cli import main

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d, layers in ((a, "0"), (b, "1-2")):
        assert main(["profile", "--model", tiny_model_dir, *FAST, "--layers", layers, "--out", d]) == 0
    before = snapshot(a, b)
    for out in (b, b + "/", os.path.relpath(a)):
        msg = cli_error(capsys, "merge", a, b, "--out", out)
        assert "is also one of its inputs" in msg and "pass a new directory as --out" in msg
    assert snapshot(a, b) == before


# --------------------------------------------------------------------------- generate and validate


@pytest.fixture(scope="module")
def short_model(tiny_tokenizer, tmp_path_factory):
    """A tiny Llama of 64 positions and a sensprof plan for it (with its real fingerprint)."""
    from sensprof.models import fingerprint

    from sensprof.models import load_model

    cfg, cls = tiny_config("llama")
    cfg.max_position_embeddings = 64
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("short")
    d = save_model_dir(cls(cfg).eval(), root / "model", tiny_tokenizer)

    plan = make_plan("sensprof", {}, [("int4_c32", "int4_c32")] * 3, [("full", None)] * 3, model_id=d,
                     fingerprint=fingerprint(load_model(d, "cpu").model), head_dim=32)
    return d, save(plan, root)


def test_generate_empty_prompt(capsys, short_model):
    _, plan = short_model
    for argv in (["--prompt", ""], ["--prompt", "hello", "--prompt", ""]):
        msg = cli_error(capsys, "generate", "--plan", plan, *argv, "--device", "cpu")
        assert "is empty; pass the text to continue" in msg


def test_generate_past_the_models_positions(capsys, short_model):
    d, plan = short_model
    msg = cli_error(capsys, "generate", "--plan", plan, "--prompt", "the quick brown fox " * 100,
                    "--max-new-tokens", "4", "--device", "cpu")
    assert "past the model's 64 positions" in msg and "shorten the prompt or lower --max-new-tokens" in msg
    msg = cli_error(capsys, "generate", "--plan", plan, "--prompt", "hello", "--max-new-tokens", "80",
                    "--device", "cpu")
    assert "past the model's 64 positions" in msg
    rc, out, err = run_cli(capsys, "generate", "--plan", plan, "--prompt", "hello", "--max-new-tokens", "4",
                           "--device", "cpu", "--kernels", "reference")
    assert rc == 0, err


def test_validate_past_the_models_positions(capsys, short_model, tmp_path):
    _, plan = short_model
    msg = cli_error(capsys, "validate", plan, "--seq-len", "65", "--device", "cpu", "--out", tmp_path / "v.csv")
    assert "--seq-len 65 is beyond the model's 64 positions" in msg and "lengths <= 64" in msg
    obj = json.loads(open(plan).read())
    obj["profile"]["settings"]["seq_len"] = 128  # a profile length the model cannot hold, and no --seq-len
    (tmp_path / "long.json").write_text(json.dumps(obj))
    msg = cli_error(capsys, "validate", tmp_path / "long.json", "--device", "cpu", "--out", tmp_path / "v.csv")
    assert "--seq-len 128 is beyond the model's 64 positions" in msg
    assert not (tmp_path / "v.csv").exists()


def test_validate_out_naming_a_directory_fails_before_measuring(capsys, short_model, tmp_path):
    _, plan = short_model
    msg = cli_error(capsys, "validate", plan, "--device", "cpu", "--out", tmp_path)
    assert "is a directory; pass a file path" in msg


def test_subprocess_bad_profile_is_one_line(good_profile, tmp_path):
    """End to end: the real exit code and stderr of a damaged profile given to `plan`."""
    import subprocess
    import sys

    d = tmp_path / "nan"
    shutil.copytree(good_profile, d)
    _edit_table(str(d), kl="nan")
    r = subprocess.run([sys.executable, "-m", "sensprof", "plan", str(d), "--avg-bits", "8", "--out",
                        str(tmp_path / "p.json")], capture_output=True, text=True, timeout=120)
    assert_one_error_line(r.returncode, r.stdout, r.stderr)
    assert "kl = nan" in r.stderr


# --------------------------------------------------------------------------- issue 24: crafted and damaged artifacts


def test_duplicate_cells_in_profile_csv(capsys, profile_copy, tmp_path):
    """A cell twice: the planner read one copy and the plan recorded another's damage."""
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"), dtype=str)
    pd.concat([t, t.iloc[[0]].assign(kl="0.5")]).to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "profile.csv", "holds the cell layer 0 K fp8_e4m3 2 times",
                             "rebuilds the table from parts/")


def test_duplicate_heads_in_heads_csv(capsys, profile_copy, tmp_path):
    t = pd.read_csv(os.path.join(profile_copy, "heads.csv"), dtype=str)
    pd.concat([t] * 3).to_csv(os.path.join(profile_copy, "heads.csv"), index=False)
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "heads.csv", "3 times", "rebuilds the table")


def test_bad_value_in_windows_csv(capsys, profile_copy, tmp_path):
    _edit_table(profile_copy, "windows.csv", kl="inf")
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "windows.csv", "kl = inf", "not finite")


def test_duplicate_cells_are_fixed_by_the_command_the_message_names(capsys, tiny_model_dir, profile_copy, tmp_path):
    good = open(os.path.join(profile_copy, "profile.csv"), "rb").read()
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"), dtype=str)
    pd.concat([t, t]).to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    rc, out, err = run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST[:-3], "--schemes", "fp8_e4m3,int4_c32",
                           "--quiet", "--out", profile_copy)
    assert rc == 0, err
    assert open(os.path.join(profile_copy, "profile.csv"), "rb").read() == good


@pytest.mark.parametrize("layer", ["3", "7", "1.5"])
def test_layer_the_model_does_not_have_in_profile_csv(capsys, profile_copy, tmp_path, layer):
    t = pd.read_csv(os.path.join(profile_copy, "profile.csv"), dtype=str)
    pd.concat([t, t.iloc[[0]].assign(layer=layer)]).to_csv(os.path.join(profile_copy, "profile.csv"), index=False)
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "profile.csv", f"has layer {layer}, which the profiled "
                             "model (layers 0-2) does not have", "rebuilds the table from parts/")


@pytest.mark.parametrize("key,value", [("kv_heads", 0), ("head_dim", -768), ("kv_heads", 1.5), ("head_dim", "32")])
def test_non_positive_shapes_in_meta_json(capsys, profile_copy, tmp_path, key, value):
    """kv_heads 0 divided by zero in the planner; a negative head_dim made a plan of negative bytes per token."""
    path = os.path.join(profile_copy, "meta.json")
    meta = json.load(open(path))
    meta["layers"][1][key] = value
    json.dump(meta, open(path, "w"))
    _plan_and_summary_refuse(capsys, profile_copy, tmp_path, "meta.json", "is damaged", "its layer 1 has",
                             "must be positive integers", "re-run `sensprof profile`")


def _merge_inputs(tiny_model_dir, tmp_path):
    from sensprof.cli import main

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d, layers in ((a, "0"), (b, "1-2")):
        assert main(["profile", "--model", tiny_model_dir, *FAST, "--layers", layers, "--out", d]) == 0
    return a, b


def _edit_part(d, layer, edit, rename_to=None):
    path = os.path.join(d, "parts", f"layer_{layer:04d}.json")
    part = json.load(open(path))
    edit(part)
    os.remove(path)
    new = os.path.join(d, "parts", f"layer_{rename_to if rename_to is not None else layer:04d}.json")
    json.dump(part, open(new, "w"))
    return new


@pytest.mark.parametrize("edit,rename_to,expect", [
    (lambda p: p["rows"][0].update(kl=float("nan")), None, "kl = nan"),
    (lambda p: p["rows"][0].update(kl=-0.25), None, "kl = -0.25"),
    (lambda p: p.update(layer=7) or [r.update(layer=7) for r in p["rows"]], 7, "holds layer 7, which the profiled "
     "model (layers 0-2) does not have"),
    (lambda p: None, 0, "holds layer 2 but is named for another"),
    (lambda p: p["rows"].append(dict(p["rows"][0])), None, "holds the cell layer 2 K fp8_e4m3 twice"),
    (lambda p: p["rows"][0].update(layer=1), None, "holds rows of another layer"),
], ids=["nan-kl", "negative-kl", "layer-7", "renamed", "duplicate-cell", "row-of-another-layer"])
def test_merge_refuses_damaged_parts(capsys, tiny_model_dir, tmp_path, edit, rename_to, expect):
    """merge copied such parts and called the result complete; plan then sent the user back to merge."""
    a, b = _merge_inputs(tiny_model_dir, tmp_path)
    path = _edit_part(b, 2, edit, rename_to)
    before = snapshot(a, b)
    msg = cli_error(capsys, "merge", a, b, "--out", tmp_path / "merged")
    assert expect in msg and repr(path) in msg, msg
    assert "re-run the same `sensprof profile` command" in msg and "merge" not in msg.split(";")[-1]
    assert not (tmp_path / "merged").exists()
    assert snapshot(a, b) == before


def test_merge_refuses_inputs_of_another_layer_count(capsys, tiny_model_dir, tmp_path):
    a, b = _merge_inputs(tiny_model_dir, tmp_path)
    meta = json.load(open(os.path.join(b, "meta.json")))
    meta["layers"].append(dict(meta["layers"][-1], index=3))
    json.dump(meta, open(os.path.join(b, "meta.json"), "w"))
    msg = cli_error(capsys, "merge", a, b, "--out", tmp_path / "merged")
    assert "profile of 4 layers" in msg and "of 3" in msg
    assert not (tmp_path / "merged").exists()


def test_resume_refuses_a_part_the_model_does_not_have(capsys, tiny_model_dir, tmp_path):
    """The resume rewrote meta.json with layers the model does not have; now it names the part to delete."""
    out = tmp_path / "p"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--layers", "0", "--out", out)[0] == 0
    stray = _edit_part(str(out), 0, lambda p: p.update(layer=5) or [r.update(layer=5) for r in p["rows"]], 5)
    before = snapshot(out)
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", out)
    assert repr(stray) in msg and "holds layer 5" in msg and "delete it" in msg
    assert snapshot(out) == before
    os.remove(stray)  # the fix the message names
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", out)[0] == 0
    assert load_profile(str(out), require_complete=True).meta["layers_done"] == [0, 1, 2]


def test_parts_without_meta_json_are_not_adopted(capsys, tiny_model_dir, tmp_path):
    """Parts of an unknown run (no meta.json) were mixed into the next profile written there."""
    out = tmp_path / "p"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--layers", "0", "--out", out)[0] == 0
    os.remove(out / "meta.json")
    before = snapshot(out)
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", out)
    assert "holds profile parts but no meta.json" in msg and "pass another --out" in msg
    assert snapshot(out) == before


def test_symlinked_parts_folder_is_refused(capsys, tiny_model_dir, tmp_path):
    """parts/ as a symlink was written through, and .tmp-* files in its target deleted."""
    out = tmp_path / "p"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--layers", "0", "--out", out)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(out / "parts"), elsewhere)
    (elsewhere / ".tmp-mine").write_text("keep me")
    os.symlink(elsewhere, out / "parts")
    before = snapshot(out, elsewhere)
    for argv in (["profile", "--model", tiny_model_dir, *FAST, "--out", out],
                 ["merge", out, "--out", tmp_path / "merged"]):
        msg = cli_error(capsys, *argv)
        assert "'parts'" in msg and "symbolic link" in msg, msg
    assert snapshot(out, elsewhere) == before and (elsewhere / ".tmp-mine").read_text() == "keep me"
    assert not (tmp_path / "merged").exists()


# --------------------------------------------------------------------------- issue 24: full disks, odd outputs


def test_full_disk_during_profile_is_one_line_and_resumes(capsys, monkeypatch, tiny_model_dir, good_profile, tmp_path):
    """OSError ENOSPC from an atomic write mid-run: one line, no temporary files, every file on disk whole; the
    same command afterwards finishes the profile exactly as an uninterrupted run."""
    import errno

    real, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) >= 6:  # calibration, stats, meta, part 0, profile.csv: then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    out = tmp_path / "p"
    argv = ["profile", "--model", tiny_model_dir, *FAST[:-3], "--schemes", "fp8_e4m3,int4_c32", "--quiet", "--out", out]
    monkeypatch.setattr(os, "fsync", fsync)
    msg = cli_error(capsys, *argv)
    monkeypatch.undo()
    assert "no space left writing" in msg and "free space" in msg and "run the same command again" in msg
    assert len(calls) == 6
    names = [n for _, _, ns in os.walk(out) for n in ns]
    assert not [n for n in names if n.startswith(".tmp-")] and ".sensprof.lock" not in names
    json.load(open(out / "meta.json"))
    json.load(open(out / "parts" / "layer_0000.json"))
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err
    for name in ("profile.csv", "heads.csv", "calibration.json"):
        assert (out / name).read_bytes() == open(os.path.join(good_profile, name), "rb").read(), name


def test_export_gpu_mem_gib_inf(capsys, tmp_path):
    msg = _export(capsys, save(vllm_plan(kinds=[("full", None)] * 3), tmp_path), "--format", "vllm",
                  "--gpu-mem-gib", "inf")
    assert "--gpu-mem-gib must be positive and finite, got inf" in msg


@pytest.mark.parametrize("link_to", ["empty-dir", "nowhere"])
def test_export_write_checkpoint_naming_a_symlink(capsys, tmp_path, link_to):
    target = tmp_path / link_to
    if link_to == "empty-dir":
        target.mkdir()
    link = tmp_path / "ckpt"
    os.symlink(target, link)
    msg = _export(capsys, save(vllm_plan(kinds=[("full", None)] * 3), tmp_path), "--format", "vllm",
                  "--write-checkpoint", link)
    assert "--write-checkpoint" in msg and "is a symbolic link" in msg and "pass a new directory path" in msg
    assert os.path.islink(link) and os.readlink(link) == str(target)
    assert not target.exists() or os.listdir(target) == []


# --------------------------------------------------------------------------- issue 24: empty values, wrong kinds


@pytest.mark.parametrize("flag", ["--schemes", "--k-schemes", "--v-schemes", "--layers"])
@pytest.mark.parametrize("value", ["", ",", " , "])
def test_empty_profile_lists(capsys, tiny_model_dir, tmp_path, flag, value):
    """--k-schemes '' ran the full default menu."""
    argv = [a for a in FAST if a not in ("--schemes", "fp8_e4m3")]
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *argv, flag, value, "--out", tmp_path / "out")
    assert f"{flag} is empty" in msg and f"leave {flag} out" in msg
    assert not (tmp_path / "out").exists()


def test_validate_windows_zero(capsys, short_model, tmp_path):
    """validate --windows 0 ran the default number, while profile --windows 0 is refused."""
    _, plan = short_model
    msg = cli_error(capsys, "validate", plan, "--windows", "0", "--device", "cpu", "--out", tmp_path / "v.csv")
    assert "--windows 0 is too few" in msg
    assert not (tmp_path / "v.csv").exists()


def test_sweep_windows_zero(capsys, good_profile, tmp_path):
    msg = cli_error(capsys, "sweep", good_profile, "--avg-bits", "8", "--validate", "--windows", "0",
                    "--out", tmp_path / "s")
    assert "--windows 0 is too few" in msg
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value,why", [("nan", "is not a finite number"), ("inf", "is not a finite number"),
                                       ("-1", "is negative")])
def test_plan_robust_not_a_finite_multiple(capsys, good_profile, tmp_path, value, why):
    """--robust nan blamed the profile (a NaN cost); the argument is what is wrong."""
    msg = cli_error(capsys, "plan", good_profile, "--avg-bits", "8", "--robust", value, "--out", tmp_path / "p.json")
    assert f"--robust {value} {why}" in msg and "profile" not in msg
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("content", [b"", b"\x89PNG\r\n\x1a\n\x00\x00", b"   \n", b"\xff\xfe\x00garbage"])
def test_empty_or_binary_plan_file(capsys, tmp_path, content):
    """An empty or binary plan file said to re-run `sensprof profile`."""
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    for argv in (["export", path, "--format", "vllm"], ["validate", path, "--device", "cpu"],
                 ["generate", "--plan", path, "--prompt", "hi", "--device", "cpu"]):
        msg = cli_error(capsys, *argv)
        assert "is not a sensprof plan" in msg and "sensprof plan" in msg and "sensprof profile" not in msg, msg


def test_file_where_a_folder_goes_and_the_reverse(capsys, good_profile, tmp_path):
    """Each said "does not exist". (--text takes a folder, but not one without a text file: hidden and binary ones
    are skipped.)"""
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    no_text = tmp_path / "no-text"
    (no_text / ".git").mkdir(parents=True)
    (no_text / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (no_text / ".notes.txt").write_text("hidden")
    (no_text / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    for argv, expect in ((["summary", a_file], "is a file, not a folder"),
                         (["plan", a_file, "--avg-bits", "8", "--out", tmp_path / "p.json"], "is a file, not a folder"),
                         (["merge", good_profile, a_file, "--out", tmp_path / "m"], "is a file, not a folder"),
                         (["report", good_profile, "--sweep", a_file, "--out", tmp_path / "r"],
                          "is a file, not a folder"),
                         (["export", tmp_path, "--format", "vllm"], "is a folder, not a plan file"),
                         (["validate", tmp_path, "--device", "cpu"], "is a folder, not a plan file"),
                         (["profile", "--text", no_text, *FAST, "--out", tmp_path / "o"],
                          "is a folder with no text file in it")):
        msg = cli_error(capsys, *argv)
        assert expect in msg and "does not exist" not in msg, (argv, msg)
    assert not (tmp_path / "m").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [
    ["merge", "a", "b", "--out", ""],
    ["report", "profiles/x", "--out", ""],
    ["report", "profiles/x", "--out", "  "],
    ["export", "plan.json", "--format", "vllm", "--write-checkpoint", ""],
    ["export", "plan.json", "--format", "vllm", "--scales-out", ""],
    ["plan", "", "--avg-bits", "5"],
    ["validate", "p.json", "--out", ""],
    ["validate", "p.json", "--engine", "vllm", "--engine-python", ""],
    ["profile", "--text", ""],
    ["generate", "--plan", "", "--prompt", "x"],
])
def test_an_empty_path_is_refused_by_every_command(capsys, tmp_path, monkeypatch, argv):
    """An empty --out once wrote a merged profile over ./profile.csv, and an empty --write-checkpoint was ignored:
    every path the command line takes is refused when empty, before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profile.csv").write_text("keep\n")
    line = one_error_line(*run_cli(capsys, *argv))
    assert "an empty path names no file or folder; pass a name" in line
    assert (tmp_path / "profile.csv").read_text() == "keep\n" and sorted(os.listdir(tmp_path)) == ["profile.csv"]


@pytest.mark.parametrize("edit, message", [
    (lambda o: o["engine"].update(skip_layers=[999]), "engine skip_layers \\[999\\], not distinct layers of its"),
    (lambda o: o["engine"].update(skip_layers=[1, 1]), "not distinct layers"),
    (lambda o: o["predicted"].update(damage=float("nan")), "predicts kl nan, not a finite non-negative number"),
    (lambda o: o["predicted"].update(damage=-1.0), "not a finite non-negative number"),
    (lambda o: o["predicted"].update(joint_factor={"256": float("nan")}), "joint factor nan"),
    (lambda o: o["predicted"].update(joint_factor={"256": -2.0}), "joint factor -2.0"),
    (lambda o: o["predicted"].update(joint_factor={"256": 1e308}), "joint factor 1e\\+308"),
    (lambda o: o["predicted"].update(joint_factor={"x": 1.0}), "at 'x' tokens"),
    (lambda o: o["solver"].update(select="all of them"), "selection record that is not one"),
    (lambda o: o["solver"].update(select={"chosen": "plan"}), "selection record that is not one"),
])
def test_plan_fields_are_checked_on_load(capsys, tmp_path, edit, message):
    """A hand-edited plan's fields are held to their types and ranges before any command prints or exports them."""
    path = save(vllm_plan(skip=(1,)), tmp_path)
    obj = json.load(open(path))
    edit(obj)
    Path(path).write_text(json.dumps(obj))  # NaN as JSON's NaN, as a hand edit in Python would write it
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm"))
    assert re.search(message, line) and "re-run `sensprof plan`" in line, line


def test_a_folder_or_fifo_named_like_a_gguf_file_is_called_what_it_is(capsys, tmp_path):
    (tmp_path / "dir.gguf").mkdir()
    os.mkfifo(tmp_path / "pipe.gguf")
    for name, what in (("dir.gguf", "is a folder, not a GGUF file"), ("pipe.gguf", "is not a regular file"),
                       ("gone.gguf", "does not exist")):
        line = one_error_line(*run_cli(capsys, "profile", "--model", str(tmp_path / name), "--out", tmp_path / "p"))
        assert what in line, line


# --------------------------------------------------------------------------- files an artifact records


def _refuse_reading(monkeypatch):
    """Fail the test if a text file or the model is read: a recorded path must be refused before anything opens."""
    import sensprof.data
    import sensprof.models

    def opened(*a, **k):
        raise AssertionError(f"read before the refusal: {a[:1]}")

    for name in ("load_text", "text_source", "select_windows"):
        monkeypatch.setattr(sensprof.data, name, opened, raising=False)
    for name in ("load_for_plan", "load_for_profile"):
        monkeypatch.setattr(sensprof.models, name, opened)


@pytest.mark.parametrize("target", ["/etc/passwd", "/proc/self/environ", "fifo"])
def test_validate_refuses_a_recorded_text_outside_the_plans_folder_unread(capsys, tmp_path, monkeypatch, target):
    """A plan naming /etc/passwd or /proc/self/environ had it read and digested; a FIFO beside it, opened."""
    plan_dir = tmp_path / "plans"
    plan_dir.mkdir()
    if target == "fifo":
        target = str(plan_dir / "text.txt")
        os.mkfifo(target)
    plan = make_plan("sensprof", {}, [("fp8_e4m3", "fp8_e4m3")] * 3, [("full", None)] * 3)
    path = save(dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, text_files=(target,))), plan_dir)
    _refuse_reading(monkeypatch)
    line = one_error_line(*run_cli(capsys, "validate", path, "--device", "cpu", "--out", tmp_path / "v.csv"))
    assert repr(target) in line
    assert ("not a regular file" in line) if "plans" in target else ("lies outside" in line and "plans" in line)
    assert "run sensprof from a folder that holds it" in line or "FIFO" in line


@pytest.mark.parametrize("flag", ["--select-measured", "--refine"])
@pytest.mark.parametrize("where", ["outside", "fifo"])
def test_plan_refuses_a_profiles_recorded_text_unread(capsys, profile_copy, tmp_path, monkeypatch, flag, where):
    """meta.json's text_files naming a file outside the profile's folder was read; a FIFO in it hung the run."""
    if where == "fifo":
        text = os.path.join(profile_copy, "text.txt")
        os.mkfifo(text)
    else:
        text = str(tmp_path / "elsewhere.txt")
        Path(text).write_text("some text " * 500)
    meta = json.loads(Path(profile_copy, "meta.json").read_text())
    meta["text_files"] = [text]
    Path(profile_copy, "meta.json").write_text(json.dumps(meta))
    _refuse_reading(monkeypatch)
    rc, out, err = run_cli(capsys, "plan", profile_copy, "--avg-bits", "8", flag, "1", "--device", "cpu",
                           "--out", tmp_path / "p.json")
    line = one_error_line(rc, out, err)
    assert repr(text) in line
    assert ("not a regular file" if where == "fifo" else "lies outside") in line
    assert not (tmp_path / "p.json").exists()


def test_a_fifo_in_a_plans_profile_folder_is_refused_unopened(capsys, profile_copy, tmp_path):
    """meta.json (or a table) of the profile a plan names is opened only if it is a regular file: a FIFO hung."""
    os.replace(os.path.join(profile_copy, "meta.json"), tmp_path / "meta.json")
    os.mkfifo(os.path.join(profile_copy, "meta.json"))
    line = one_error_line(*run_cli(capsys, "summary", profile_copy))
    assert "meta.json" in line and "not a regular file" in line
    os.unlink(os.path.join(profile_copy, "meta.json"))
    os.replace(tmp_path / "meta.json", os.path.join(profile_copy, "meta.json"))
    os.unlink(os.path.join(profile_copy, "stats.csv"))
    os.mkfifo(os.path.join(profile_copy, "stats.csv"))
    line = one_error_line(*run_cli(capsys, "summary", profile_copy))
    assert "stats.csv" in line and "not a regular file" in line
