"""Exports: the printed serving command lines parse with each engine's own flag spellings, version gates and
format checks refuse what an engine cannot run, SGLang scale files and vLLM checkpoints are well formed."""

from __future__ import annotations

import argparse
import dataclasses
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
from sensprof.artifacts import LayerPlan, Plan, load_plan
from sensprof.constants import FP8_E4M3_MAX
from sensprof.planning.plan import predicted_summary

GIB = 2**30
MODEL = "/models/my tiny model"  # a space: the command line must quote it
GEMMA_KINDS = [("sliding", 8), ("sliding", 8), ("full", None)]  # the tiny gemma3's layers
LLAMA_KINDS = [("full", None)] * 3


# --------------------------------------------------------------------------- helpers


def absmax(layer: int) -> dict:
    return {"K": [1.0 + layer, 2.0 + layer], "V": [0.5 * (layer + 1), 0.25], "K_pre": [3.0, 1.0]}


def make_plan(target: str, engine: dict, pairs, kinds=GEMMA_KINDS, model_id: str = MODEL,
              fingerprint: str = "0123456789abcdef", head_dim: int = 16) -> Plan:
    layers = [LayerPlan(i, kind, window, 2, head_dim, k, v, 0.0 if k == "none" else 1e-4, 0.0 if v == "none" else 2e-4,
                        absmax(i)) for i, ((kind, window), (k, v)) in enumerate(zip(kinds, pairs))]
    return Plan(model_id=model_id, model_fingerprint=fingerprint, target=target, objective="kl",
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
    from sensprof.targets import VLLM_GPUS, get_target

    for gpu in VLLM_GPUS:
        assert {d.flag_value for d in get_target("vllm", gpu).dtypes} <= set(VLLM_KV_DTYPES), gpu
    args = parse_vllm(command_line(vllm_argv(vllm_plan(scheme, flag, skip=(2,)), MODEL)))
    assert args.kv_cache_dtype == flag and args.kv_cache_dtype_skip_layers == ["2"]


def test_all_layers_skipped_is_plain_auto():
    plan = vllm_plan(skip=(0, 1, 2))
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype="auto"))  # the planner's when every layer is skipped
    args = parse_vllm(command_line(vllm_argv(plan, MODEL, "0.10")))  # no skip flag, so any version
    assert args.kv_cache_dtype == "auto" and args.kv_cache_dtype_skip_layers is None


def test_model_path_is_quoted():
    line = command_line(vllm_argv(vllm_plan(), "/path with spaces/it's here"))
    assert shlex.split(line)[2] == "/path with spaces/it's here"


@pytest.mark.parametrize("version", ["0.18.1", "0.18", "0.9.2", "v0.17.0"])
def test_skip_layers_are_gated_at_vllm_019(version):
    """--kv-cache-dtype-skip-layers (vLLM PR #33695) first shipped in vLLM 0.19.0: the released wheels' cache.py and
    arg_utils.py have it from 0.19.0, not in 0.18.1 (engines/vllm/facts.py SKIP_FLAG_SINCE)."""
    with pytest.raises(SensprofError, match=r"--kv-cache-dtype-skip-layers needs vLLM >= 0.19") as e:
        vllm_argv(vllm_plan(skip=(2,)), MODEL, version)
    assert "--vllm-version 0.19" in str(e.value) and "--num-skip 0" in str(e.value)
    # without skipped layers the same version is fine for a long-standing dtype
    assert parse_vllm(command_line(vllm_argv(vllm_plan(), MODEL, version))).kv_cache_dtype == "fp8_e4m3"


@pytest.mark.parametrize("version", ["0.19", "0.32", "0.33.0", "v0.33.1", "1.2"])
def test_skip_layers_from_vllm_019(version):
    args = parse_vllm(command_line(vllm_argv(vllm_plan(skip=(0, 1)), MODEL, version)))
    assert args.kv_cache_dtype_skip_layers == ["sliding_window"]


@pytest.mark.parametrize("dtype, since", [("int4_per_token_head", "0.25"), ("int8_per_token_head", "0.20"),
                                          ("turboquant_k3v4_nc", "0.20"), ("nvfp4", "0.20"), ("nvfp4_4over6", "0.28"),
                                          ("ultraquant_4bit", "0.32"), ("octave_k3v4", "0.33")])
def test_each_dtype_is_gated_at_the_release_it_came_with(dtype, since):
    plan = vllm_plan("int4_per_token_head", "int4_per_token_head")
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype=dtype))
    older = f"0.{int(since.split('.')[1]) - 1}"
    with pytest.raises(SensprofError, match=f"--kv-cache-dtype {dtype} needs vLLM >= {since}"):
        vllm_argv(plan, MODEL, older)
    assert vllm_argv(plan, MODEL, since)[4] == dtype


def test_dtype_that_does_not_run_on_the_named_gpu_is_refused():
    plan = vllm_plan("int4_per_token_head", "int4_per_token_head")
    for dtype, gpu in (("nvfp4_4over6", "hopper"), ("ultraquant_4bit", "hopper"), ("octave_k3v4", "ampere"),
                       ("fp8_per_token_head", "ampere"), ("nvfp4", "rocm")):
        plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype=dtype))
        with pytest.raises(SensprofError, match=f"{dtype} does not run on .* in vLLM 0.33 .*--vllm-gpu {gpu}"):
            vllm_argv(plan, MODEL, gpu=gpu)
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype="turboquant_k8v4"))
    assert vllm_argv(plan, MODEL, gpu="ampere")[4] == "turboquant_k8v4"
    with pytest.raises(SensprofError, match="unknown --vllm-gpu 'tpu'"):
        vllm_argv(plan, MODEL, gpu="tpu")


@pytest.mark.parametrize("version", ["abc", "1", "", "0.x", "latest"])
def test_unknown_vllm_version_is_refused(version):
    with pytest.raises(SensprofError, match="unknown vLLM version"):
        parse_version(version)
    with pytest.raises(SensprofError, match="unknown vLLM version"):
        vllm_argv(vllm_plan(), MODEL, version)


def test_plan_dtype_vllm_does_not_know_is_refused():
    with pytest.raises(SensprofError, match="not one vLLM accepts"):
        vllm_argv(vllm_plan("int2_c32", "int2_c32"), MODEL)


@pytest.mark.parametrize("version", ["0.33", "0.33.0", "0.34"])
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
    rc, out, err = run_cli(capsys, "export", path, "--format", "vllm", "--vllm-version", "0.33")
    assert rc == 0, err
    args = parse_vllm(out)
    assert args.kv_cache_dtype == "fp8_e4m3" and args.kv_cache_dtype_skip_layers == ["sliding_window"]
    assert all(ln.startswith("# ") for ln in out.strip().splitlines()[1:])
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm", "--vllm-version", "nope"))
    assert "unknown vLLM version 'nope'" in line
    line = one_error_line(*run_cli(capsys, "export", path, "--format", "vllm", "--vllm-gpu", "tpu"))
    assert "unknown --vllm-gpu 'tpu'" in line


def test_cli_vllm_export_lists_vllms_boundary_layers_and_its_pool(tmp_path, capsys):
    plan = vllm_plan("int4_per_token_head", "int4_per_token_head", skip=(0, 2))
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype="turboquant_k3v4_nc", forced_skip_layers=[0, 2], vllm_gpu="hopper"))
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "vllm", "--gpu-mem-gib", "1")
    assert rc == 0, err
    args = parse_vllm(out)
    assert args.kv_cache_dtype == "turboquant_k3v4_nc" and "0" in args.kv_cache_dtype_skip_layers
    assert "# vLLM itself keeps layers 0 2 at the model dtype for turboquant_k3v4_nc" in out
    assert "planned and measured for Hopper" in out
    from sensprof.engines.vllm import facts

    layers = [("auto" if p.layer in (0, 2) else "turboquant_k3v4_nc", p.kv_heads, p.head_dim,
               p.window if p.kind == "sliding" else None) for p in plan.layers]
    fit = facts.tokens_that_fit(2**30, layers)
    assert f"{fit:,} tokens fit in 1 GiB" in out
    assert out.count("tokens fit") + out.count("tokens vs") == 1  # vLLM's pool arithmetic replaces the plain one
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype="fp8_per_token_head", forced_skip_layers=[]))
    line = one_error_line(*run_cli(capsys, "export", save(plan, tmp_path), "--format", "vllm", "--vllm-gpu", "ampere"))
    assert "fp8_per_token_head does not run on Ampere" in line and "--vllm-gpu ampere" in line


# --------------------------------------------------------------------------- formats


def test_unknown_format_is_refused(tmp_path, capsys):
    plan = vllm_plan()
    with pytest.raises(SensprofError, match="unknown --format 'trtllm'; choose one of vllm, sglang, llamacpp"):
        check_format(plan, "trtllm")
    line = one_error_line(*run_cli(capsys, "export", save(plan, tmp_path), "--format", "trtllm"))
    assert "unknown --format" in line
    assert tuple(FORMATS) == ("vllm", "sglang", "llamacpp")


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
    assert len(lines) == 4 and all(ln.startswith("# ") for ln in lines)
    fit, fit16 = int(GIB // s["bytes_per_token"]), int(GIB // s["bf16_bytes_per_token"])
    assert f"{fit:,} tokens vs {fit16:,} at bf16 (+{fit - fit16:,})" in lines[1]
    assert f"{s['avg_bits']:.2f} bits/element" in lines[0]
    # what the engine is predicted to measure at the serving length, with its measured band (planning/prediction.py)
    assert lines[2].startswith("# predicted KL ") and "(per-layer sum 1.500e-03" in lines[2] and "measured" in lines[2]
    assert "1.500e-03" in lines[3]


# --------------------------------------------------------------------------- SGLang


def sglang_plan(scheme="fp8_e4m3_cal", flag="fp8_e4m3", model_id=MODEL, kinds=LLAMA_KINDS):
    return make_plan("sglang", {"kv_cache_dtype": flag, "k_scheme": scheme, "v_scheme": scheme,
                                "needs_scales": scheme.endswith("_cal")}, [(scheme, scheme)] * len(kinds), kinds,
                     model_id=model_id)


def sglang_parser() -> argparse.ArgumentParser:
    """The flags as SGLang spells them (python/sglang/srt/server_args.py: kv_cache_dtype, tp_size)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--model-path")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"])
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--quantization-param-path")
    return p


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sglang_scales_file(tmp_path, capsys, tiny_model_dir, tp):
    plan = sglang_plan(model_id=tiny_model_dir)
    scales = tmp_path / "out" / "kv_scales.json"
    argv = ["export", save(plan, tmp_path), "--format", "sglang", "--scales-out", scales]
    rc, out, err = run_cli(capsys, *argv, *(["--tp", str(tp)] if tp > 1 else []))
    assert rc == 0, err
    cmd = shlex.split(out.splitlines()[0])
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    args = sglang_parser().parse_args(cmd[3:])
    assert args.model_path == tiny_model_dir and args.kv_cache_dtype == "fp8_e4m3"
    assert args.quantization_param_path == str(scales) and args.tp_size == tp
    assert ("--tp-size" in cmd) == (tp > 1)
    data = json.loads(scales.read_text())
    assert set(data) == {"model_type", "kv_cache"} and data["model_type"] == "llama"
    assert data["kv_cache"]["dtype"] == "float8_e4m3fn"
    factors = data["kv_cache"]["scaling_factor"]
    assert set(factors) == {str(r) for r in range(tp)}
    for rank in factors.values():  # one per-tensor scale per layer, the same on every rank
        assert rank == factors["0"] and set(rank) == {"0", "1", "2"}
    for layer, scale in factors["0"].items():
        assert isinstance(scale, float) and scale > 0
        a = absmax(int(layer))
        assert scale == pytest.approx(max(max(a["K"]), max(a["V"])) / 448.0)


@pytest.mark.parametrize("flag,scheme", [("fp8_e5m2", "fp8_e5m2"), ("auto", "none")])
def test_sglang_scales_only_for_e4m3(tmp_path, capsys, flag, scheme):
    plan = sglang_plan(scheme, flag)
    with pytest.raises(SensprofError, match="only kind SGLang loads"):
        sglang_scales(plan, "llama", 3)
    scales = tmp_path / "s.json"
    line = one_error_line(*run_cli(capsys, "export", save(plan, tmp_path), "--format", "sglang", "--scales-out", scales))
    assert f"--kv-cache-dtype {flag}" in line and "drop --scales-out" in line and "fp8_e4m3_cal" in line
    assert not scales.exists()
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "sglang")
    assert rc == 0, err
    args = sglang_parser().parse_args(shlex.split(out.splitlines()[0])[3:])
    assert args.kv_cache_dtype == flag and args.quantization_param_path is None


def test_sglang_hint_for_calibrated_plan(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "export", save(sglang_plan(), tmp_path), "--format", "sglang")
    assert rc == 0, err
    assert "add --scales-out FILE" in out


@pytest.mark.parametrize("tp", ["0", "-2"])
def test_sglang_bad_tp_is_refused(tmp_path, capsys, tp):
    line = one_error_line(*run_cli(capsys, "export", save(sglang_plan(), tmp_path), "--format", "sglang", "--tp", tp))
    assert "--tp must be at least 1" in line
    with pytest.raises(SensprofError, match="--tp must be"):
        sglang_argv(sglang_plan(), MODEL, None, int(tp))


def test_tp_is_sglang_only(tmp_path, capsys):
    line = one_error_line(*run_cli(capsys, "export", save(vllm_plan(), tmp_path), "--format", "vllm", "--tp", "2"))
    assert "--tp is for --format sglang" in line


def test_sglang_scales_need_every_layer():
    plan = sglang_plan()
    with pytest.raises(SensprofError, match="each of the model's 4 layers but the plan covers 3"):
        sglang_scales(plan, "llama", 4)


def test_sglang_scales_never_zero():
    plan = sglang_plan()
    plan = plan.replace(layers=tuple(dataclasses.replace(p, absmax={}) for p in plan.layers))
    assert all(s > 0 for s in sglang_scales(plan, "llama", 3)["kv_cache"]["scaling_factor"]["0"].values())


# --------------------------------------------------------------------------- llama.cpp


def llamacpp_plan(k, v):
    from sensprof.targets import LLAMACPP_TYPES

    k_scheme = {d.flag_value: d.k_scheme for d in LLAMACPP_TYPES}
    v_scheme = {d.flag_value: d.v_scheme for d in LLAMACPP_TYPES}
    return make_plan("llamacpp", {"cache_type_k": k, "cache_type_v": v}, [(k_scheme[k], v_scheme[v])] * 3)


@pytest.mark.parametrize("k,v,fa,note", [
    ("q8_0", "q4_0", True, None),  # the one mixed pair a default CUDA build has FA kernels for
    ("q8_0", "q8_0", True, None),
    ("q4_0", "q4_0", True, None),
    ("f16", "f16", False, None),
    ("q4_0", "f16", False, "without flash attention"),  # a quantized K alone does not need FA
    ("q5_1", "f16", False, "without flash attention"),
    ("f16", "q5_1", True, "GGML_CUDA_FA_ALL_QUANTS=ON"),
    ("q4_0", "q8_0", True, "GGML_CUDA_FA_ALL_QUANTS=ON"),
    ("q5_0", "q5_0", True, "GGML_CUDA_FA_ALL_QUANTS=ON"),
    ("q4_1", "q4_1", True, "GGML_CUDA_FA_ALL_QUANTS=ON"),
])
def test_llamacpp_command(tmp_path, capsys, k, v, fa, note):
    plan = llamacpp_plan(k, v)
    rc, out, err = run_cli(capsys, "export", save(plan, tmp_path), "--format", "llamacpp")
    assert rc == 0, err
    first = out.splitlines()[0]
    assert f"-ctk {k} -ctv {v}" in first
    argv = shlex.split(first)
    assert argv[:3] == ["llama-server", "-m", MODEL]
    assert ("-fa" in argv) == fa
    if fa:
        assert argv[argv.index("-fa") + 1] == "on"
    comments = [ln for ln in out.splitlines()[1:] if "flash attention" in ln or "GGML_CUDA" in ln]
    if note is None:
        assert not comments
    else:
        assert len(comments) == 1 and note in comments[0] and comments[0].startswith("# ")
    floor = [ln for ln in out.splitlines() if "floor of its own" in ln]
    assert len(floor) == (0 if (k, v) == ("f16", "f16") else 1)  # measured by validate --engine llamacpp
    assert not floor or "--engine llamacpp" in floor[0]
    assert llamacpp_argv(plan, "m.gguf")[1:3] == ["-m", "m.gguf"]


def test_llamacpp_builds():
    from sensprof.export.llamacpp import CUDA_DEFAULT_PAIRS, allowed_pairs

    assert allowed_pairs("any") is None
    cuda = allowed_pairs("cuda-default")
    assert CUDA_DEFAULT_PAIRS <= cuda
    assert ("q8_0", "q4_0") in cuda and ("q4_0", "q8_0") not in cuda and ("q5_0", "q5_0") not in cuda
    assert ("q8_0", "f16") in cuda  # runs without FA, which -fa auto falls back to
    assert ("f16", "q8_0") not in cuda  # a quantized V needs FA, which a default CUDA build lacks for the pair
    with pytest.raises(SensprofError, match="unknown llama.cpp build"):
        allowed_pairs("rocm")


# --------------------------------------------------------------------------- vLLM checkpoint with FP8 scales


@pytest.fixture(scope="module")
def fp8_plan(tiny_model_dir, tmp_path_factory, _one_thread):
    """A vllm fp8_e4m3 plan with calibrated scales for the tiny Llama, layer 1 kept at 16 bits. Built directly
    (with the model's real fingerprint) so these tests check the exporter, not the planner."""
    from sensprof.models import fingerprint, load_model

    root = tmp_path_factory.mktemp("export")
    fp = fingerprint(load_model(tiny_model_dir, "cpu").model)
    pairs = [("fp8_e4m3_cal", "fp8_e4m3_cal"), ("none", "none"), ("fp8_e4m3_cal", "fp8_e4m3_cal")]
    plan = make_plan("vllm", {"kv_cache_dtype": "fp8_e4m3", "k_scheme": "fp8_e4m3_cal", "v_scheme": "fp8_e4m3_cal",
                              "skip_layers": [1], "needs_scales": True}, pairs, LLAMA_KINDS,
                     model_id=tiny_model_dir, fingerprint=fp, head_dim=32)  # the tiny Llama's layers
    path = root / "plan.json"
    plan.save(str(path))
    return types.SimpleNamespace(root=root, path=str(path), plan=load_plan(str(path)))


def reload(ckpt, cfg, root):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(ckpt))
    except (ImportError, ValueError) as e:  # transformers wants the compressed-tensors package for that config
        assert "compressed" in str(e).lower(), e
        plain = root / (ckpt.name + "-plain")
        shutil.copytree(ckpt, plain)
        del cfg["quantization_config"]
        (plain / "config.json").write_text(json.dumps(cfg))
        return AutoModelForCausalLM.from_pretrained(str(plain))


def test_write_checkpoint(fp8_plan, tiny_model_dir, capsys):
    plan = fp8_plan.plan
    ckpt = fp8_plan.root / "ckpt"
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    assert rc == 0, err
    args = parse_vllm(out, model=str(ckpt))
    assert args.kv_cache_dtype == "fp8_e4m3"
    skipped = sorted(plan.engine.skip_layers)
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
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"

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
    assert "observer: static_minmax" in recipe
    assert f"keeps layers {skipped}" in recipe and "--kv-cache-dtype-skip-layers" in recipe

    # the weights are the model's, in bf16
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reloaded = reload(ckpt, cfg, fp8_plan.root)
    sd, ref = reloaded.state_dict(), original.state_dict()
    assert set(ref) <= set(sd)
    for name, tensor in ref.items():
        assert sd[name].dtype == torch.bfloat16 and torch.equal(sd[name], tensor.to(torch.bfloat16)), name
    ids = torch.arange(3, 35)[None]
    with torch.inference_mode():
        got, want = reloaded(input_ids=ids).logits.float(), original(input_ids=ids).logits
    assert (got - want).abs().max() <= 0.05 * want.abs().max()

    # the directory is not overwritten
    capsys.readouterr()
    line = one_error_line(*run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt))
    assert "exists and is not an empty directory" in line


@pytest.mark.parametrize("dtype, scheme", [("int8_per_token_head", "int8_per_token_head"), ("fp8_e5m2", "fp8_e5m2"),
                                           ("fp8", "fp8_e4m3")])
def test_write_checkpoint_without_scales(fp8_plan, capsys, dtype, scheme):
    """Dynamic-scale dtypes, and fp8 priced at scale 1.0: a plain bf16 model directory, no scales, no kv_cache_scheme
    (which would make vLLM quantize with scales the plan was not priced with, even under --kv-cache-dtype auto);
    the dtype goes on the command line."""
    plan = load_plan(fp8_plan.path)
    plan = plan.replace(engine=dataclasses.replace(plan.engine, kv_cache_dtype=dtype, k_scheme=scheme, v_scheme=scheme,
                                                   needs_scales=False),
                        layers=tuple(p if p.k_scheme == "none" else dataclasses.replace(p, k_scheme=scheme,
                                                                                        v_scheme=scheme)
                                     for p in plan.layers))
    path = str(fp8_plan.root / f"{dtype}-{scheme}.json")
    plan.save(path)
    target = fp8_plan.root / f"ckpt-{dtype}-{scheme}"
    rc, out, err = run_cli(capsys, "export", path, "--format", "vllm", "--write-checkpoint", target)
    assert rc == 0, err
    args = parse_vllm(out, model=str(target))
    assert args.kv_cache_dtype == dtype and args.kv_cache_dtype_skip_layers == ["1"]
    assert "no KV scales" in out and "dtype goes on the command line" in out
    files = set(os.listdir(target))
    assert "config.json" in files and "tokenizer.json" in files and any(f.endswith(".safetensors") for f in files)
    assert SCALES_FILE not in files and RECIPE_FILE not in files
    cfg = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in cfg and "kv_cache_scheme" not in json.dumps(cfg)
    assert not [f for f in os.listdir(fp8_plan.root) if f.startswith(".tmp-checkpoint-")]


def test_write_checkpoint_is_vllm_only(tmp_path, capsys):
    line = one_error_line(*run_cli(capsys, "export", save(sglang_plan(), tmp_path), "--format", "sglang",
                                   "--write-checkpoint", tmp_path / "ckpt"))
    assert "--write-checkpoint is for --format vllm" in line
    line = one_error_line(*run_cli(capsys, "export", save(vllm_plan(), tmp_path), "--format", "vllm",
                                   "--scales-out", tmp_path / "s.json"))
    assert "--scales-out is for --format sglang" in line


def test_export_refuses_another_model(fp8_plan, tmp_path, tiny_tokenizer, capsys):
    other = tmp_path / "other"
    make_tiny_model("llama", seed=1).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    capsys.readouterr()
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


# --------------------------------------------------------------------------- issue 24: one export per checkpoint


def test_a_killed_exports_temp_folder_is_removed_by_the_next_export(fp8_plan, capsys, monkeypatch):
    """kill -9 during --write-checkpoint left a .tmp-checkpoint-* folder (237 MB for the default model) that the
    next export kept; the next export into that checkpoint now removes it (and only its own)."""
    import sensprof.export.checkpoint as ckpt_mod

    root, ckpt = fp8_plan.root, fp8_plan.root / "killed-ckpt"
    other = root / ".tmp-checkpoint-another-ckpt.abcd1234"  # a running export into another checkpoint: kept
    other.mkdir()

    def killed(*a, **k):  # a kill -9 after the weights are saved: no cleanup runs
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod, "add_scales", killed)
    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", lambda *a, **k: None)
    assert run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)[0] == 130
    monkeypatch.undo()
    left = [n for n in os.listdir(root) if n.startswith(".tmp-checkpoint-killed-ckpt.")]
    assert len(left) == 1 and any(f.endswith(".safetensors") for f in os.listdir(root / left[0]))
    assert not ckpt.exists()

    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    assert rc == 0, err
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-checkpoint-killed-ckpt")]
    assert other.is_dir()
    assert SCALES_FILE in os.listdir(ckpt)
    assert not [n for n in os.listdir(root) if n.endswith(".sensprof.lock")]


def test_a_second_export_into_a_checkpoint_being_written_is_refused(fp8_plan, capsys, monkeypatch):
    import sensprof.export.checkpoint as ckpt_mod

    ckpt, seen = fp8_plan.root / "busy-ckpt", []
    real = ckpt_mod.add_scales

    def second_export(*a, **k):
        seen.append(main(["export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", str(ckpt)]))
        return real(*a, **k)

    monkeypatch.setattr(ckpt_mod, "add_scales", second_export)
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    assert rc == 0 and seen == [2]
    errors = [ln for ln in err.splitlines() if ln.startswith("sensprof: error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert f"--write-checkpoint {str(ckpt)!r} is being written by another sensprof run (pid {os.getpid()}" in errors[0]
    assert SCALES_FILE in os.listdir(ckpt)


def test_full_disk_while_writing_a_checkpoint(fp8_plan, capsys, monkeypatch):
    import errno

    import sensprof.export.checkpoint as ckpt_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt_mod, "add_scales", full)
    ckpt = fp8_plan.root / "full-ckpt"
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    errors = [ln for ln in err.splitlines() if ln.startswith("sensprof: error:")]  # after transformers' save bar
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "no space left writing" in errors[0] and str(ckpt) in errors[0]
    assert not ckpt.exists()
    assert not [n for n in os.listdir(fp8_plan.root) if n.startswith(".tmp-checkpoint-full-ckpt")]


def test_a_full_disk_reported_by_safetensors_is_one_line_too(fp8_plan, capsys, monkeypatch):
    """safetensors raises its own SafetensorError on a full disk, which was a traceback."""
    import sensprof.export.checkpoint as ckpt_mod

    class SafetensorError(Exception):
        pass

    def full(*a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(ckpt_mod, "add_scales", full)
    ckpt = fp8_plan.root / "full-st-ckpt"
    rc, out, err = run_cli(capsys, "export", fp8_plan.path, "--format", "vllm", "--write-checkpoint", ckpt)
    errors = [ln for ln in err.splitlines() if ln.startswith("sensprof: error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "no space left writing" in errors[0] and not ckpt.exists()
    assert not [n for n in os.listdir(fp8_plan.root) if n.startswith(".tmp-checkpoint-full-st-ckpt")]


KILLED_EXPORT = """
import sys, time
import sensprof.export.checkpoint as ckpt_mod
real = ckpt_mod.add_scales
def stall(*a, **k):
    real(*a, **k)
    print("written", flush=True)
    time.sleep(600)
ckpt_mod.add_scales = stall
from sensprof.cli import main
main(["export", sys.argv[1], "--format", "vllm", "--write-checkpoint", sys.argv[2]])
"""


def test_a_killed_export_leaves_no_half_written_checkpoint(fp8_plan, tmp_path):
    """kill -9 during --write-checkpoint left ~100 MB of temporary files and its lock file until a later export into
    the same name; the export's reaper removes them as soon as it dies."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("psutil")
    ckpt = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, fp8_plan.path, str(ckpt)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
        temp = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-checkpoint-killed.")]
        assert len(temp) == 1 and os.listdir(tmp_path / temp[0])  # the half-written checkpoint is there
        lock = tmp_path / ".killed.sensprof.lock"
        assert lock.exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while ((tmp_path / temp[0]).exists() or lock.exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not (tmp_path / temp[0]).exists() and not ckpt.exists() and not lock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


@pytest.mark.parametrize("gib", ["1e300", "1e-300", "1e10"])
def test_a_memory_no_machine_holds_is_refused(capsys, tmp_path, gib):
    """1e300 GiB overflowed into a traceback and 1e-300 printed "0 tokens fit"; both are one line now."""
    line = one_error_line(*run_cli(capsys, "export", save(vllm_plan(), tmp_path), "--format", "vllm",
                                   "--gpu-mem-gib", gib))
    assert f"--gpu-mem-gib {float(gib):g} is outside what any machine holds" in line


def test_per_layer_kv_pairs_export_the_bytes_the_plugin_allocates(capsys):
    """The planner's per-layer vLLM plan with K/V pairs (plans/smollm2-135m-vllm-cpu-per-layer-8bits.json): the
    `vllm serve` line carries every layer's name as the plugin reads it, and the bytes per token export prints are
    the plugin's own arithmetic for a bf16 model (which the engine test holds equal to vLLM's allocation)."""
    import re

    from conftest import plugin_plan_module

    mod = plugin_plan_module()
    path = os.path.join(os.path.dirname(__file__), "..", "plans", "smollm2-135m-vllm-cpu-per-layer-8bits.json")
    rc, out, err = run_cli(capsys, "export", path, "--format", "vllm")
    assert rc == 0, err
    argv = shlex.split(next(ln for ln in out.splitlines() if ln.startswith("vllm serve")))
    parsed = mod.plan_from_additional_config(json.loads(argv[argv.index("--additional-config") + 1]))
    assert any(mod.is_pair(d) for d in parsed.layers) and len(parsed.layers) == 30
    printed = int(re.search(r"# KV cache: ([\d,]+) bytes/token", out).group(1).replace(",", ""))
    assert printed == parsed.kv_bytes_per_token(2) == 11520
    pool = re.search(r"# vLLM's KV pool \(its CPU page/block arithmetic, docs/vllm-plugin.md\): ([\d,]+) bytes/token at "
                     r"bf16 in 1 KV cache group, nothing padded: the plan's price", out)
    assert int(pool.group(1).replace(",", "")) == printed


def _as_sliding_window_model(tmp_path, dtypes=None):
    """The per-layer K/V plan's JSON with Gemma 3's layer pattern (5 windowed layers, then a full one), and, where
    given, each layer's dtype (its K and V schemes as that dtype stores them)."""
    path = os.path.join(os.path.dirname(__file__), "..", "plans", "smollm2-135m-vllm-cpu-per-layer-8bits.json")
    with open(path) as f:
        obj = json.load(f)
    schemes = {"auto": ("none", "none"), "fp8_e4m3": ("fp8_e4m3_rtz", "fp8_e4m3_rtz")}
    for i, layer in enumerate(obj["layers"]):
        layer.update(kind="full", window=None) if i % 6 == 5 else layer.update(kind="sliding", window=512)
        if dtypes:
            layer["k_scheme"], layer["v_scheme"] = schemes[dtypes[i]]
    if dtypes:
        obj["engine"]["layer_dtypes"] = list(dtypes)
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(obj))
    return str(out)


def test_per_layer_plan_of_a_sliding_window_model_exports_vllms_pool(capsys, tmp_path):
    """On a sliding-window model vLLM groups windowed and full layers apart and pads pages that do not divide the
    largest: a per-layer plan it pads nothing in prints its pool (6 groups of 5 layers here) at exactly the bytes per
    token the plan priced; one it would pad is refused in one line (exit 2), as the plugin would refuse it."""
    import re

    dtypes = ["auto" if i % 6 == 5 else "fp8_e4m3" for i in range(30)]
    rc, out, err = run_cli(capsys, "export", _as_sliding_window_model(tmp_path, dtypes), "--format", "vllm")
    assert rc == 0, err
    printed = int(re.search(r"# KV cache: ([\d,]+) bytes/token", out).group(1).replace(",", ""))
    pool = re.search(r"# vLLM's KV pool \(its CPU page/block arithmetic, docs/vllm-plugin.md\): ([\d,]+) bytes/token at "
                     r"bf16 in 6 KV cache groups, nothing padded: the plan's price", out)
    assert int(pool.group(1).replace(",", "")) == printed == 25 * 3 * 128 + 5 * 3 * 256
    assert out.count("bytes per token") + out.count("bytes/token") == 2  # no other pool figure (0.33's GPU one)
    fit = re.search(r"# in 80 GiB of KV cache: ([\d,]+) tokens", out)
    assert int(fit.group(1).replace(",", "")) == 80 * 2**30 // printed
    line = one_error_line(*run_cli(capsys, "export", _as_sliding_window_model(tmp_path), "--format", "vllm"))
    assert re.search(r"vLLM would pad this per-layer plan's KV pages on a sliding-window model: [\d,]+ bytes per token "
                     r"where its layers take 11,520 .*re-plan it with `sensprof plan --per-layer`", line), line
