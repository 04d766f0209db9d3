"""Storage cost: bits per element (codes + scales + zero-points), token counts, layer cache bits."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import pytest

from sensprof.memory import (
    bits_per_element,
    effective_group,
    layer_cache_bits,
    layer_cache_bytes,
    quantized_token_count,
)
from sensprof.schemes import REGISTRY, get_scheme

# ------------------------------------------------------------------------------------ no torch


@pytest.mark.parametrize("modules", [
    "sensprof",
    "sensprof.errors",
    "sensprof.schemes",
    "sensprof.memory",
    "sensprof.memory, sensprof.schemes",
    "sensprof.constants",
    "sensprof.planning.budget",
    "sensprof.targets",
    "sensprof.planning.planner",
    "sensprof.planning.plan",
    "sensprof.profiling.screen",
    "sensprof.planning.pricing",
    "sensprof.export, sensprof.export.vllm, sensprof.export.sglang, sensprof.export.llamacpp",
])
def test_cost_model_imports_no_torch(modules):
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------ bits per element


@pytest.mark.parametrize("name, head_dim, expected", [
    ("none", 64, 16.0),
    ("none", 128, 16.0),
    # fp8 with a per-tensor or per-head scale: the scale is a per-layer constant, not per element.
    ("fp8_e4m3", 64, 8.0),
    ("fp8_e5m2", 128, 8.0),
    ("fp8_e4m3_cal", 64, 8.0),
    ("fp8_e5m2_cal", 128, 8.0),
    ("fp8_e4m3_head", 64, 8.0),
    ("fp8_e5m2_head", 96, 8.0),
    ("int8", 64, 8.0),
    # one fp32 scale per token and head
    ("fp8_per_token_head", 64, 8.5),
    ("fp8_per_token_head", 128, 8.25),
    ("int8_per_token_head", 64, 8.5),
    ("int8_per_token_head", 128, 8.25),
    ("int4_per_token_head", 64, 4.5),
    ("int4_per_token_head", 128, 4.25),
    ("int4_per_token_head", 80, 4.4),
    # llama.cpp: blocks of 32, fp16 scale (+ fp16 min for _1)
    ("q8_0", 64, 8.5),
    ("q8_0", 128, 8.5),
    ("q4_0", 64, 4.5),
    ("q4_0", 128, 4.5),
    ("q4_1", 64, 5.0),
    ("q4_1", 128, 5.0),
    ("q5_0", 128, 5.5),
    ("q5_1", 128, 6.0),
    # KIVI-style: fp16 scale + fp16 zero per group
    ("int4_c32", 64, 5.0),
    ("int4_c32", 128, 5.0),
    ("int2_c32", 128, 3.0),
    ("int2_c64", 128, 2.5),
    ("int2_c128", 64, 2.25),
    ("int8_c128", 128, 8.25),
    ("int3_c64", 32, 3.5),  # per-channel groups count tokens: head_dim does not matter
    ("int4_t32", 128, 5.0),
    ("int4_t64", 128, 4.5),
    ("int4_t128", 128, 4.25),
    ("int2_t32", 64, 3.0),
    # token groups larger than head_dim clip to head_dim
    ("int4_t128", 64, 4.5),
    ("int4_t64", 64, 4.5),
    ("int4_t128", 32, 5.0),
    ("int6_t64", 32, 7.0),
    ("q4_0", 16, 5.0),
    ("q4_1", 16, 6.0),
    # head_dim not divisible by the group: ceil(D/G) scales per token
    ("int4_t32", 80, 4 + 3 * 32 / 80),
    ("int4_t64", 96, 4 + 2 * 32 / 96),
    ("q4_0", 80, 4 + 3 * 16 / 80),
    ("q8_0", 48, 8 + 2 * 16 / 48),
    ("q5_1", 40, 5 + 2 * 32 / 40),
])
def test_bits_per_element(name, head_dim, expected):
    assert bits_per_element(get_scheme(name), head_dim) == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize("bits", (8, 6, 5, 4, 3, 2))
@pytest.mark.parametrize("group", (32, 64, 128))
@pytest.mark.parametrize("head_dim", (64, 80, 128, 256))
def test_bits_per_element_kivi_grid(bits, group, head_dim):
    c = bits_per_element(REGISTRY[f"int{bits}_c{group}"], head_dim)
    t = bits_per_element(REGISTRY[f"int{bits}_t{group}"], head_dim)
    assert c == pytest.approx(bits + 32 / group, rel=1e-12)
    g = min(group, head_dim)
    n_groups = -(-head_dim // g)
    assert t == pytest.approx(bits + n_groups * 32 / head_dim, rel=1e-12)
    assert t >= bits + 32 / head_dim  # at least one scale+zero per token


@pytest.mark.parametrize("name, base", [("int4_c32_pre_r128_s4", "int4_c32"), ("q4_0_r64", "q4_0"),
                                        ("fp8_e4m3_s8", "fp8_e4m3"), ("int8_per_token_head_pre", "int8_per_token_head")])
def test_modifiers_do_not_change_bits_per_element(name, base):
    s, base = get_scheme(name), REGISTRY[base]
    for d in (64, 128):
        assert bits_per_element(s, d) == bits_per_element(base, d)


def test_fewer_bits_cost_less():
    for kind in "ct":
        for g in (32, 64, 128):
            costs = [bits_per_element(REGISTRY[f"int{b}_{kind}{g}"], 128) for b in (8, 6, 5, 4, 3, 2)]
            assert costs == sorted(costs, reverse=True)
            assert len(set(costs)) == len(costs)


@pytest.mark.parametrize("name, head_dim, expected", [
    ("int4_t32", 64, 32),
    ("int4_t128", 64, 64),
    ("int8_per_token_head", 96, 96),
    ("q4_0", 16, 16),
    ("int4_c64", 16, 64),
    ("int4_c32", 128, 32),
    ("fp8_e4m3", 64, None),
    ("fp8_e4m3_head", 64, None),
    ("int8", 64, None),
])
def test_effective_group(name, head_dim, expected):
    assert effective_group(get_scheme(name), head_dim) == expected


# ------------------------------------------------------------------------------------ quantized tokens


def _brute_force_quantized(scheme, n):
    """Count tokens by the documented rule, one token at a time.

    A token is quantized unless it is a sink, one of the `residual` most recent tokens, or (per channel)
    in a group of G tokens (counted from the first non-sink) that is not complete yet.
    """
    if scheme.is_identity:
        return 0
    count = 0
    body = max(0, n - scheme.sink)
    for i in range(scheme.sink, n):
        j = i - scheme.sink  # index within the body
        if i >= n - scheme.residual:
            continue
        if scheme.granularity == "channel" and (j // scheme.group + 1) * scheme.group > body:
            continue
        count += 1
    return count


@pytest.mark.parametrize("name", [
    "none", "fp8_e4m3", "fp8_e4m3_s4", "int8_r16", "q4_0", "q4_0_r32", "int4_t32_s4",
    "int4_t32_r128_s4", "int4_c32", "int4_c32_s4", "int4_c64_s7", "int8_per_token_head_r3_s5",
])
def test_quantized_token_count_matches_the_rule(name):
    s = get_scheme(name)
    for n in list(range(300)) + [1000, 1023, 1024, 1025, 4099]:
        assert quantized_token_count(s, n) == _brute_force_quantized(s, n), (name, n)


@pytest.mark.parametrize("name, n, expected", [
    ("none", 1000, 0),
    ("none", 0, 0),
    ("int4_t32", 1000, 1000),
    ("int4_t32", 0, 0),
    ("int4_t32_r128", 1000, 872),
    ("int4_t32_r128", 100, 0),
    ("int4_t32_r128", 128, 0),
    ("int4_t32_r128", 129, 1),
    ("int4_t32_s4", 1000, 996),
    ("int4_t32_s4", 3, 0),
    ("int4_t32_r128_s4", 1000, 868),
    ("int4_t32_r128_s4", 132, 0),
    ("fp8_e4m3_r10", 20, 10),
    ("int4_c32", 1000, 992),
    ("int4_c32", 31, 0),
    ("int4_c32", 32, 32),
    ("int4_c32", 63, 32),
    ("int4_c128", 1000, 896),
    ("int4_c32_s4", 36, 32),
    ("int4_c32_s4", 35, 0),
    ("int4_c32_s4", 1000, 992),
    ("int4_c32_r128", 1024, 896),  # residual a multiple of G and body complete: no ambiguity
    ("int4_c32_r64_s4", 1028, 960),
])
def test_quantized_token_count_values(name, n, expected):
    assert quantized_token_count(get_scheme(name), n) == expected


@pytest.mark.parametrize("name", [
    "none", "fp8_e4m3", "int8_r16", "q4_0_r32_s4", "int4_t32", "int4_t32_r128_s4", "int4_c32", "int4_c64_s7",
    "int4_c32_r128", "int2_c32_r100_s4", "int2_c128_r5", "int4_c32_r32",
])
def test_quantized_token_count_agrees_with_the_streaming_taps(name):
    """memory's count and the profiler's view of the cache (taps.full_precision_from) must agree."""
    from sensprof.profiling.taps import full_precision_from

    s = get_scheme(name)
    n_max = 400
    start = full_precision_from(s, n_max)
    for n in range(1, n_max + 1):
        if s.is_identity:
            expected = 0
        else:
            first_fp = n if start is None else min(n, int(start[n - 1]))
            expected = max(0, first_fp - s.sink)
        assert quantized_token_count(s, n) == expected, (name, n)


@pytest.mark.parametrize("name", ["int4_c32", "int2_c64_s4", "int8_c128_s1"])
def test_per_channel_without_residual_quantizes_complete_groups_only(name):
    s = get_scheme(name)
    for n in range(0, 700, 7):
        q = quantized_token_count(s, n)
        assert q % s.group == 0
        assert 0 <= max(0, n - s.sink) - q < s.group


@pytest.mark.parametrize("name, n", [("int4_c32_r100", 1000), ("int4_c32_r128", 1000), ("int2_c64_r16_s4", 200)])
def test_per_channel_with_residual_quantizes_complete_groups_and_costs_whole_scales(name, n):
    s = get_scheme(name)
    heads, d = 2, 64
    q = quantized_token_count(s, n)
    # Every group that holds any quantized token stores a full scale and zero-point per channel.
    n_groups = math.ceil(q / s.group)
    exact = (q * s.bits + n_groups * (s.scale_bits + s.zero_bits) + (n - q) * 16) * heads * d
    assert layer_cache_bits(s, n, heads, d) == exact
    assert q % s.group == 0


# ------------------------------------------------------------------------------------ layer cache bits


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_long_context_average_approaches_bits_per_element(name):
    s = REGISTRY[name]
    heads, d, n = 4, 128, 1 << 20
    per_element = layer_cache_bits(s, n, heads, d) / (n * heads * d)
    assert per_element == pytest.approx(bits_per_element(s, d), rel=1e-6)


@pytest.mark.parametrize("name, heads, d, n, expected", [
    ("none", 8, 128, 1000, 1000 * 8 * 128 * 16),
    ("none", 2, 64, 0, 0),
    ("fp8_e4m3", 8, 128, 1000, 1000 * 8 * 128 * 8),  # unit scale: nothing stored
    ("fp8_e5m2", 8, 128, 1000, 1000 * 8 * 128 * 8),
    ("fp8_e4m3_cal", 8, 128, 1000, 1000 * 8 * 128 * 8 + 32),  # one fp32 scale per layer
    ("int8", 8, 128, 1000, 1000 * 8 * 128 * 8 + 32),
    ("fp8_e4m3_head", 8, 128, 1000, 1000 * 8 * 128 * 8 + 32 * 8),  # one fp32 scale per head
    ("fp8_e5m2_head", 3, 64, 10, 10 * 3 * 64 * 8 + 32 * 3),
    ("q4_0", 8, 128, 1000, 1000 * 8 * (128 * 4 + 4 * 16)),
    ("q4_1", 2, 64, 5, 5 * 2 * (64 * 4 + 2 * 32)),
    ("q8_0", 2, 80, 7, 7 * 2 * (80 * 8 + 3 * 16)),
    ("int8_per_token_head", 4, 64, 9, 9 * 4 * (64 * 8 + 32)),
    ("fp8_per_token_head", 4, 128, 9, 9 * 4 * (128 * 8 + 32)),
    ("int4_t32", 2, 128, 11, 11 * 2 * (128 * 4 + 4 * 32)),
    ("int4_t128", 2, 64, 11, 11 * 2 * (64 * 4 + 32)),
    # per channel: complete groups quantized (codes + one fp16 scale and zero per channel and group)
    ("int4_c32", 2, 64, 1024, (1024 * 4 + 32 * 32) * 2 * 64),
    ("int4_c32", 2, 64, 100, (96 * 4 + 3 * 32 + 4 * 16) * 2 * 64),
    ("int2_c128", 1, 128, 127, 127 * 16 * 128),
    # residual and sink tokens are stored at 16 bits
    ("int4_t32_r128", 2, 128, 1000, (872 * (128 * 4 + 4 * 32) + 128 * 128 * 16) * 2),
    ("int4_t32_r128", 2, 128, 50, 50 * 128 * 16 * 2),
    ("int4_t32_s4", 2, 128, 1000, (996 * (128 * 4 + 4 * 32) + 4 * 128 * 16) * 2),
    ("int4_c32_s4", 2, 64, 100, (96 * 4 + 3 * 32 + 4 * 16) * 2 * 64),
    ("int4_c32_r128", 2, 64, 1024, (896 * 4 + 28 * 32 + 128 * 16) * 2 * 64),
    ("fp8_e4m3_cal_s4", 8, 128, 1000, (996 * 8 + 4 * 16) * 8 * 128 + 32),
])
def test_layer_cache_bits_exact(name, heads, d, n, expected):
    s = get_scheme(name)
    bits = layer_cache_bits(s, n, heads, d)
    assert isinstance(bits, float)
    assert bits == expected
    assert layer_cache_bytes(s, n, heads, d) == -(-expected // 8)


@pytest.mark.parametrize("n", [0, 1, 5, 127, 128, 129, 1000])
def test_identity_costs_16_bits(n):
    s = REGISTRY["none"]
    assert layer_cache_bits(s, n, 3, 96) == n * 3 * 96 * 16
    assert quantized_token_count(s, n) == 0


@pytest.mark.parametrize("base, residual, sink", [
    (base, r, s)
    for base in ("int4_t32", "q4_0", "int8_per_token_head", "fp8_e4m3_head", "int2_c32")
    for r, s in ((128, 0), (0, 4), (64, 4), (1, 1))
    # per channel, a residual that is not a whole number of groups keeps a partial group more (tested above)
    if not (base == "int2_c32" and r % 32)
])
def test_kept_tokens_cost_16_bits(base, residual, sink):
    """Compared with the unmodified scheme, each token held in full precision costs 16 - bpe more."""
    name = base + (f"_r{residual}" if residual else "") + (f"_s{sink}" if sink else "")
    s, b = get_scheme(name), REGISTRY[base]
    heads, d = 2, 128
    bpe = Fraction(bits_per_element(b, d))
    # n such that everything lines up with per-channel groups: body and body - residual are multiples of 32
    for n in (sink + 1024, sink + 2048):
        kept = n - quantized_token_count(s, n)
        assert kept == residual + sink
        diff = Fraction(layer_cache_bits(s, n, heads, d)) - Fraction(layer_cache_bits(b, n, heads, d))
        if b.granularity == "channel":
            # the base quantizes all `sink` tokens' worth of complete groups too: compare token counts directly
            kept_base = n - quantized_token_count(b, n)
            assert diff == (kept - kept_base) * (16 - bpe) * heads * d
        else:
            assert diff == kept * (16 - bpe) * heads * d


def test_all_tokens_kept_costs_model_bits_plus_constant_scales():
    # Everything within the residual window: only full-precision tokens (and any per-layer constant).
    assert layer_cache_bits(get_scheme("int4_t32_r128"), 100, 2, 64) == 100 * 2 * 64 * 16
    assert layer_cache_bits(get_scheme("fp8_e4m3_r128"), 100, 2, 64) == 100 * 2 * 64 * 16
    assert layer_cache_bits(get_scheme("int8_r128"), 100, 2, 64) == 100 * 2 * 64 * 16 + 32
    assert layer_cache_bits(get_scheme("fp8_e4m3_head_r128"), 100, 2, 64) == 100 * 2 * 64 * 16 + 64


@pytest.mark.parametrize("name", ["int4_t32", "q4_1", "int2_c32", "fp8_e4m3_head", "int8", "none", "int4_c64_r128_s4"])
def test_layer_cache_bits_scale_linearly_with_heads(name):
    s = get_scheme(name)
    for n in (0, 64, 999):
        one = layer_cache_bits(s, n, 1, 128)
        constant = 32 if (s.granularity == "tensor" and s.scale_source not in ("unit", "none")) else 0
        assert layer_cache_bits(s, n, 5, 128) == pytest.approx(5 * (one - constant) + constant, rel=1e-12, abs=0)


@pytest.mark.parametrize("name", ["int4_t32", "q4_0", "fp8_e4m3", "fp8_e4m3_head", "int8_per_token_head_r16_s4"])
def test_layer_cache_bits_monotone_in_tokens(name):
    s = get_scheme(name)
    prev = -1.0
    for n in range(400):
        bits = layer_cache_bits(s, n, 2, 64)
        assert bits > prev or (n == 0 and bits >= 0)
        prev = bits
        assert bits <= n * 2 * 64 * 16 + 32 * 2  # never more than unquantized (+ a constant scale)


def test_per_channel_cost_drops_when_a_group_completes():
    s = get_scheme("int2_c32")
    b = [layer_cache_bits(s, n, 2, 64) for n in range(100)]
    for n in range(1, 100):
        if n % 32 == 0:  # 31 tokens at 16 bits + 1 become 32 tokens at 2 + 32/32 bits
            assert b[n] == b[n - 1] - (31 * 16 - 32 * 3) * 2 * 64
        else:
            assert b[n] == b[n - 1] + 16 * 2 * 64


def test_bytes_round_up():
    # q4_0 with head_dim 16: 4-bit codes + one 16-bit scale = 80 bits per token and head = 10 bytes
    s = get_scheme("q4_0")
    assert layer_cache_bytes(s, 1, 1, 16) == 10
    # int2_t32 with head_dim 4: 2*4 + 32 = 40 bits = 5 bytes; int3: 12 + 32 = 44 bits -> 6 bytes
    assert layer_cache_bytes(get_scheme("int2_t32"), 1, 1, 4) == 5
    assert layer_cache_bytes(get_scheme("int3_t32"), 1, 1, 4) == 6
    assert isinstance(layer_cache_bytes(s, 3, 2, 16), int)
