"""Exports checked against the engines' own rules: vLLM 0.33's parser (a recorded fixture, no vLLM import),
SGLang's QuantParamSchema (mirrored with pydantic), vLLM's lack of a GGUF loader; and, on the real default
model (slow), a --write-checkpoint directory that transformers reloads to the same logits."""

from __future__ import annotations

import dataclasses
import copy
import json
import os
import shlex

import pytest
import torch
from conftest import one_error_line, run_cli
from test_export import LLAMA_KINDS, MODEL, make_plan, parse_vllm, save, sglang_plan, vllm_plan

from sensprof.errors import SensprofError
from sensprof.export import command_line
from sensprof.export.vllm import VLLM_KV_DTYPES, vllm_argv
from sensprof.planning.plan import predicted_summary

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "vllm", "argparse.json")
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


# --------------------------------------------------------------------------- vLLM 0.33's own parser


@pytest.fixture(scope="module")
def golden():
    with open(FIXTURE) as f:
        return json.load(f)


def recorded(golden, argv):
    for p in golden["parses"]:
        if p["argv"] == argv:
            return p
    return None


def test_fixture_is_vllm_033(golden):
    assert golden["vllm_version"] == "0.33.0"
    # our dtype list is vLLM's CacheDType, and vLLM's CacheConfig accepts every one of them
    assert list(VLLM_KV_DTYPES) == golden["cache_dtypes"]
    for d in golden["cache_dtypes"]:
        p = recorded(golden, ["--kv-cache-dtype", d])
        assert p["accepted"] and p["cache_config_valid"] and p["kv_cache_dtype"] == d


def test_fixture_records_the_grammar_we_rely_on(golden):
    assert not recorded(golden, ["--calculate-kv-scales"])["accepted"]  # removed: never emitted
    assert not recorded(golden, ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers"])["accepted"]
    comma = recorded(golden, ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0,1"])
    assert comma["kv_cache_dtype_skip_layers"] == ["0,1"]  # one token, not two layers: we emit separate tokens
    for bad in ("int4", "fp8_e4m3_cal", "q8_0", "FP8"):  # the parser takes any string; CacheConfig refuses it
        p = recorded(golden, ["--kv-cache-dtype", bad])
        assert p["accepted"] and not p["cache_config_valid"] and "Invalid kv_cache_dtype" in p["cache_config_error"]


def token_shape(tokens):
    return ["sliding_window" if t == "sliding_window" else "INT" if t.isdigit() else t for t in tokens]


@pytest.mark.parametrize("scheme,flag,skip,kinds", [
    ("int4_per_token_head", "int4_per_token_head", (0, 1, 2), LLAMA_KINDS),
    ("int8_per_token_head", "int8_per_token_head", (0, 2), LLAMA_KINDS),
    ("fp8_per_token_head", "fp8_per_token_head", (1,), LLAMA_KINDS),
    ("fp8_e4m3", "fp8_e4m3", (0, 1), [("sliding", 8), ("sliding", 8), ("full", None)]),
    ("fp8_e4m3", "fp8", (0, 1, 2), [("sliding", 8), ("sliding", 8), ("full", None)]),
    ("fp8_e5m2", "fp8_e5m2", (2,), LLAMA_KINDS),
    ("fp8_e4m3", "fp8_e4m3", (), LLAMA_KINDS),
])
def test_exported_argv_parses_as_vllm_parsed_it(golden, scheme, flag, skip, kinds):
    """Each argv we build has the dtype and skip-token shape of a line vLLM's parser recorded as accepted,
    with a dtype CacheConfig accepted, and our own parse of it gives the same values vLLM's would."""
    argv = vllm_argv(vllm_plan(scheme, flag, skip=skip, kinds=kinds), MODEL)[3:]
    ours = parse_vllm(command_line(["vllm", "serve", MODEL, *argv]))
    shape = token_shape(ours.kv_cache_dtype_skip_layers or [])
    matches = [p for p in golden["parses"] if p["accepted"] and p.get("cache_config_valid")
               and p["kv_cache_dtype"] == flag and token_shape(p["kv_cache_dtype_skip_layers"]) == shape]
    if not shape:
        matches = [p for p in golden["parses"] if p["argv"] == argv]
    assert matches, (argv, shape)
    if skip:  # vLLM keeps each token as given: a list of strings, as our parse gives
        assert all(isinstance(t, str) for t in ours.kv_cache_dtype_skip_layers)


# --------------------------------------------------------------------------- vLLM and GGUF


def write_gguf(path, **fields):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch="llama")
    for key, value in fields.items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def gguf_plan(tmp_path, model_id, n_layers=3):
    plan = vllm_plan("int4_per_token_head", "int4_per_token_head", skip=(0,), kinds=[("full", None)] * n_layers)
    return save(plan.replace(model_id=model_id), tmp_path)


def test_vllm_never_serves_the_builtin_gguf(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "export", gguf_plan(tmp_path, "smollm2-135m", 30), "--format", "vllm")
    assert rc == 0, err
    assert ".gguf" not in out.splitlines()[0] and "--tokenizer" not in out
    args = parse_vllm(out, model=SMOLLM2_HUB)
    assert args.kv_cache_dtype == "int4_per_token_head" and args.kv_cache_dtype_skip_layers == ["0"]
    assert "no GGUF loader" in out and "--write-checkpoint DIR" in out


@pytest.mark.parametrize("fields,expect", [
    ({"general.source.url": "https://huggingface.co/Org/Model-1B"}, "Org/Model-1B"),
    ({"general.source.repo_url": "https://huggingface.co/Org/Model-1B.git"}, "Org/Model-1B"),
    ({"general.source.huggingface.repository": "Org/Model-1B"}, "Org/Model-1B"),
    ({"general.source.url": "https://example.com/model", "general.source.huggingface.repository": "Org/M"}, "Org/M"),
])
def test_vllm_reads_the_gguf_source_repository(tmp_path, capsys, fields, expect):
    gguf = write_gguf(tmp_path / "m.gguf", **fields)
    rc, out, err = run_cli(capsys, "export", gguf_plan(tmp_path, gguf), "--format", "vllm")
    assert rc == 0, err
    assert parse_vllm(out, model=expect).kv_cache_dtype == "int4_per_token_head"
    assert ".gguf" not in out.splitlines()[0]


@pytest.mark.parametrize("fields,parent", [
    ({}, None),
    ({"general.source.url": "https://example.com/paper"}, None),
    ({"general.base_model.count": 1, "general.base_model.0.repo_url": "https://huggingface.co/Org/Base-1B"},
     "Org/Base-1B"),
])
def test_vllm_gguf_without_a_source_is_refused(tmp_path, capsys, fields, parent):
    gguf = write_gguf(tmp_path / "m.gguf", **fields)
    line = one_error_line(*run_cli(capsys, "export", gguf_plan(tmp_path, gguf), "--format", "vllm"))
    assert "no GGUF loader" in line and "--hub-id ORG/NAME" in line and "--write-checkpoint DIR" in line
    assert (parent in line) if parent else "parent" not in line
    rc, out, err = run_cli(capsys, "export", gguf_plan(tmp_path, gguf), "--format", "vllm", "--hub-id", "Org/Given")
    assert rc == 0, err
    assert parse_vllm(out, model="Org/Given").kv_cache_dtype == "int4_per_token_head"


def test_hub_id_is_checked(tmp_path, capsys):
    gguf = write_gguf(tmp_path / "m.gguf")
    line = one_error_line(*run_cli(capsys, "export", gguf_plan(tmp_path, gguf), "--format", "vllm",
                                   "--hub-id", "not a repo"))
    assert "--hub-id 'not a repo' is not a Hugging Face repository id" in line
    line = one_error_line(*run_cli(capsys, "export", save(vllm_plan(), tmp_path), "--format", "vllm",
                                   "--hub-id", "Org/M"))
    assert "--hub-id is for GGUF models" in line
    line = one_error_line(*run_cli(capsys, "export", save(sglang_plan(), tmp_path), "--format", "sglang",
                                   "--hub-id", "Org/M"))
    assert "--hub-id is for --format vllm" in line


# --------------------------------------------------------------------------- SGLang's QuantParamSchema


def quant_param_schema():
    """SGLang's schema, verbatim in substance (python/sglang/srt/model_loader/weight_utils.py)."""
    import pydantic  # a dev dependency (pyproject.toml)
    from typing import Optional

    BaseModel, ConfigDict, ValidationInfo, model_validator = (pydantic.BaseModel, pydantic.ConfigDict,
                                                              pydantic.ValidationInfo, pydantic.model_validator)

    class KVCacheQuantSchema(BaseModel):
        dtype: str
        scaling_factor: dict[int, dict[int, float]]

        @model_validator(mode="after")
        def check_is_fp8(self) -> "KVCacheQuantSchema":
            assert self.dtype == "float8_e4m3fn", (
                f"Loaded scaling factors intended for KV cache dtype = {self.dtype} rather than float8_e4m3fn!")
            return self

        @model_validator(mode="after")
        def check_tp_ranks(self, info: ValidationInfo) -> "KVCacheQuantSchema":
            context = info.context
            if context:
                tp_size = context["tp_size"]
                num_hidden_layers = context["num_hidden_layers"]
                assert len(self.scaling_factor) == tp_size
                for tp_rank, layer_maps in self.scaling_factor.items():
                    assert len(layer_maps) == num_hidden_layers
                for i in range(tp_size):
                    assert i in self.scaling_factor
            return self

        @model_validator(mode="after")
        def check_current_rank(self, info: ValidationInfo) -> "KVCacheQuantSchema":
            context = info.context
            if context:
                layer_scales_map = self.scaling_factor[context["tp_rank"]]
                for i in range(context["num_hidden_layers"]):
                    assert i in layer_scales_map
            return self

    class QuantParamSchema(BaseModel):
        model_config = ConfigDict(protected_namespaces=())
        model_type: Optional[str]
        kv_cache: KVCacheQuantSchema

        @model_validator(mode="after")
        def check_model_type(self, info: ValidationInfo) -> "QuantParamSchema":
            context = info.context
            if context:
                model_type = context.get("model_type", None)
                if model_type is not None:
                    assert model_type == self.model_type
            return self

    return QuantParamSchema


def sglang_load(path, tp_rank, tp_size, num_hidden_layers, model_type):
    """kv_cache_scales_loader's validation; SGLang turns any failure into scale 1.0, so here it raises."""
    with open(path) as f:
        schema = quant_param_schema().model_validate(json.load(f), context={
            "model_type": model_type, "num_hidden_layers": num_hidden_layers, "tp_rank": tp_rank,
            "tp_size": tp_size})
    return dict(schema.kv_cache.scaling_factor[tp_rank])


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_sglang_scales_pass_sglangs_schema(tmp_path, capsys, tiny_model_dir, tp):
    scales = tmp_path / "scales.json"
    rc, out, err = run_cli(capsys, "export", save(sglang_plan(model_id=tiny_model_dir), tmp_path), "--format",
                           "sglang", "--scales-out", scales, "--tp", tp)
    assert rc == 0, err
    per_rank = [sglang_load(scales, r, tp, 3, "llama") for r in range(tp)]
    assert all(m == per_rank[0] and set(m) == {0, 1, 2} for m in per_rank)
    from pydantic import ValidationError

    with pytest.raises(ValidationError):  # another TP size, layer count or model type is refused
        sglang_load(scales, 0, tp + 1, 3, "llama")
    with pytest.raises(ValidationError):
        sglang_load(scales, 0, tp, 4, "llama")
    with pytest.raises(ValidationError):
        sglang_load(scales, 0, tp, 3, "qwen2")


def test_old_scales_shape_fails_sglangs_schema(tmp_path):
    """What sensprof wrote before (no model_type) is what SGLang silently ignored."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.1}}}}))
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="model_type"):
        sglang_load(old, 0, 1, 1, "llama")


# --------------------------------------------------------------------------- the real default model (slow)


@pytest.fixture(scope="module")
def smollm2():
    from sensprof.models import fingerprint, load_model

    loaded = load_model("smollm2-135m", device="cpu")
    return loaded, fingerprint(loaded.model)


def smollm2_plan(fp, target="vllm", dtype="fp8_e4m3", skip=(0,)):
    scheme = {"fp8_e4m3": "fp8_e4m3_cal"}.get(dtype, dtype)
    pairs = [("none", "none") if i in skip else (scheme, scheme) for i in range(30)]
    engine = {"kv_cache_dtype": dtype, "k_scheme": scheme, "v_scheme": scheme, "needs_scales": dtype == "fp8_e4m3"}
    if target == "vllm":
        engine["skip_layers"] = list(skip)
    plan = make_plan(target, engine, pairs, [("full", None)] * 30, model_id="smollm2-135m", fingerprint=fp)
    layers = tuple(dataclasses.replace(p, kv_heads=3, head_dim=64) for p in plan.layers)
    # the prediction of these layers, as a planner writes it
    return plan.replace(layers=layers, predicted=dataclasses.replace(plan.predicted, **predicted_summary(layers)))


@pytest.mark.slow
def test_default_model_checkpoint_serves_and_reloads(smollm2, tmp_path, capsys):
    loaded, fp = smollm2
    ckpt = tmp_path / "ckpt"
    rc, out, err = run_cli(capsys, "export", save(smollm2_plan(fp), tmp_path), "--format", "vllm",
                           "--write-checkpoint", ckpt)
    assert rc == 0, err
    args = parse_vllm(out, model=str(ckpt))
    assert args.kv_cache_dtype == "fp8_e4m3" and args.kv_cache_dtype_skip_layers == ["0"]
    assert ".gguf" not in out
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["quantization_config"]["kv_cache_scheme"]["type"] == "float"
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16" and cfg["model_type"] == "llama"
    from safetensors.torch import load_file

    from sensprof.export.checkpoint import SCALES_FILE

    assert len(load_file(str(ckpt / SCALES_FILE))) == 2 * 29
    plain = tmp_path / "plain"  # transformers may want compressed-tensors for the KV scheme: reload without it
    os.makedirs(plain)
    for name in os.listdir(ckpt):
        if name != "config.json":
            os.symlink(ckpt / name, plain / name)
    del cfg["quantization_config"]
    (plain / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(str(plain))
    sd = reloaded.state_dict()
    for name, tensor in loaded.model.state_dict().items():  # exactly the GGUF's dequantized weights, in bf16
        assert sd[name].dtype == torch.bfloat16 and torch.equal(sd[name], tensor.to(torch.bfloat16)), name
    text = ("The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, "
            "there lived an old fisherman who")
    ids = AutoTokenizer.from_pretrained(str(plain))(text, return_tensors="pt").input_ids
    assert ids.tolist() == loaded.tokenizer(text, return_tensors="pt").input_ids.tolist()
    with torch.inference_mode():
        got = reloaded(input_ids=ids).logits.float()
        want = loaded.model(input_ids=ids).logits.float()
    # bf16 weights and activations vs the GGUF model in float32: close, same top token almost everywhere
    assert (got - want).abs().max() <= 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85


@pytest.mark.slow
def test_default_model_plain_checkpoint_and_sglang(smollm2, tmp_path, capsys):
    from sensprof.export.checkpoint import RECIPE_FILE, SCALES_FILE, write_checkpoint

    loaded, fp = smollm2
    plan = smollm2_plan(fp, dtype="int4_per_token_head")
    out_dir = write_checkpoint(plan, copy.deepcopy(loaded.model), loaded.tokenizer, str(tmp_path / "plain"))
    files = set(os.listdir(out_dir))
    assert SCALES_FILE not in files and RECIPE_FILE not in files and "config.json" in files
    assert "quantization_config" not in json.loads(open(os.path.join(out_dir, "config.json")).read())
    # SGLang serves the GGUF itself; its scales name the config's model_type and all 30 layers
    scales = tmp_path / "s.json"
    sg = smollm2_plan(fp, target="sglang", skip=())
    rc, out, err = run_cli(capsys, "export", save(sg, tmp_path), "--format", "sglang", "--scales-out", scales)
    assert rc == 0, err
    assert shlex.split(out.splitlines()[0])[4].endswith(".gguf")
    assert set(sglang_load(scales, 0, 1, 30, "llama")) == set(range(30))


def test_smollm2_plan_shape():
    plan = smollm2_plan("0" * 16)
    assert len(plan.layers) == 30 and list(plan.engine.skip_layers) == [0]
    with pytest.raises(SensprofError, match="only kind SGLang loads"):
        from sensprof.export.sglang import sglang_scales

        sglang_scales(smollm2_plan("0" * 16, "sglang", "fp8_e5m2", ()), "llama", 30)
