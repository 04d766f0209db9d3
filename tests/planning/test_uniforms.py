"""sensprof.planning.uniforms: every uniform configuration the free target stores within a budget, and the maximal
ones (no other at least as precise on both tensors), which the baselines screen ranks."""

from __future__ import annotations

import re

import pytest

from sensprof.errors import SensprofError
from sensprof.planning.budget import Budget
from sensprof.planning.uniforms import (Uniform, at_least_as_precise, candidates, keep_recent, key_schemes, maximal,
                                        rank, value_schemes, within_budget)
from sensprof.schemes import get_scheme

SMOL = [{"kv_heads": 3, "head_dim": 64, "kind": "full", "window": None}] * 30  # SmolLM2-135M's cache shape


def test_every_stored_layout_is_a_candidate_not_only_the_menus():
    keys, values = key_schemes({64}), value_schemes({64})
    for k in ("int4_c64", "int4_c64_r32_s4", "int3_c128_s4", "int8_c32", "fp8_e4m3", "none"):
        assert k in keys
    for v in ("int5_t64", "int4_t32_r32_s4", "int4_t64_s4", "fp8_e5m2", "none"):
        assert v in values
    assert "int4_t128" not in values  # a 128-channel group on a 64-wide head is the 64 one again
    assert "int4_t128" in value_schemes({256})
    narrow = value_schemes({16})  # a head under the narrowest registered group: that group is the head's width
    assert "int2_t32" in narrow and not any("_t16" in v for v in narrow)
    assert all(get_scheme(v) for v in narrow)
    grouped = re.compile(r"int\d_([ct])\d+")
    assert {grouped.match(k).group(1) for k in keys if grouped.match(k)} == {"c"}  # keys per channel
    assert {grouped.match(v).group(1) for v in values if grouped.match(v)} == {"t"}  # values per token


@pytest.mark.parametrize("a,b,expected", [
    ("int4_c32", "int4_c64", True), ("int4_c64", "int4_c32", False), ("int5_c64", "int4_c64", True),
    ("int4_c64_r32_s4", "int4_c64", True), ("int4_c64", "int4_c64_s4", False), ("int4_c32", "int5_c64", False),
    ("none", "int2_t32", True), ("int8_t32", "none", False), ("fp8_e4m3", "fp8_e5m2", False),
    ("int8_c32", "int8_t32", False), ("int4_t64", "int4_t64", True)])
def test_at_least_as_precise_orders_only_one_layout(a, b, expected):
    assert at_least_as_precise(a, b) is expected


def test_within_budget_holds_the_uniform_the_menus_missed():
    """int4_c64 / int5_t64 is 5.0 bits on SmolLM2 (4 + 32/64 and 5 + 32/64): a 5-bit budget holds it."""
    budget = Budget("avg_bits", 5.0)
    fits = within_budget(budget, SMOL)
    names = {(c.k, c.v) for c in fits}
    assert ("int4_c64", "int5_t64") in names and ("int4_c64", "int6_t64") not in names
    assert all(c.cost <= budget.limit(SMOL) * (1 + 1e-9) for c in fits)
    assert ("none", "none") not in names


def test_maximal_keeps_exactly_the_undominated():
    budget = Budget("avg_bits", 4.0, context_len=4096)  # sinks and residual windows priced at 16 bits
    fits = within_budget(budget, SMOL)
    top = maximal(fits)
    kept = {(c.k, c.v) for c in top}
    for c in fits:
        beaten = any((o.k, o.v) != (c.k, c.v) and at_least_as_precise(o.k, c.k) and at_least_as_precise(o.v, c.v)
                     for o in fits)
        assert ((c.k, c.v) in kept) is (not beaten)
    assert [c.cost for c in top] == sorted(c.cost for c in top)
    assert 3 <= len(top) < len(fits) / 5  # a few dozen at most, from hundreds


def test_no_uniform_fits_a_tiny_budget():
    with pytest.raises(SensprofError, match="no uniform configuration fits the budget"):
        candidates(Budget("avg_bits", 0.5), SMOL)


def test_rank_takes_the_least_summed_damage():
    configs = [Uniform("a", "x", 1.0), Uniform("b", "y", 2.0), Uniform("a", "y", 1.5), Uniform("none", "x", 3.0)]
    k, v = {"a": 1.0, "b": 0.1}, {"x": 0.5, "y": 2.0}
    assert [(c.k, c.v) for c in rank(configs, k, v, 2)] == [("none", "x"), ("a", "x")]


def test_keep_recent_adds_sinks_and_a_residual_window_to_grouped_integers_only():
    assert keep_recent("int4_c64") == "int4_c64_r32_s4" and keep_recent("int3_t32") == "int3_t32_r32_s4"
    assert keep_recent("int4_c32_pre") == "int4_c32_pre_r32_s4"
    for same in ("none", "fp8_e4m3", "int8_per_token_head", "int2_c32_s4", "int3_c32_r32_s4"):
        assert keep_recent(same) == same


def test_kept_recent_base_undoes_keep_recent_and_nothing_else():
    from sensprof.planning.uniforms import kept_recent_base

    for base in ("int4_c64", "int3_t32", "int4_c32_pre", "int8_c128"):
        assert kept_recent_base(keep_recent(base)) == base
    # kept tokens that keep_recent did not add: a sink-only scheme's, a residual window's with sinks of another size,
    # or no scheme at all
    for other in ("int4_c64", "int2_c32_s4", "fp8_e4m3", "none", "int4_c64_s4_r32_s4", "bogus_r32_s4"):
        assert kept_recent_base(other) is None


def test_bounded_scheme_reads_a_missing_kept_recent_cell_as_its_base():
    from sensprof.planning.uniforms import bounded_scheme

    measured = {"int4_c64", "int3_t32", "int5_c64_r32_s4"}.__contains__
    assert bounded_scheme("int5_c64_r32_s4", measured) == "int5_c64_r32_s4"  # measured: itself
    assert bounded_scheme("int4_c64_r32_s4", measured) == "int4_c64"  # missing: its base, an upper bound
    assert bounded_scheme("int6_c64_r32_s4", measured) == "int6_c64_r32_s4"  # neither measured: no cell
    assert bounded_scheme("int3_t32_s4", measured) == "int3_t32_s4"  # not keep_recent's: no substitute


GEMMA = ([{"kv_heads": 1, "head_dim": 256, "kind": "sliding", "window": 512}] * 5
         + [{"kv_heads": 1, "head_dim": 256, "kind": "full", "window": None}]) * 3  # Gemma 3 270M's cache shape


def test_per_layer_candidates_are_each_plugin_dtype_alone_within_the_budget():
    """A per-layer vLLM plan's uniform baselines: every dtype the plugin serves on the CPU backend (vLLM's own and
    the K/V pairs), alone on every layer, that fits; the undominated only. At 8 bits on Gemma 3 270M that holds fp8
    and the pair of fp8's bytes, 8-bit keys and 6-bit values in groups of 32 (9 + 7 bits)."""
    from sensprof.planning.uniforms import per_layer_candidates
    from sensprof.targets import get_target

    tgt = get_target("vllm", "cpu", head_dims={256}, per_layer=True)
    budget = Budget("avg_bits", 8)
    found = per_layer_candidates(tgt.dtypes, budget, GEMMA)
    flags = {c.flag for c in found}
    assert {"fp8_e4m3", "fp8_e5m2", "k:int8_t32/v:int6_t32"} <= flags
    assert "auto" not in flags and "k:int8_t32/v:int8_t32" not in flags  # nothing quantized; 9 bits
    assert all(c.cost <= budget.limit(GEMMA) * (1 + 1e-9) for c in found)
    by_flag = {d.flag_value: d.schemes for d in tgt.dtypes}
    assert all((c.k, c.v) == by_flag[c.flag] and c.name == f"uniform {c.flag}" for c in found)
    assert maximal(found) == found
    assert "k:int8_t32/v:int4_t32" not in flags  # int8_t32/int6_t32 fits and is at least as precise
    with pytest.raises(SensprofError, match="no per-layer vLLM dtype fits the budget"):
        per_layer_candidates(tgt.dtypes, Budget("avg_bits", 2), GEMMA)


def test_keys_before_rope_are_candidates_only_where_every_layer_has_rope():
    """Per channel before RoPE (KVQuant keys) beat per channel after it at 3-6 bits on Gemma 3 270M; a NoPE layer has
    no RoPE to quantize before, so a model with one gets only the keys after RoPE."""
    after, both = key_schemes({64}), key_schemes({64}, pre_rope=True)
    pre = [k for k in both if "_pre" in k]
    assert not any("_pre" in k for k in after)
    assert set(after) < set(both) and len(pre) == len([k for k in after if re.match(r"int\d_c\d+", k)])
    assert {"int4_c64_pre", "int4_c64_pre_r32_s4", "int3_c128_pre_s4"} <= set(pre)
    budget = Budget("avg_bits", 4.0)
    plain = {(c.k, c.v) for c in candidates(budget, SMOL)}
    with_pre = {(c.k, c.v) for c in candidates(budget, SMOL, pre_rope=True)}
    assert plain < with_pre  # keys before RoPE are a layout of their own: no configuration after RoPE displaces one
    assert {get_scheme(k).pre_rope for k, _ in with_pre - plain} == {True}


def test_keys_move_before_rope_in_the_name_grammars_place_and_back():
    from sensprof.planning.uniforms import after_rope, before_rope

    moved = {"int5_c128": "int5_c128_pre", "int6_c64_r32_s4": "int6_c64_pre_r32_s4", "int3_c32_s4": "int3_c32_pre_s4"}
    for name, pre in moved.items():
        assert before_rope(name) == pre and get_scheme(pre).pre_rope and after_rope(pre) == name
        assert get_scheme(pre).bits == get_scheme(name).bits and get_scheme(pre).group == get_scheme(name).group
    for same in ("int4_t64", "none", "fp8_e4m3_cal", "int8_per_token_head", "int4_c64_pre", "q4_0"):
        assert before_rope(same) == same
    assert after_rope("int4_c64") is None and after_rope("none") is None


def test_a_key_before_rope_the_profile_lacks_is_priced_by_its_twin_after_rope():
    from sensprof.planning.uniforms import bounded_scheme

    have = {"int4_c64", "int5_c64_r32_s4"}
    assert bounded_scheme("int4_c64_pre", have.__contains__) == "int4_c64"
    assert bounded_scheme("int4_c64_pre_r32_s4", have.__contains__) == "int4_c64"  # the twin's base: kept tokens
    assert bounded_scheme("int5_c64_pre_r32_s4", have.__contains__) == "int5_c64_r32_s4"
    assert bounded_scheme("int4_c64_pre", (have | {"int4_c64_pre"}).__contains__) == "int4_c64_pre"  # its own cell
    assert bounded_scheme("int3_c64_pre", have.__contains__) == "int3_c64_pre"  # nothing to read: the caller's NaN
