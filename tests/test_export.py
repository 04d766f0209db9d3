"""Exports: the printed serving command lines parse with each engine's own flag spellings, version gates and
format checks refuse what an engine cannot run, SGLang scale files and vLLM FP8 checkpoints are well formed."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import types

import pytest
import torch
from conftest import make_tiny_model, one_error_line, run_cli

from sensprof.cli import main
from sensprof.errors import SensprofError
from sensprof.export import FORMATS, check_format, command_line, memory_comments
from sensprof.export.checkpoint import KV_CACHE_SCHEME, RECIPE_FILE, SCALES_FILE
from sensprof.export.llamacpp import llamacpp_argv
from sensprof.export.sglang import sglang_argv, sglang_scales
from sensprof.export.vllm import VLLM_KV_DTYPES, parse_version, skip_tokens, vllm_argv
from sensprof.plan import FP8_E4M3_MAX, LayerPlan, Plan, load_plan, predicted_summary

GIB = 2**30
MODEL = "/models/my tiny model"  # a space: the command line must quote it
GEMMA_KINDS = [("sliding", 8), ("sliding", 8), ("full", None)]  # the tiny gemma3's layers
LLAMA_KINDS = [("full", None)] * 3


# --------------------------------------------------------------------------- helpers


def absmax(layer: int) -> dict:
    return {"K": [1.0 + layer, 2.0 + layer], "V": [0.5 * (layer + 1), 0.25], "K_pre": [3.0, 1.0]}


def make_plan(target: str, engine: dict, pairs, kinds=GEMMA_KINDS, model_id: str = MODEL) -> Plan:
    layers = [LayerPlan(i, kind, window, 2, 16, k, v, 0.0 if k == "none" else 1e-4, 0.0 if v == "none" else 2e-4,
                        absmax(i)) for i, ((kind, window), (k, v)) in enumerate(zip(kinds, pairs))]
    return Plan(model_id=model_id, model_fingerprint="0123456789abcdef", target=target, objective="kl",
                budget={"kind": "avg_bits", "value": 8.0, "max_model_len": None, "max_num_seqs": None},
                layers=layers, engine=engine,
                predicted={"damage": 1.5e-3, "objective": "kl", **predicted_summary(layers)},
                solver={"name": "PuLP CBC", "status": "Optimal", "time_s": 0.01},
                profile={"path": None, "settings": {"seq_len": 32, "windows": 2, "seed": 0}, "window_slots": [0, 1],
                         "text_files": None, "text": "builtin"})


def vllm_plan(scheme="fp8_e4m3", flag="fp8_e4m3", skip=(), kinds=GEMMA_KINDS, needs_scales=False) -> Plan:
    pairs = [("none", "none") if i in skip else (scheme, scheme) for i in range(len(kinds))]
    return make_plan("vllm", {"kv_cache_dtype": flag, "scheme": scheme, "skip_layers": list(skip),
                              "needs_scales": needs_scales}, pairs, kinds)


def vllm_parser() -> argparse.ArgumentParser:
    """The flags as vLLM spells them (vllm/engine/arg_utils.py)."""
    p = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False)
    p.add_argument("--kv-cache-dtype", choices=VLLM_KV_DTYPES, default="auto")
    p.add_argument("--kv-cache-dtype-skip-layers", nargs="+", default=None)
    return p


def parse_vllm(text: str, model: str = MODEL):
    argv = shlex.split(text.splitlines()[0])
    assert argv[:3] == ["vllm", "serve", model], argv
    return vllm_parser().parse_args(argv[3:])


def save(plan: Plan, tmp_path, name="plan.json") -> str:
    path = str(tmp_path / name)
    plan.save(path)
    return path


# --------------------------------------------------------------------------- vLLM command lines


def test_gemma_kinds_are_the_tiny_gemma3s():
    from sensprof.models import describe_layers

    assert [(i.kind, i.window) for i in describe_layers(make_tiny_model("gemma3"))] == GEMMA_KINDS


@pytest.mark.parametrize("skip,kinds,expect", [
    ((), GEMMA_KINDS, None),
    ((2,), GEMMA_KINDS, ["2"]),
    ((0,), GEMMA_KINDS, ["0"]),
    ((0, 2), GEMMA_KINDS, ["0", "2"]),
    ((0, 1), GEMMA_KINDS, ["sliding_window"]),
    ((1, 0), GEMMA_KINDS, ["sliding_window"]),
    ((0, 1, 2), GEMMA_KINDS, ["sliding_window", "2"]),
    ((0, 1), LLAMA_KINDS, ["0", "1"]),
])
def test_vllm_command_round_trips_through_vllms_flags(skip, kinds, expect):
    plan = vllm_plan(skip=skip, kinds=kinds)
    line = command_line(vllm_argv(plan, MODEL))
    args = parse_vllm(line)
    assert args.kv_cache_dtype == "fp8_e4m3"
    assert args.kv_cache_dtype_skip_layers == expect
    assert skip_tokens(plan) == (expect or [])
    if expect:  # what vLLM would skip is what the plan keeps at 16 bits
        sliding = {i for i, (k, _) in enumerate(kinds) if k == "sliding"}
        named = set().union(*[sliding if t == "sliding_window" else {int(t)} for t in expect])
        assert named == {p.layer for p in plan.layers if (p.k_scheme, p.v_scheme) == ("none", "none")}


@pytest.mark.parametrize("scheme,flag", [("fp8_e4m3_cal", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"),
                                         ("int8_per_token_head", "int8_per_token_head"),
                                         ("int4_per_token_head", "int4_per_token_head"),
                                         ("fp8_per_token_head", "fp8_per_token_head")])
def test_vllm_dtypes_are_vllm_choices(scheme, flag):
    from sensprof.targets import VLLM_DTYPES

    assert all(d.flag_value in VLLM_KV_DTYPES for d in VLLM_DTYPES)
    args = parse_vllm(command_line(vllm_argv(vllm_plan(scheme, flag, skip=(2,)), MODEL)))
    assert args.kv_cache_dtype == flag and args.kv_cache_dtype_skip_layers == ["2"]


def test_all_layers_skipped_is_plain_auto():
    plan = vllm_plan(skip=(0, 1, 2))
    plan.engine["kv_cache_dtype"] = "auto"  # what the planner writes when every layer is skipped
    args = parse_vllm(command_line(vllm_argv(plan, MODEL, "0.10")))  # no skip flag, so any version
    assert args.kv_cache_dtype == "auto" and args.kv_cache_dtype_skip_layers is None


def test_model_path_is_quoted():
    line = command_line(vllm_argv(vllm_plan(), "/path with spaces/it's here"))
    assert shlex.split(line)[2] == "/path with spaces/it's here"


@pytest.mark.parametrize("version", ["0.18", "0.18.9", "0.9.2", "v0.17.0"])
def test_skip_layers_need_vllm_019(version):
    with pytest.raises(SensprofError, match=r"no --kv-cache-dtype-skip-layers \(added in 0.19\)") as e:
        vllm_argv(vllm_plan(skip=(2,)), MODEL, version)
    assert "--vllm-version 0.19" in str(e.value) and "--num-skip 0" in str(e.value)
    # without skipped layers the same version is fine
    assert parse_vllm(command_line(vllm_argv(vllm_plan(), MODEL, version))).kv_cache_dtype == "fp8_e4m3"


@pytest.mark.parametrize("version", ["0.19", "0.19.0", "v0.19.1", "0.33.0", "1.2"])
def test_skip_layers_from_vllm_019(version):
    args = parse_vllm(command_line(vllm_argv(vllm_plan(skip=(0, 1)), MODEL, version)))
    assert args.kv_cache_dtype_skip_layers == ["sliding_window"]


def test_per_token_head_dtypes_need_vllm_030():
    plan = vllm_plan("int4_per_token_head", "int4_per_token_head")
    with pytest.raises(SensprofError, match="needs vLLM >= 0.30"):
        vllm_argv(plan, MODEL, "0.29.9")
    assert vllm_argv(plan, MODEL, "0.30")[4] == "int4_per_token_head"


@pytest.mark.parametrize("version", ["abc", "1", "", "0.x", "latest"])
def test_unknown_vllm_version_is_refused(version):
    with pytest.raises(SensprofError, match="unknown vLLM version"):
        parse_version(version)
    with pytest.raises(SensprofError, match="unknown vLLM version"):
        vllm_argv(vllm_plan(), MODEL, version)


def test_plan_dtype_vllm_does_not_know_is_refused():
    with pytest.raises(SensprofError, match="not one vLLM accepts"):
        vllm_argv(vllm_plan("int2_c32", "int2_c32"), MODEL)


@pytest.mark.parametrize("version", ["0.19", "0.25", "0.29", "0.30", "0.33.0"])
@pytest.mark.parametrize("needs_scales", [False, True])
def test_calculate_kv_scales_never_appears(tmp_path, capsys, version, needs_scales):
    plan = vllm_plan("fp8_e4m3_cal" if needs_scales else "fp8_e4m3", skip=(2,), needs_scales=needs_scales)
    assert "--calculate-kv-scales" not in vllm_argv(plan, MODEL, version)
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "vllm", "--vllm-version", version)
    assert rc == 0, err
    assert "calculate-kv-scales" not in out
    assert ("--write-checkpoint" in out) == needs_scales  # the hint to get calibrated scales into vLLM


def test_cli_vllm_export_and_version_gate(tmp_path, capsys):
    path = save(vllm_plan(skip=(0, 1)), tmp_path)
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm", "--vllm-version", "0.18"))
    assert "0.19" in line and "--kv-cache-dtype-skip-layers" in line
    rc, out, err = run_cli(capsys, "export", path, "--format", "vllm", "--vllm-version", "0.19")
    assert rc == 0, err
    args = parse_vllm(out)
    assert args.kv_cache_dtype == "fp8_e4m3" and args.kv_cache_dtype_skip_layers == ["sliding_window"]
    assert all(ln.startswith("# ") for ln in out.strip().splitlines()[1:])
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm", "--vllm-version", "nope"))
    assert "unknown vLLM version 'nope'" in line


# --------------------------------------------------------------------------- formats


def test_unknown_format_is_refused(tmp_path, capsys):
    plan = vllm_plan()
    with pytest.raises(SensprofError, match="unknown --format 'trtllm'; choose one of vllm, sglang, llamacpp"):
        check_format(plan, "trtllm")
    line = one_error_line(*run_cli(capsys, "export", save(plan, tmp_path), "--format", "trtllm"))
    assert "unknown --format" in line
    assert FORMATS == ("vllm", "sglang", "llamacpp")


@pytest.mark.parametrize("target,fmt", [("sensprof", "vllm"), ("sensprof", "sglang"), ("sensprof", "llamacpp"),
                                        ("vllm", "sglang"), ("llamacpp", "vllm"), ("sglang", "vllm")])
def test_plan_for_another_target_is_refused(tmp_path, capsys, target, fmt):
    plan = make_plan(target, {}, [("int4_c32", "int2_t32")] * 3)
    with pytest.raises(SensprofError, match=f"targets '{target}', which {fmt} cannot express.*--target {fmt}"):
        check_format(plan, fmt)
    one_error_line(*run_cli(capsys, "export", save(plan, tmp_path), "--format", fmt))


def test_bad_gpu_mem_is_refused(tmp_path, capsys):
    line = one_error_line(*run_cli(capsys, "export", save(vllm_plan(), tmp_path), "--format", "vllm",
                                   "--gpu-mem-gib", "0"))
    assert "--gpu-mem-gib must be positive" in line


def test_missing_plan_is_refused(tmp_path, capsys):
    line = one_error_line(*run_cli(capsys, "export", tmp_path / "none.json", "--format", "vllm"))
    assert "does not exist" in line


def test_memory_comments():
    plan = vllm_plan(skip=(2,))
    s = predicted_summary(plan.layers)
    lines = memory_comments(plan, 1.0)
    assert len(lines) == 3 and all(ln.startswith("# ") for ln in lines)
    fit, fit16 = int(GIB // s["bytes_per_token"]), int(GIB // s["bf16_bytes_per_token"])
    assert f"{fit:,} tokens vs {fit16:,} at bf16 (+{fit - fit16:,})" in lines[1]
    assert f"{s['avg_bits']:.2f} bits/element" in lines[0]
    assert "1.500e-03" in lines[2]


# --------------------------------------------------------------------------- SGLang


def sglang_plan(scheme="fp8_e4m3_cal", flag="fp8_e4m3"):
    return make_plan("sglang", {"kv_cache_dtype": flag, "scheme": scheme, "needs_scales": scheme.endswith("_cal")},
                     [(scheme, scheme)] * 3)


def test_sglang_scales_file(tmp_path, capsys):
    plan = sglang_plan()
    scales = tmp_path / "out" / "kv_scales.json"
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "sglang", "--scales-out", scales)
    assert rc == 0, err
    argv = shlex.split(out.splitlines()[0])
    assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", MODEL]
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"])
    p.add_argument("--quantization-param-path")
    args = p.parse_args(argv[5:])
    assert args.kv_cache_dtype == "fp8_e4m3" and args.quantization_param_path == str(scales)
    data = json.loads(scales.read_text())
    assert set(data) == {"kv_cache"}
    assert data["kv_cache"]["dtype"] == "float8_e4m3fn"
    factors = data["kv_cache"]["scaling_factor"]
    assert set(factors) == {"0"}
    assert set(factors["0"]) == {"0", "1", "2"}
    for layer, scale in factors["0"].items():
        assert isinstance(scale, float) and scale > 0
        a = absmax(int(layer))
        assert scale == pytest.approx(max(max(a["K"]), max(a["V"])) / 448.0)


def test_sglang_e5m2_scales_and_auto():
    data = sglang_scales(sglang_plan("fp8_e5m2_cal", "fp8_e5m2"))
    assert data["kv_cache"]["dtype"] == "float8_e5m2"
    assert data["kv_cache"]["scaling_factor"]["0"]["2"] == pytest.approx(4.0 / 57344.0)  # layer 2: K absmax 4.0 > V
    auto = make_plan("sglang", {"kv_cache_dtype": "auto", "scheme": "none", "needs_scales": False},
                     [("none", "none")] * 3)
    argv = sglang_argv(auto, MODEL, "scales.json")
    assert argv[-2:] == ["--kv-cache-dtype", "auto"] and "--quantization-param-path" not in argv


def test_sglang_scales_never_zero():
    plan = sglang_plan()
    for p in plan.layers:
        p.absmax = {}
    assert all(s > 0 for s in sglang_scales(plan)["kv_cache"]["scaling_factor"]["0"].values())


# --------------------------------------------------------------------------- llama.cpp


@pytest.mark.parametrize("k,v,fa", [("q8_0", "q4_0", True), ("q4_0", "f16", False), ("f16", "q5_1", True)])
def test_llamacpp_command(tmp_path, capsys, k, v, fa):
    from sensprof.targets import LLAMACPP_TYPES

    scheme = {d.flag_value: d.scheme for d in LLAMACPP_TYPES}
    plan = make_plan("llamacpp", {"cache_type_k": k, "cache_type_v": v}, [(scheme[k], scheme[v])] * 3)
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "llamacpp")
    assert rc == 0, err
    first = out.splitlines()[0]
    assert f"-ctk {k} -ctv {v}" in first
    argv = shlex.split(first)
    assert argv[:3] == ["llama-server", "-m", MODEL]
    assert ("-fa" in argv) == fa
    if fa:
        assert argv[argv.index("-fa") + 1] == "on"
    assert llamacpp_argv(plan, "m.gguf")[1:3] == ["-m", "m.gguf"]


# --------------------------------------------------------------------------- vLLM checkpoint with FP8 scales


@pytest.fixture(scope="module")
def fp8_plan(tiny_model_dir, tmp_path_factory, _one_thread):
    """A vllm plan of the tiny Llama from a profile holding only fp8_e4m3_cal: at 12 bits/element (three
    layers, fp8 = 8 bits) exactly one layer is kept at 16 bits."""
    root = tmp_path_factory.mktemp("export")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--schemes",
                 "fp8_e4m3_cal", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    path = root / "plan.json"
    assert main(["plan", str(prof), "--target", "vllm", "--avg-bits", "12", "--out", str(path)]) == 0
    return types.SimpleNamespace(root=root, path=str(path), plan=load_plan(str(path)))


def test_fp8_plan_is_what_the_checkpoint_needs(fp8_plan):
    plan = fp8_plan.plan
    assert plan.engine["kv_cache_dtype"] == "fp8_e4m3" and plan.engine["needs_scales"] is True
    assert len(plan.engine["skip_layers"]) == 1


def test_write_checkpoint(fp8_plan, tiny_model_dir, capsys):
    plan = fp8_plan.plan
    ckpt = fp8_plan.root / "ckpt"
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    assert rc == 0, err
    args = parse_vllm(out, model=str(ckpt))
    assert args.kv_cache_dtype == "fp8_e4m3"
    skipped = plan.engine["skip_layers"]
    assert args.kv_cache_dtype_skip_layers == [str(i) for i in skipped]
    assert f"# wrote {ckpt}" in out
    assert "add --write-checkpoint" not in out
    assert "calculate-kv-scales" not in out

    files = set(os.listdir(ckpt))
    assert {"config.json", SCALES_FILE, RECIPE_FILE, "tokenizer.json"} <= files
    assert any(f.endswith(".safetensors") and f != SCALES_FILE for f in files)
    assert not [f for f in os.listdir(fp8_plan.root) if f.startswith(".tmp-checkpoint-")]

    cfg = json.loads((ckpt / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["kv_cache_scheme"] == KV_CACHE_SCHEME == {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                        "dynamic": False, "symmetric": True}

    from safetensors.torch import load_file

    scales = load_file(str(ckpt / SCALES_FILE))
    kept = [p.layer for p in plan.layers if p.layer not in skipped]
    assert set(scales) == {f"model.layers.{i}.self_attn.{t}_scale" for i in kept for t in "kv"}
    for i in kept:
        for t in "kv":
            s = scales[f"model.layers.{i}.self_attn.{t}_scale"]
            assert s.dtype == torch.float32 and s.dim() == 0 and float(s) > 0
            assert float(s) == pytest.approx(max(plan.layers[i].absmax[t.upper()]) / FP8_E4M3_MAX, rel=1e-6)
            assert float(s) == pytest.approx(plan.fp8_scale(i, t.upper()), rel=1e-6)

    recipe = (ckpt / RECIPE_FILE).read_text()
    assert "kv_cache_scheme:" in recipe and "type: float" in recipe and "num_bits: 8" in recipe
    assert f"keeps layers {skipped}" in recipe and "--kv-cache-dtype-skip-layers" in recipe

    # the weights are the model's, unchanged
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    try:
        reloaded = AutoModelForCausalLM.from_pretrained(str(ckpt))
    except (ImportError, ValueError) as e:  # transformers wants the compressed-tensors package for that config
        assert "compressed" in str(e).lower(), e
        plain = fp8_plan.root / "ckpt-plain"
        shutil.copytree(ckpt, plain)
        del cfg["quantization_config"]
        (plain / "config.json").write_text(json.dumps(cfg))
        reloaded = AutoModelForCausalLM.from_pretrained(str(plain))
    sd, ref = reloaded.state_dict(), original.state_dict()
    assert set(ref) <= set(sd)
    for name, tensor in ref.items():
        assert torch.equal(sd[name], tensor), name
    ids = torch.arange(3, 35)[None]
    with torch.inference_mode():
        assert torch.allclose(reloaded(input_ids=ids).logits, original(input_ids=ids).logits)

    # the directory is not overwritten
    line = one_error_line(*run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt))
    assert "exists and is not empty" in line


def test_write_checkpoint_refuses_a_non_fp8_plan(fp8_plan, capsys):
    plan = load_plan(fp8_plan.path)
    plan.engine = {**plan.engine, "kv_cache_dtype": "int8_per_token_head", "scheme": "int8_per_token_head",
                   "needs_scales": False}
    for p in plan.layers:
        if p.k_scheme != "none":
            p.k_scheme = p.v_scheme = "int8_per_token_head"
    path = str(fp8_plan.root / "int8.json")
    plan.save(path)
    target = fp8_plan.root / "ckpt-int8"
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm", "--write-checkpoint", target))
    assert "writes FP8 e4m3 scales" in line and "'int8_per_token_head'" in line
    assert not target.exists()
    assert not [f for f in os.listdir(fp8_plan.root) if f.startswith(".tmp-checkpoint-")]


def test_write_checkpoint_is_vllm_only(tmp_path, capsys):
    line = one_error_line(*run_cli(capsys, "export", save(sglang_plan(), tmp_path), "--format", "sglang",
                                   "--write-checkpoint", tmp_path / "ckpt"))
    assert "--write-checkpoint is for --format vllm" in line


def test_export_refuses_another_model(fp8_plan, tmp_path, tiny_tokenizer, capsys):
    other = tmp_path / "other"
    make_tiny_model("llama", seed=1).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    line = one_error_line(*run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--model", other))
    assert "fingerprint" in line
    line = one_error_line(*run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--model", other,
                                   "--write-checkpoint", tmp_path / "ckpt"))
    assert "fingerprint" in line and not (tmp_path / "ckpt").exists()


def test_export_with_the_profiled_model(fp8_plan, tiny_model_dir, capsys):
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--model", tiny_model_dir)
    assert rc == 0, err
    assert parse_vllm(out, model=tiny_model_dir).kv_cache_dtype == "fp8_e4m3"
    assert "add --write-checkpoint DIR" in out  # calibrated scales: the hint is printed
