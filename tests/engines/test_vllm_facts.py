"""sensprof.engines.vllm.facts against numbers vLLM 0.33.0's own classes produced
(tests/data/vllm/facts.json, written by tools/vllm_golden/facts.py). Never imports vllm."""
from __future__ import annotations

import json
import os

import pytest

from sensprof.engines.vllm import facts as F

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "vllm", "facts.json")


@pytest.fixture(scope="module")
def gold():
    with open(DATA) as f:
        return json.load(f)


def test_version(gold):
    assert gold["vllm_version"] == F.VLLM_VERSION


def test_page_sizes_match_vllm_specs(gold):
    for r in gold["pages"]:
        rope = 64 if r["dtype"].startswith("octave_") else None
        mine = F.page_bytes_per_token(r["dtype"], r["kv_heads"], r["head_dim"], rope_dim=rope) * r["block_size"]
        assert mine == r["page_size_bytes"], r


def test_every_cache_dtype_has_facts():
    names = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head", "int8_per_token_head",
             "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
             "turboquant_3bit_nc", "ultraquant_4bit", "nvfp4", "nvfp4_4over6", "octave_k3v4", "octave_k3v3",
             "octave_k3v3_compact", "bfloat16", "float16"]
    for n in names:
        d = F.DTYPES[n]
        assert d.gpus <= set(F.GPUS)
        assert {g for g, _ in d.excluded} == set(F.GPUS) - d.gpus, n
        assert d.forces_boundary_skip == F.forces_boundary_skip(n)


def test_slot_breakdown_examples():
    assert F.slot_bytes("turboquant_k3v4_nc", 128) == F.SlotBytes(50, 68, 0)
    assert F.slot_bytes("turboquant_3bit_nc", 128) == F.SlotBytes(50, 52, 0)
    assert F.slot_bytes("int4_per_token_head", 128) == F.SlotBytes(68, 68)
    assert F.slot_bytes("nvfp4", 128).total == 144
    assert F.slot_bytes("ultraquant_4bit", 256).total == 272  # format.py docstring: D=256 -> 272 B
    assert F.slot_bytes("octave_k3v4", 256, rope_dim=64).total == 248


def test_boundary_skip_matches_vllm(gold):
    for r in gold["boundary"]:
        assert F.boundary_skip_layers(r["num_hidden_layers"], r["is_hybrid"]) == r["skip"], r


def test_skip_flag_grammar(gold):
    p = gold["parse"]
    assert p["nargs"] == "+" and p["default"] == []
    for line in p["lines"]:
        argv = line["argv"]
        idx = [i for i, a in enumerate(argv) if a == "--kv-cache-dtype-skip-layers"]
        vals = []
        if idx:  # last occurrence wins
            rest = argv[idx[-1] + 1:]
            vals = rest[: next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]
        assert F.parse_skip_flag(vals) == line["kv_cache_dtype_skip_layers"]


def test_effective_skip_merge():
    assert F.effective_skip_layers("turboquant_k3v4_nc", ["5", "sliding_window"], 28) == \
        sorted({"0", "1", "26", "27", "5", "sliding_window"})
    assert F.effective_skip_layers("ultraquant_4bit", [], 4) == ["0", "1", "2", "3"]
    assert F.effective_skip_layers("int4_per_token_head", ["0", "1", "29"], 32) == ["0", "1", "29"]
    assert F.effective_skip_layers("turboquant_4bit_nc", [], 40, is_hybrid=True) == []
    assert F.layer_is_skipped(3, 1024, ["sliding_window"]) and not F.layer_is_skipped(3, None, ["0,3"])


def test_block_alignment_matches_platform(gold):
    for r in gold["align"]:
        bs = F.aligned_block_size(r["dtype"], r["kv_heads"], r["head_dim"], r["block_size_in"],
                                  r["smallest_kernel_block"])
        assert bs == r["block_size"], r
        assert bs * F.page_bytes_per_token(r["dtype"], r["kv_heads"], r["head_dim"]) == r["skip_page_size_padded"]


def test_sw_block_choice(gold):
    for r in gold["sw_block"]:
        per = F.page_bytes_per_token(r["dtype"], r["kv_heads"], r["head_dim"])
        assert F._largest_sw_block(per, r["budget"], 16) == r["block"], r


def test_pool_grouping_matches_vllm(gold):
    for p in gold["pools"]:
        plan = F.plan_pool([tuple(l) for l in p["layers"]], primary_dtype=p["primary"],
                           block_size=p["block_size"], align_block_size=False)
        assert plan.bytes_per_block == p["bytes_per_block"], p["name"]
        mine = sorted((g.kind, g.block_size, sorted(g.layers), g.page_bytes) for g in plan.groups)
        theirs = sorted((g["kind"], g["block_size"], g["layer_ids"], g["page_bytes"]) for g in p["groups"])
        assert mine == theirs, p["name"]


def test_dense_skip_layers_cost_their_own_bytes():
    layers = [("auto" if i in (0, 1, 29) else "int4_per_token_head", 8, 128, None) for i in range(32)]
    expect = 3 * F.page_bytes_per_token("auto", 8, 128) + 29 * F.page_bytes_per_token("int4_per_token_head", 8, 128)
    assert F.pool_bytes_per_token(layers) == expect  # no page padding for dense full attention
    plan = F.plan_pool(layers)
    assert plan.block_size == 64  # block bumped so one quantized page covers a 16-token bf16 page
    budget = 10 * 2**30
    n_blocks = budget // plan.bytes_per_block
    assert F.tokens_that_fit(budget, layers) == n_blocks * 64
    assert F.tokens_that_fit(budget, layers, max_model_len=4096) == int(n_blocks / 64 * 4096)


def test_hybrid_sliding_window_reserved():
    layers = [("fp8", 8, 128, None if i % 6 == 5 else 1024) for i in range(36)]
    plan = F.plan_pool(layers)
    assert plan.full_bytes_per_token == plan.bytes_per_block / 16 == 6 * F.page_bytes_per_token("fp8", 8, 128)
    per_req = plan.blocks_per_request(8192, max_in_flight_tokens=2048)
    assert per_req == 8192 // 16 + 5 * (-(-(1023 + 2048) // 16) + 1)
