"""The planner's integer programs: optimal (checked against brute force on small random instances), within
budget, within what each target engine can express; infeasible and malformed input refused with one clear
SensprofError. Builds `Problem` objects directly, so no model and no torch is involved."""

from __future__ import annotations

import itertools
import math
import os
import random
import re

import pandas as pd
import pytest

from sensprof.planning.budget import GIB, Budget, budget_from_args, vllm_cpu_pool
from sensprof.errors import SensprofError
from sensprof.memory import MODEL_BITS, bits_per_element, layer_cache_bits
from sensprof.planning.planner import NONE, Problem, plan, problem_from_table
from sensprof.schemes import get_scheme
from sensprof.targets import TARGETS, engine_dtype_for, get_target

REL = 1e-6
VLLM = get_target("vllm", "ampere")  # plain fp8 keys there (Hopper's fp8 casts the query too: fp8_e4m3_qfp8)
KINDS = ("avg_bits", "fraction", "serving")


# --------------------------------------------------------------------------- helpers


def random_layers(rng: random.Random, n: int) -> list[dict]:
    layers = []
    for _ in range(n):
        sliding = rng.random() < 0.4
        layers.append({"kv_heads": rng.choice([1, 2, 4]), "head_dim": rng.choice([32, 64, 128]),
                       "kind": "sliding" if sliding else "full",
                       "window": rng.choice([64, 512, 4096]) if sliding else None})
    return layers


def random_problem(rng: random.Random, n: int, k_schemes, v_schemes, negative=False) -> Problem:
    layers = random_layers(rng, n)
    lo = -0.05 if negative else 0.0
    damage = {}
    for tensor, names in (("K", k_schemes), ("V", v_schemes)):
        for i in range(n):
            for s in names:
                damage[(i, tensor, s)] = rng.uniform(lo, 1.0) * 10 ** rng.uniform(-3, 0)
    return Problem(layers, damage, {"K": list(k_schemes), "V": list(v_schemes)})


def tensor_cost(budget: Budget, layer: dict, scheme: str) -> float:
    return budget.cost(get_scheme(scheme), layer)


def cost_table(budget: Budget, layers) -> dict:
    """(layer, scheme) -> cost of one tensor, for every scheme the tests use."""
    names = {NONE, *FREE_K, *FREE_V, *VLLM_SCHEMES, *SGLANG_SCHEMES, *LLAMA_K, *LLAMA_V}
    names |= {s for t in (*TARGETS.values(), get_target("vllm"), get_target("vllm", "cpu", per_layer=True))
              for d in t.dtypes for s in d.schemes}
    return {(i, s): tensor_cost(budget, layer, s) for i, layer in enumerate(layers) for s in names}


def assignment_cost(budget, layers, choices, table=None) -> float:
    table = table or cost_table(budget, layers)
    return sum(table[(i, k)] + table[(i, v)] for i, (k, v) in enumerate(choices))


def assignment_damage(problem: Problem, choices) -> float:
    return sum((0.0 if k == NONE else problem.damage[(i, "K", k)]) + (0.0 if v == NONE else problem.damage[(i, "V", v)])
               for i, (k, v) in enumerate(choices))


def assignments(problem: Problem, target, num_skip=None):
    """Every per-layer (K, V) assignment the target's structure allows, enumerated by brute force."""
    n = len(problem.layers)
    opts_k = problem.options["K"]
    opts_v = problem.options["V"]
    if target.structure == "free":
        cells = [[(k, v) for k in opts_k + [NONE] for v in opts_v + [NONE]] for _ in range(n)]
        yield from (list(c) for c in itertools.product(*cells))
    elif target.structure == "global_skip":
        dts = [d for d in target.dtypes if d.k_scheme in opts_k and d.v_scheme in opts_v]
        for d in dict.fromkeys(dts):
            forced = set(d.forced_skips(n))
            for skip in itertools.product([False, True], repeat=n):
                if any(not skip[i] for i in forced):
                    continue
                if num_skip is not None and sum(skip) - len(forced) != num_skip:
                    continue
                yield [(NONE, NONE) if sk else d.schemes for sk in skip]
    elif target.structure == "global":
        dts = [d for d in target.dtypes if d.k_scheme == NONE or (d.k_scheme in opts_k and d.v_scheme in opts_v)]
        for d in dict.fromkeys(dts):
            yield [d.schemes] * n
    elif target.structure == "per_layer":  # a dtype whose every stored tensor was profiled
        dts = [d for d in target.dtypes if all(s == NONE or s in opts for s, opts in ((d.k_scheme, opts_k),
                                                                                      (d.v_scheme, opts_v)))]
        windows = [layer["window"] if layer["kind"] == "sliding" else None for layer in problem.layers]
        for c in itertools.product(dts, repeat=n):
            # a sliding-window + full model: only what vLLM's CPU pool pads nothing in (budget.vllm_cpu_pool)
            if len(set(windows)) > 1 and any(vllm_cpu_pool([(d.flag_value, layer["kv_heads"], layer["head_dim"], w)
                                                            for d, layer, w in zip(c, problem.layers, windows)],
                                                           itemsize).padded for itemsize in (2, 4)):
                continue
            yield [d.schemes for d in c]
    else:
        ks = [d for d in target.dtypes if d.k_scheme == NONE or d.k_scheme in opts_k]
        vs = [d for d in target.dtypes if d.v_scheme == NONE or d.v_scheme in opts_v]
        for k in dict.fromkeys(ks):
            for v in dict.fromkeys(vs):
                if target.allows(k, v):
                    yield [(k.k_scheme, v.v_scheme)] * n


def brute_force(problem, target, budget, num_skip=None):
    """(optimal damage, smallest cost of any allowed assignment); damage is None when nothing fits."""
    limit = budget.limit(problem.layers)
    table = cost_table(budget, problem.layers)
    best, min_cost = None, math.inf
    for choices in assignments(problem, target, num_skip):
        c = assignment_cost(budget, problem.layers, choices, table)
        min_cost = min(min_cost, c)
        if c <= limit * (1 + 1e-9):
            d = assignment_damage(problem, choices)
            best = d if best is None else min(best, d)
    return best, min_cost


def cost_range(problem, target, budget_kind, num_skip=None):
    probe = make_budget(budget_kind, 1.0)
    table = cost_table(probe, problem.layers)
    costs = [assignment_cost(probe, problem.layers, c, table) for c in assignments(problem, target, num_skip)]
    return min(costs), max(costs)


def make_budget(kind: str, amount: float, layers=None) -> Budget:
    """A budget of `kind`; `amount` is in the budget's own unit (bits, fraction or GiB)."""
    if kind == "serving":
        return Budget("serving", amount, max_model_len=8192, max_num_seqs=3)
    return Budget(kind, amount)


def budget_between(rng, problem, target, kind, num_skip=None) -> Budget:
    """A random budget between the cheapest and the dearest allowed assignment (so it binds)."""
    lo, hi = cost_range(problem, target, kind, num_skip)
    limit = lo + rng.uniform(0.0, 1.05) * (hi - lo)
    unit = make_budget(kind, 1.0).limit(problem.layers)  # what 1.0 of the budget's unit buys
    value = limit / unit
    if kind == "fraction":
        value = min(value, 1.0)
    elif kind == "avg_bits":
        value = min(value, MODEL_BITS)  # past the 16-bit cache a budget means nothing (and is refused)
    return make_budget(kind, value)


def check_structure(problem, target, sol, num_skip=None):
    n = len(problem.layers)
    assert len(sol.choices) == n
    if target.structure == "free":
        for k, v in sol.choices:
            assert k in problem.options["K"] + [NONE]
            assert v in problem.options["V"] + [NONE]
        return
    if target.structure == "global_skip":
        skipped = [i for i, (k, v) in enumerate(sol.choices) if (k, v) == (NONE, NONE)]
        kept = {c for c in sol.choices if c != (NONE, NONE)}
        assert len(kept) <= 1, f"vllm plan uses more than one dtype: {sol.choices}"
        forced = []
        for k, v in kept:
            d = engine_dtype_for(target, k, v)
            assert d is not None, "one vLLM dtype's own K and V formats"
            assert (sol.engine.k_scheme, sol.engine.v_scheme) == (k, v)
            assert sol.engine.kv_cache_dtype == d.flag_value
            assert sol.engine.needs_scales == d.needs_scales
            forced = d.forced_skips(n)
            assert list(sol.engine.forced_skip_layers) == forced
            assert set(forced) <= set(skipped), "vLLM's own boundary layers are always kept"
        assert list(sol.engine.skip_layers) == skipped
        if len(skipped) == n:
            assert sol.engine.kv_cache_dtype == "auto"
        if num_skip is not None and kept:
            assert len(skipped) - len(forced) == num_skip
        return
    if target.structure == "per_layer":  # each layer one of the target's dtypes, K and V as it stores them
        assert all(engine_dtype_for(target, k, v) is not None or (k, v) == (NONE, NONE) for k, v in sol.choices)
        return
    assert len(set(sol.choices)) == 1, f"{target.name} needs one type for every layer: {sol.choices}"
    k, v = sol.choices[0]
    if target.structure == "global":
        assert k == v
        d = engine_dtype_for(target, k)
        assert d is not None and sol.engine.kv_cache_dtype == d.flag_value
    else:
        assert sol.engine.cache_type_k == next(d.flag_value for d in target.dtypes if d.k_scheme == k)
        assert sol.engine.cache_type_v == next(d.flag_value for d in target.dtypes if d.v_scheme == v)


def check_against_brute_force(problem, target, budget, num_skip=None):
    best, min_cost = brute_force(problem, target, budget, num_skip)
    limit = budget.limit(problem.layers)
    if best is None:
        with pytest.raises(SensprofError, match="infeasible"):
            plan(problem, target, budget, num_skip)
        return None
    sol = plan(problem, target, budget, num_skip)
    assert sol.status == "Optimal"
    check_structure(problem, target, sol, num_skip)
    # the solution's own numbers are those of its choices
    assert sol.damage == pytest.approx(assignment_damage(problem, sol.choices), rel=1e-9, abs=1e-15)
    assert sol.cost == pytest.approx(assignment_cost(budget, problem.layers, sol.choices), rel=1e-9)
    assert sol.limit == pytest.approx(limit, rel=1e-12)
    assert sol.cost <= limit * (1 + 1e-7), "the plan exceeds the budget"
    assert sol.damage == pytest.approx(best, rel=REL, abs=1e-12), (
        f"{target.name}: ILP damage {sol.damage} but brute force finds {best}")
    return sol


# --------------------------------------------------------------------------- optimality vs brute force

FREE_K = ["int8_per_token_head", "int4_c32", "int2_c32", "q4_0"]
FREE_V = ["int8_per_token_head", "int4_t32", "int2_t32"]
VLLM_SCHEMES = ["fp8_e4m3", "fp8_e4m3_cal", "int8_per_token_head", "int4_per_token_head", "int2_c32"]
SGLANG_SCHEMES = ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_cal", "int4_t32"]
LLAMA_K = ["llamacpp_q8_0.K", "llamacpp_q5_1.K", "llamacpp_q4_0.K", "int2_c32"]  # llama.cpp's rotated keys
LLAMA_V = ["llamacpp_q8_0.V", "llamacpp_q5_0.V", "llamacpp_q4_1.V"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_free_target_is_optimal(seed, kind):
    rng = random.Random(1000 + seed)
    problem = random_problem(rng, rng.choice([2, 3]), FREE_K[:rng.choice([2, 3])], FREE_V[:rng.choice([2, 3])],
                             negative=seed == 3)
    for _ in range(3):
        check_against_brute_force(problem, TARGETS["sensprof"], budget_between(rng, problem, TARGETS["sensprof"], kind))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_vllm_target_is_optimal(seed, kind):
    rng = random.Random(2000 + seed)
    target = VLLM
    problem = random_problem(rng, rng.choice([2, 3, 4]), VLLM_SCHEMES, VLLM_SCHEMES)
    for _ in range(3):
        check_against_brute_force(problem, target, budget_between(rng, problem, target, kind))


@pytest.mark.parametrize("seed", range(4))
def test_vllm_target_with_fixed_num_skip_is_optimal(seed):
    rng = random.Random(3000 + seed)
    target = VLLM
    n = rng.choice([3, 4])
    problem = random_problem(rng, n, VLLM_SCHEMES[:4], VLLM_SCHEMES[:4])
    for num_skip in range(n + 1):
        kind = rng.choice(KINDS)
        sol = check_against_brute_force(problem, target, budget_between(rng, problem, target, kind, num_skip),
                                        num_skip)
        if sol is not None:
            assert len(sol.engine.skip_layers) == num_skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_sglang_target_is_optimal(seed, kind):
    rng = random.Random(4000 + seed)
    target = TARGETS["sglang"]
    problem = random_problem(rng, rng.choice([2, 3, 4]), SGLANG_SCHEMES, SGLANG_SCHEMES)
    for _ in range(3):
        check_against_brute_force(problem, target, budget_between(rng, problem, target, kind))


def test_sglang_picks_auto_when_the_budget_allows_the_full_cache():
    rng = random.Random(7)
    problem = random_problem(rng, 3, SGLANG_SCHEMES, SGLANG_SCHEMES)
    sol = plan(problem, TARGETS["sglang"], Budget("avg_bits", 16))
    assert sol.choices == [(NONE, NONE)] * 3
    assert sol.engine.kv_cache_dtype == "auto"
    assert sol.damage == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_llamacpp_target_is_optimal(seed, kind):
    rng = random.Random(5000 + seed)
    target = TARGETS["llamacpp"]
    problem = random_problem(rng, rng.choice([2, 3, 4]), LLAMA_K, LLAMA_V)
    for _ in range(3):
        check_against_brute_force(problem, target, budget_between(rng, problem, target, kind))


def test_llamacpp_k_and_v_types_may_differ():
    """Cheap keys are harmless, values are sensitive: the optimum is -ctk q4_0 -ctv q8_0."""
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 3
    damage = {}
    for i in range(3):
        damage.update({(i, "K", "llamacpp_q8_0.K"): 0.001, (i, "K", "llamacpp_q4_0.K"): 0.002,
                       (i, "V", "llamacpp_q8_0.V"): 0.001, (i, "V", "llamacpp_q4_0.V"): 1.0})
    problem = Problem(layers, damage, {"K": ["llamacpp_q8_0.K", "llamacpp_q4_0.K"],
                                       "V": ["llamacpp_q8_0.V", "llamacpp_q4_0.V"]})
    budget = Budget("avg_bits", (4.5 + 8.5) / 2)  # q4_0 = 4.5, q8_0 = 8.5 bits at head_dim 64
    sol = plan(problem, TARGETS["llamacpp"], budget)
    assert sol.choices == [("llamacpp_q4_0.K", "llamacpp_q8_0.V")] * 3
    assert (sol.engine.cache_type_k, sol.engine.cache_type_v) == ("q4_0", "q8_0")


def test_vllm_skips_the_most_damaged_layers():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 4
    dmg = [0.01, 0.5, 0.02, 0.3]
    damage = {(i, t, "fp8_e4m3"): dmg[i] for i in range(4) for t in "KV"}
    problem = Problem(layers, damage, {"K": ["fp8_e4m3"], "V": ["fp8_e4m3"]})
    sol = plan(problem, VLLM, Budget("avg_bits", 12))  # fp8 8 bits: two of four layers kept at 16
    assert list(sol.engine.skip_layers) == [1, 3]
    assert sol.choices == [("fp8_e4m3", "fp8_e4m3"), (NONE, NONE), ("fp8_e4m3", "fp8_e4m3"), (NONE, NONE)]
    assert sol.damage == pytest.approx(2 * (0.01 + 0.02))
    sol = plan(problem, VLLM, Budget("avg_bits", 12), num_skip=1)
    assert list(sol.engine.skip_layers) == [1]


# --------------------------------------------------------------------------- infeasible budgets


def _smallest_in_message(msg: str, flag: str) -> float:
    m = re.search(r"smallest feasible budget.*?" + re.escape(flag) + r" ([0-9.e+-]+)", msg)
    assert m, f"no smallest feasible budget in {msg!r}"
    return float(m.group(1))


@pytest.mark.parametrize("target_name,k,v,flag,kind,value,expect", [
    # the cheapest allowed choice: int2_c32 keys and int2_t32 values, 3 bits each at head_dim 64
    ("sensprof", ["int4_c32", "int2_c32"], ["int4_t32", "int2_t32"], "--avg-bits", "avg_bits", 2.0, 3.0),
    ("sensprof", ["int4_c32", "int2_c32"], ["int4_t32", "int2_t32"], "--fraction", "fraction", 0.1, 3 / 16),
    # vllm: int4_per_token_head everywhere (4.5 bits), nothing skipped
    ("vllm", VLLM_SCHEMES, VLLM_SCHEMES, "--avg-bits", "avg_bits", 4.0, 4.5),
    # vllm with two of four layers forced to 16 bits: (2*16 + 2*4.5) / 4
    ("vllm", VLLM_SCHEMES, VLLM_SCHEMES, "--avg-bits", "avg_bits", 4.0, 10.25),
    # sglang: fp8 everywhere
    ("sglang", SGLANG_SCHEMES, SGLANG_SCHEMES, "--avg-bits", "avg_bits", 6.0, 8.0),
    # llamacpp: q4_0 keys (4.5) and q4_1 values (5.0)
    ("llamacpp", LLAMA_K, LLAMA_V, "--fraction", "fraction", 0.2, 4.75 / 16),
])
def test_infeasible_budget_names_the_smallest_feasible_one(target_name, k, v, flag, kind, value, expect):
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 4
    rng = random.Random(11)
    damage = {(i, t, s): rng.random() for i in range(4) for t, names in (("K", k), ("V", v)) for s in names}
    problem = Problem(layers, damage, {"K": list(k), "V": list(v)})
    num_skip = 2 if expect == 10.25 else None
    target = VLLM if target_name == "vllm" else TARGETS[target_name]
    with pytest.raises(SensprofError, match="infeasible") as e:
        plan(problem, target, Budget(kind, value), num_skip)
    msg = str(e.value)
    assert "\n" not in msg
    smallest = _smallest_in_message(msg, flag)
    assert smallest == pytest.approx(expect, rel=1e-4)
    # the brute-force minimum agrees with the message
    _, min_cost = brute_force(problem, target, Budget(kind, value), num_skip)
    unit = Budget(kind, 1.0).limit(layers)
    assert min_cost / unit == pytest.approx(smallest, rel=1e-3)
    # and that budget, fed back, is feasible and spends (nearly) all of it
    sol = plan(problem, target, Budget(kind, smallest), num_skip)
    assert sol.cost <= sol.limit * (1 + 1e-9)
    assert sol.cost == pytest.approx(min_cost)


def test_serving_infeasible_message_is_in_gib():
    layers = [{"kv_heads": 8, "head_dim": 128, "kind": "full", "window": None}] * 2
    damage = {(i, t, "fp8_e4m3"): 0.1 for i in range(2) for t in "KV"}
    problem = Problem(layers, damage, {"K": ["fp8_e4m3"], "V": ["fp8_e4m3"]})
    # fp8 everywhere: 2 layers x K,V x 8 heads x 128 x 1 byte x 65536 tokens x 4 seqs = 1 GiB exactly
    budget = Budget("serving", 0.5, max_model_len=65536, max_num_seqs=4)
    with pytest.raises(SensprofError, match="infeasible") as e:
        plan(problem, VLLM, budget)
    assert _smallest_in_message(str(e.value), "--gpu-mem-gib") == pytest.approx(1.0)
    sol = plan(problem, VLLM, Budget("serving", 1.0, max_model_len=65536, max_num_seqs=4))
    assert sol.cost == pytest.approx(GIB)


def test_recommended_smallest_budget_is_feasible_when_it_is_not_round():
    # head_dim 64 and 128: int4_per_token_head is 4.5 and 4.25 bits; the average is 4.3333...
    layers = [{"kv_heads": 1, "head_dim": 64, "kind": "full", "window": None},
              {"kv_heads": 1, "head_dim": 128, "kind": "full", "window": None}]
    damage = {(i, t, "int4_per_token_head"): 1.0 for i in range(2) for t in "KV"}
    problem = Problem(layers, damage, {"K": ["int4_per_token_head"], "V": ["int4_per_token_head"]})
    with pytest.raises(SensprofError) as e:
        plan(problem, TARGETS["sensprof"], Budget("avg_bits", 3))
    smallest = _smallest_in_message(str(e.value), "--avg-bits")
    plan(problem, TARGETS["sensprof"], Budget("avg_bits", smallest))  # 4.334: rounded up, so feasible


# --------------------------------------------------------------------------- profile lacks the target's schemes


@pytest.mark.parametrize("target_name", ["vllm", "llamacpp"])
def test_profile_without_the_targets_schemes_is_refused(target_name):
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    damage = {(i, t, s): 0.1 for i in range(2) for t in "KV" for s in ("int2_c32", "int4_t32")}
    problem = Problem(layers, damage, {"K": ["int2_c32", "int4_t32"], "V": ["int2_c32", "int4_t32"]})
    with pytest.raises(SensprofError) as e:
        plan(problem, get_target(target_name), Budget("avg_bits", 16))
    msg = str(e.value)
    assert f"target {target_name} needs" in msg
    assert all(s in msg for s in get_target(target_name).schemes_needed()), msg
    assert "int2_c32" in msg and f"sensprof profile --target {target_name}" in msg


def test_sglang_profile_without_fp8_schemes_is_refused():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    damage = {(i, t, s): 0.1 for i in range(2) for t in "KV" for s in ("int2_c32", "int4_t32")}
    problem = Problem(layers, damage, {"K": ["int2_c32", "int4_t32"], "V": ["int2_c32", "int4_t32"]})
    with pytest.raises(SensprofError, match="target sglang needs"):
        plan(problem, TARGETS["sglang"], Budget("avg_bits", 16))


def test_vllm_ignores_schemes_it_cannot_express():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    damage = {(i, t, s): (0.0 if s == "int2_c32" else 0.5) for i in range(2) for t in "KV"
              for s in ("int2_c32", "fp8_e4m3")}
    problem = Problem(layers, damage, {"K": ["int2_c32", "fp8_e4m3"], "V": ["int2_c32", "fp8_e4m3"]})
    sol = plan(problem, VLLM, Budget("avg_bits", 8))
    assert sol.choices == [("fp8_e4m3", "fp8_e4m3")] * 2


# --------------------------------------------------------------------------- serving budgets and sliding windows


def test_serving_cost_counts_sliding_layers_at_their_window():
    sliding = {"kv_heads": 2, "head_dim": 64, "kind": "sliding", "window": 1024}
    full = {"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}
    none, fp8 = get_scheme("none"), get_scheme("fp8_e4m3")
    long = Budget("serving", 1.0, max_model_len=32768, max_num_seqs=4)
    # bytes = seqs x tokens x kv_heads x head_dim x bits / 8
    assert long.cost(none, full) == 4 * 32768 * 2 * 64 * 16 / 8
    assert long.cost(none, sliding) == 4 * 1024 * 2 * 64 * 16 / 8
    assert long.cost(fp8, sliding) == 4 * 1024 * 2 * 64 * 8 / 8
    assert long.cost(none, sliding) < long.cost(none, full)
    short = Budget("serving", 1.0, max_model_len=512, max_num_seqs=4)  # shorter than the window
    assert short.cost(none, sliding) == short.cost(none, full) == 4 * 512 * 2 * 64 * 16 / 8
    assert long.limit([full, sliding]) == GIB
    # the bits-per-element budgets do not depend on tokens
    avg = Budget("avg_bits", 4)
    assert avg.cost(none, sliding) == avg.cost(none, full) == 16 * 2 * 64


@pytest.mark.parametrize("sliding_index", [0, 1])
def test_serving_budget_makes_skipping_a_sliding_layer_cheap(sliding_index):
    """The full layer is more damaged, yet at a long max_model_len only skipping the sliding layer fits."""
    sliding = {"kv_heads": 2, "head_dim": 64, "kind": "sliding", "window": 256}
    full = {"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}
    layers = [sliding, full] if sliding_index == 0 else [full, sliding]
    full_index = 1 - sliding_index
    damage = {(sliding_index, t, "fp8_e4m3"): 0.1 for t in "KV"}
    damage.update({(full_index, t, "fp8_e4m3"): 1.0 for t in "KV"})
    problem = Problem(layers, damage, {"K": ["fp8_e4m3"], "V": ["fp8_e4m3"]})
    per_tok16 = 2 * 64 * 2  # bytes per token per tensor at 16 bits
    skip_sliding = 2 * (256 * per_tok16 + 8192 * per_tok16 // 2)
    skip_full = 2 * (256 * per_tok16 // 2 + 8192 * per_tok16)
    assert skip_sliding < skip_full
    budget = Budget("serving", skip_sliding * 1.01 / GIB, max_model_len=8192, max_num_seqs=1)
    sol = plan(problem, VLLM, budget)
    assert list(sol.engine.skip_layers) == [sliding_index]
    assert sol.cost == pytest.approx(skip_sliding)
    # the same tightness as an average-bits budget (which ignores windows) skips the more damaged full layer
    sol = plan(problem, VLLM, Budget("avg_bits", 12))
    assert list(sol.engine.skip_layers) == [full_index]
    # a little less memory: nothing can be skipped
    budget = Budget("serving", skip_sliding * 0.99 / GIB, max_model_len=8192, max_num_seqs=1)
    assert list(plan(problem, VLLM, budget).engine.skip_layers) == []


def test_serving_cost_matches_layer_cache_bits_with_residual_tokens():
    layer = {"kv_heads": 4, "head_dim": 128, "kind": "sliding", "window": 2048}
    b = Budget("serving", 2.0, max_model_len=4096, max_num_seqs=2)
    s = get_scheme("int4_c32_r128")
    assert b.cost(s, layer) == 2 * layer_cache_bits(s, 2048, 4, 128) / 8


def test_context_len_prices_what_a_cache_of_that_length_holds():
    full = {"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}
    sliding = {"kv_heads": 2, "head_dim": 64, "kind": "sliding", "window": 256}
    long, at = Budget("avg_bits", 4), Budget("avg_bits", 4, context_len=1024)
    kivi, resid = get_scheme("int4_c32"), get_scheme("int2_c32_r32_s4")
    assert at.cost(kivi, full) == pytest.approx(long.cost(kivi, full))  # 1024 tokens: whole groups, nothing waits
    # 4 sinks + 32 recent + 28 of an incomplete group at 16 bits: 64 of 1024 tokens
    held = (960 * bits_per_element(resid, 64) + 64 * MODEL_BITS) / 1024
    assert at.cost(resid, full) == pytest.approx(held * 128) and at.cost(resid, full) > long.cost(resid, full) + 100
    # a sliding layer holds its window, and weighs what it holds: 256 of the 1024 tokens a full layer holds; of its
    # 256, 4 sinks + 32 recent + 28 of an incomplete group wait at 16 bits, 6 groups of 32 are quantized
    held_window = (192 * bits_per_element(resid, 64) + 64 * MODEL_BITS) / 256
    assert at.cost(resid, sliding) == pytest.approx(held_window * 128 * 256 / 1024)
    assert at.limit([full, sliding]) == pytest.approx(4 * 2 * 128 * (1 + 256 / 1024))
    assert at.limit([full]) == long.limit([full])
    assert at.to_json()["context_len"] == 1024 and "context_len" not in long.to_json()


def test_planning_at_a_context_length_keeps_the_budget_there():
    """Residual windows look free at long context; priced at 512 tokens the plan fits what a 512-token cache holds."""
    rng = random.Random(7)
    ks, vs = ["int2_c32_r32_s4", "int3_c32", "int4_c32"], ["int2_t32", "int3_t32", "int4_t32"]
    problem = random_problem(rng, 6, ks, vs)
    for i in range(6):
        problem.damage[(i, "K", "int2_c32_r32_s4")] = 1e-6  # the residual scheme is the best key at its price
    target = get_target("sensprof")
    at512 = Budget("avg_bits", 1, context_len=512)

    def held(choices):  # what the chosen schemes hold at 512 tokens
        return sum(at512.cost(get_scheme(k), problem.layers[i]) + at512.cost(get_scheme(v), problem.layers[i])
                   for i, (k, v) in enumerate(choices))

    limit = Budget("avg_bits", 3.5, context_len=512).limit(problem.layers)  # 3.5 bits per element held at 512
    long_sol = plan(problem, target, Budget("avg_bits", 3.5))
    assert sum(k == "int2_c32_r32_s4" for k, _ in long_sol.choices) == 6  # priced at 3 bits, the best key everywhere
    assert held(long_sol.choices) > limit * 1.01  # ... but a 512-token cache holds more than the budget
    sol = plan(problem, target, Budget("avg_bits", 3.5, context_len=512))
    assert held(sol.choices) <= limit * (1 + 1e-9)
    assert sol.cost == pytest.approx(held(sol.choices))
    assert sum(k == "int2_c32_r32_s4" for k, _ in sol.choices) < 6


# --------------------------------------------------------------------------- refused input


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="avg_bits", value=0.0), "must be positive"),
    (dict(kind="avg_bits", value=-3.0), "must be positive"),
    (dict(kind="avg_bits", value=float("nan")), "must be positive"),
    (dict(kind="fraction", value=0.0), "must be positive"),
    (dict(kind="fraction", value=1.5), "above 1"),
    (dict(kind="serving", value=-1.0, max_model_len=1024, max_num_seqs=1), "must be positive"),
    (dict(kind="serving", value=4.0), "--max-model-len and --max-num-seqs"),
    (dict(kind="serving", value=4.0, max_model_len=1024), "--max-model-len and --max-num-seqs"),
    (dict(kind="serving", value=4.0, max_model_len=0, max_num_seqs=4), "--max-model-len"),
    (dict(kind="serving", value=4.0, max_model_len=-8, max_num_seqs=4), "must be positive"),
    (dict(kind="serving", value=4.0, max_model_len=1024, max_num_seqs=-1), "must be positive"),
    (dict(kind="avg_bits", value=4.0, context_len=0), "--context-len 0 is not a positive"),
    (dict(kind="serving", value=4.0, max_model_len=1024, max_num_seqs=1, context_len=512), "drop --context-len"),
])
def test_bad_budgets_are_refused(kwargs, match):
    with pytest.raises(SensprofError, match=match):
        Budget(**kwargs)


def test_fraction_of_one_is_the_full_cache():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}]
    assert Budget("fraction", 1.0).limit(layers) == 2 * 2 * 64 * MODEL_BITS


@pytest.mark.parametrize("kwargs", [
    {}, {"avg_bits": 4, "fraction": 0.3}, {"avg_bits": 4, "gpu_mem_gib": 8, "max_model_len": 1, "max_num_seqs": 1},
])
def test_exactly_one_budget_must_be_given(kwargs):
    with pytest.raises(SensprofError, match="exactly one budget"):
        budget_from_args(**kwargs)


def test_budget_from_args_kinds():
    assert budget_from_args(avg_bits=4) == Budget("avg_bits", 4.0)
    assert budget_from_args(fraction=0.25) == Budget("fraction", 0.25)
    assert budget_from_args(gpu_mem_gib=8, max_model_len=4096, max_num_seqs=2) == Budget("serving", 8.0, 4096, 2)
    with pytest.raises(SensprofError, match="--max-model-len"):
        budget_from_args(gpu_mem_gib=8)


@pytest.mark.parametrize("argv,match", [
    (["--avg-bits", "abc"], "invalid float"),
    (["--avg-bits", "-2"], "must be positive"),
    (["--fraction", "2"], "above 1"),
    (["--avg-bits", "4", "--fraction", "0.5"], "exactly one budget"),
    (["--gpu-mem-gib", "8", "--max-model-len", "4096"], "--max-num-seqs"),
    (["--avg-bits", "4", "--target", "tensorrt"], "unknown target"),
    (["--avg-bits", "4", "--context-len", "-5"], "--context-len -5"),
    (["--gpu-mem-gib", "8", "--max-model-len", "4096", "--max-num-seqs", "2", "--context-len", "512"], "drop --context-len"),
])
def test_cli_refuses_bad_budgets_with_one_line(tmp_path, capsys, argv, match):
    from sensprof.cli import main

    rc = main(["plan", str(tmp_path / "no-profile"), *argv])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("sensprof: error:"), err
    assert re.search(match, lines[0]), lines[0]


def test_unknown_target_is_refused():
    with pytest.raises(SensprofError, match="unknown target 'trtllm'.*sensprof, vllm, sglang, llamacpp"):
        get_target("trtllm")
    assert get_target("vllm", "ampere") == VLLM and get_target("vllm").gpu == "hopper"


def _table():
    rows = []
    for layer in range(2):
        for tensor in "KV":
            for s in ("fp8_e4m3", "int4_t32"):
                rows.append({"layer": layer, "layer_kind": "full", "tensor": tensor, "scheme": s, "bits": 8,
                             "kl": 0.1 * (layer + 1), "kl_std": 0.0, "dnll": -0.01 * (layer + 1), "attn_kl": 0.0,
                             "out_rel_l2": 0.3 * (layer + 1)})
    # int2_c32 profiled on layer 0 keys only: not an option (not profiled on every layer)
    rows.append({"layer": 0, "layer_kind": "full", "tensor": "K", "scheme": "int2_c32", "bits": 3,
                 "kl": 1.0, "kl_std": 0.0, "dnll": 0.1, "attn_kl": 0.0, "out_rel_l2": 0.9})
    return pd.DataFrame(rows)


def test_problem_from_table_objectives_and_options():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    p = problem_from_table(_table(), layers, "kl")
    assert p.options == {"K": ["fp8_e4m3", "int4_t32"], "V": ["fp8_e4m3", "int4_t32"]}
    assert p.cell(1, "V", "fp8_e4m3") == pytest.approx(0.2)
    assert p.cell(1, "V", NONE) == 0.0
    assert problem_from_table(_table(), layers, "local").cell(1, "K", "int4_t32") == pytest.approx(0.6)
    assert problem_from_table(_table(), layers, "dnll").cell(0, "K", "int4_t32") == pytest.approx(-0.01)


def test_unknown_objective_is_refused():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    with pytest.raises(SensprofError, match="unknown --objective 'mse'.*kl, dnll, local"):
        problem_from_table(_table(), layers, "mse")


def test_num_skip_is_vllm_only_and_in_range():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 3
    damage = {(i, t, "fp8_e4m3"): 0.1 for i in range(3) for t in "KV"}
    problem = Problem(layers, damage, {"K": ["fp8_e4m3"], "V": ["fp8_e4m3"]})
    for name in ("sensprof", "sglang", "llamacpp"):
        with pytest.raises(SensprofError, match="--num-skip only applies to target vllm"):
            plan(problem, TARGETS[name], Budget("avg_bits", 8), num_skip=1)
    for bad in (-1, 4):
        with pytest.raises(SensprofError, match="out of range"):
            plan(problem, VLLM, Budget("avg_bits", 16), num_skip=bad)
    sol = plan(problem, VLLM, Budget("avg_bits", 16), num_skip=3)
    assert sol.choices == [(NONE, NONE)] * 3 and sol.engine.kv_cache_dtype == "auto"


def test_bits_per_element_of_the_schemes_used_here():
    """The hand-computed expectations above rest on these storage costs."""
    assert bits_per_element(get_scheme("int2_c32"), 64) == 3.0
    assert bits_per_element(get_scheme("int2_t32"), 64) == 3.0
    assert bits_per_element(get_scheme("int4_per_token_head"), 64) == 4.5
    assert bits_per_element(get_scheme("q4_0"), 64) == 4.5
    assert bits_per_element(get_scheme("q4_1"), 64) == 5.0
    assert bits_per_element(get_scheme("q8_0"), 64) == 8.5
    assert bits_per_element(get_scheme("fp8_e4m3"), 64) == 8.0


def test_ample_budget_keeps_every_cell_unquantized_when_damages_span_many_decades():
    rng = random.Random(1)
    schemes = ["fp8_e4m3", "int4_per_token_head", "int4_c32", "int2_t32"]
    layers = [{"kv_heads": 2, "head_dim": 16, "kind": "full", "window": None}] * 3
    damage = {(i, t, s): 10 ** rng.uniform(-11, -2.5) for i in range(3) for t in "KV" for s in schemes}
    problem = Problem(layers, damage, {"K": schemes, "V": schemes})
    best, _ = brute_force(problem, TARGETS["sensprof"], Budget("avg_bits", 16))
    assert best == 0.0
    sol = plan(problem, TARGETS["sensprof"], Budget("avg_bits", 16))
    assert sol.choices == [(NONE, NONE)] * 3, f"damage {sol.damage:.2e}: {sol.choices}"


# --------------------------------------------------------------------------- vLLM dtypes with their own K/V formats


def boundary_target():
    """A vLLM-like target: one dtype with distinct K and V formats whose boundary layers the engine keeps
    (as TurboQuant does), one plain dtype."""
    from sensprof.targets import EngineDtype, Target

    return Target("vllm", "global_skip", (EngineDtype("tq_like", "int4_c32", "int2_t32", boundary_skip=2),
                                          EngineDtype("fp8_e4m3", "fp8_e4m3", "fp8_e4m3")), gpu="hopper")


@pytest.mark.parametrize("seed", range(4))
def test_vllm_boundary_layers_are_kept_and_priced_at_the_model_dtype(seed):
    rng = random.Random(7000 + seed)
    target = boundary_target()
    n = rng.choice([4, 5, 6])
    problem = random_problem(rng, n, ["int4_c32", "fp8_e4m3"], ["int2_t32", "fp8_e4m3"])
    for _ in range(3):
        kind = rng.choice(KINDS)
        sol = check_against_brute_force(problem, target, budget_between(rng, problem, target, kind))
        if sol.engine.kv_cache_dtype == "tq_like":
            assert list(sol.engine.forced_skip_layers) == [0, 1, n - 2, n - 1]


def test_vllm_boundary_dtype_chosen_keeps_its_layers_and_num_skip_counts_the_planners_own():
    target = boundary_target()
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 6
    # tq_like does no damage anywhere; fp8 hurts: the planner picks tq_like and must still keep 0, 1, 4, 5.
    damage = {(i, t, s): (0.0 if s in ("int4_c32", "int2_t32") else 1.0) for i in range(6) for t in "KV"
              for s in ("int4_c32", "int2_t32", "fp8_e4m3")}
    problem = Problem(layers, damage, {"K": ["int4_c32", "fp8_e4m3"], "V": ["int2_t32", "fp8_e4m3"]})
    sol = plan(problem, target, Budget("avg_bits", 14))  # 16 would keep every layer: no damage either
    assert sol.engine.kv_cache_dtype == "tq_like"
    assert list(sol.engine.skip_layers) == [0, 1, 4, 5] == list(sol.engine.forced_skip_layers)
    assert sol.choices[2] == ("int4_c32", "int2_t32") and sol.choices[0] == (NONE, NONE)
    # The four kept layers cost 16 bits per tensor; the two quantized ones 5 (K) and 3 (V) bits: 12 on average.
    expected = (4 * 32 + 2 * (5 + 3)) / 12
    assert sol.cost / Budget("avg_bits", 1).limit(layers) == pytest.approx(expected)
    sol = plan(problem, target, Budget("avg_bits", 16), num_skip=1)
    assert len(sol.engine.skip_layers) == 5 and set(sol.engine.forced_skip_layers) < set(sol.engine.skip_layers)
    # Below 12 bits tq_like cannot fit (its boundary layers alone cost 4 x 32): the planner falls back to fp8.
    sol = plan(problem, target, Budget("avg_bits", 11.5))
    assert sol.engine.kv_cache_dtype == "fp8_e4m3" and list(sol.engine.forced_skip_layers) == []


def test_llamacpp_cuda_default_build_restricts_pairs():
    layers = [{"kv_heads": 2, "head_dim": 64, "kind": "full", "window": None}] * 2
    names = ("q8_0", "q4_0", "q5_1")
    damage = {(i, t, f"llamacpp_{s}.{t}"): {"q8_0": 0.3, "q4_0": 0.5, "q5_1": 0.0}[s]
              for i in range(2) for t in "KV" for s in names}
    problem = Problem(layers, damage, {t: [f"llamacpp_{s}.{t}" for s in names] for t in "KV"})
    sol = plan(problem, get_target("llamacpp"), Budget("avg_bits", 6))
    assert (sol.engine.cache_type_k, sol.engine.cache_type_v) == ("q5_1", "q5_1")
    # A default CUDA build has no q5_1 flash attention: the best pair it runs within 6.5 bits is K q8_0 / V q4_0.
    sol = plan(problem, get_target("llamacpp", llamacpp_build="cuda-default"), Budget("avg_bits", 6.5))
    assert (sol.engine.cache_type_k, sol.engine.cache_type_v) == ("q8_0", "q4_0")
    with pytest.raises(SensprofError, match="unknown --llamacpp-build 'metal'"):
        get_target("llamacpp", llamacpp_build="metal")
    with pytest.raises(SensprofError, match="--vllm-gpu only applies to target vllm"):
        get_target("sglang", vllm_gpu="hopper")
    with pytest.raises(SensprofError, match="unknown --vllm-gpu 'tpu'"):
        get_target("vllm", vllm_gpu="tpu")


def test_an_interrupted_solve_leaves_no_solver_files(tmp_path, monkeypatch):
    """Ctrl-C during CBC's run (here: when PuLP starts it, after it wrote the problem file) leaves nothing in the
    temporary folder; a finished solve leaves nothing either."""
    import subprocess
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    rng = random.Random(7)
    problem = random_problem(rng, 2, FREE_K[:2], FREE_V[:2])
    budget = budget_between(rng, problem, TARGETS["sensprof"], "avg_bits")
    plan(problem, TARGETS["sensprof"], budget)
    assert os.listdir(tmp_path) == []

    def interrupted(*a, **k):
        assert any(f.endswith(".mps") for _, _, fs in os.walk(tmp_path) for f in fs)  # PuLP wrote its files
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plan(problem, TARGETS["sensprof"], budget)
    assert os.listdir(tmp_path) == []


VLLM_CPU_PER_LAYER = get_target("vllm", "cpu", per_layer=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_per_layer_vllm_target_is_optimal(seed, kind):
    """Each layer its own dtype (auto, fp8_e4m3, fp8_e5m2 on vLLM's CPU backend): the solver's plan is the best
    assignment a brute force finds, and its settings say each layer's dtype."""
    rng = random.Random(3000 + seed)
    problem = random_problem(rng, 3, ["fp8_e4m3_rtz", "fp8_e5m2_rtz"], ["fp8_e4m3_rtz", "fp8_e5m2_rtz"])
    for _ in range(2):
        sol = check_against_brute_force(problem, VLLM_CPU_PER_LAYER, budget_between(rng, problem, VLLM_CPU_PER_LAYER,
                                                                                    kind))
        if sol is None:
            continue
        flags = {d.schemes: d.flag_value for d in VLLM_CPU_PER_LAYER.dtypes}
        assert list(sol.engine.layer_dtypes) == [flags[c] for c in sol.choices]
        own = {d for d in sol.engine.layer_dtypes if d != "auto" and not d.startswith("k:")}
        assert sol.engine.kv_cache_dtype in (own or {"auto"})
        if len(own) == 1 and not any(d.startswith("k:") for d in sol.engine.layer_dtypes):
            # expressible without the plugin: the auto layers are the skipped ones
            assert list(sol.engine.skip_layers) == [i for i, d in enumerate(sol.engine.layer_dtypes) if d == "auto"]
        else:
            assert list(sol.engine.skip_layers) == []


@pytest.mark.parametrize("seed", range(3))
def test_per_layer_vllm_target_with_kv_pairs_is_optimal(seed):
    """With KIVI values profiled, each layer may also keep K (auto or fp8) and V (int per-token groups) in their own
    formats, served by the plugin's backend: still the brute force's best, and a pair is named k:<K>/v:<V>."""
    rng = random.Random(3100 + seed)
    problem = random_problem(rng, 3, ["fp8_e4m3_rtz"], ["fp8_e4m3_rtz", "int4_t64", "int2_t32"])
    for layer in problem.layers:  # one attention type: vLLM pads nothing (sliding + full: the test below)
        layer.update(kind="full", window=None)
    flags = {d.schemes: d.flag_value for d in VLLM_CPU_PER_LAYER.dtypes}
    assert flags[("fp8_e4m3_rtz", "int4_t64")] == "k:fp8_e4m3/v:int4_t64" and flags[("none", "int2_t32")] == \
        "k:auto/v:int2_t32"
    seen = set()
    for _ in range(3):
        sol = check_against_brute_force(problem, VLLM_CPU_PER_LAYER, budget_between(rng, problem, VLLM_CPU_PER_LAYER,
                                                                                    "avg_bits"))
        if sol is not None:
            assert list(sol.engine.layer_dtypes) == [flags[c] for c in sol.choices]
            seen |= set(sol.engine.layer_dtypes)
    assert any(d.startswith("k:") for d in seen)


@pytest.mark.parametrize("seed", range(3))
def test_per_layer_plan_of_a_sliding_window_model_pads_nothing(seed):
    """Sliding-window and full layers (Gemma 3): vLLM pads pages that do not divide the largest, and groups narrower
    than the widest (budget.vllm_cpu_pool). The plan is the brute force's best among the assignments vLLM pads
    nothing in, at bf16 and float32 alike, so the pool vLLM allocates is exactly the plan's price."""
    rng = random.Random(3200 + seed)
    problem = random_problem(rng, 4, ["fp8_e4m3_rtz"], ["fp8_e4m3_rtz", "int4_t64", "int2_t32", "int8_t32"])
    for i, layer in enumerate(problem.layers):
        layer.update(kv_heads=2, head_dim=64, kind="full" if i == 2 else "sliding", window=None if i == 2 else 64)
    flags = {d.schemes: d.flag_value for d in VLLM_CPU_PER_LAYER.dtypes}
    limit_unit = make_budget("avg_bits", 1.0).limit(problem.layers)
    padded_optimum = 0
    menu = [d for d in VLLM_CPU_PER_LAYER.dtypes if all(s in (NONE, *problem.options[t]) for s, t in zip(d.schemes, "KV"))]
    for bits in (5.0, 6.5, 8.0, 10.0, 12.0):
        budget = make_budget("avg_bits", bits)
        table = cost_table(budget, problem.layers)
        sol = check_against_brute_force(problem, VLLM_CPU_PER_LAYER, budget)
        if sol is None:
            continue
        layers = [(flags[c], 2, 64, layer["window"]) for c, layer in zip(sol.choices, problem.layers)]
        for itemsize in (2, 4):
            pool = vllm_cpu_pool(layers, itemsize)
            assert not pool.padded and pool.bytes_per_token == pool.own_bytes_per_token
        assert vllm_cpu_pool(layers, 2).own_bytes_per_token * 8 <= bits * limit_unit * (1 + 1e-9)  # the price
        # without the constraint the program would have taken a padded plan of less damage
        unconstrained = min(assignment_damage(problem, [d.schemes for d in c]) for c in itertools.product(menu, repeat=4)
                            if assignment_cost(budget, problem.layers, [d.schemes for d in c], table)
                            <= budget.limit(problem.layers) * (1 + 1e-9))
        padded_optimum += unconstrained < sol.damage - 1e-12
    assert padded_optimum, "the no-padding constraints never bound"


@pytest.mark.parametrize("seed", range(3))
def test_per_layer_vllm_target_on_a_gpu_is_optimal(seed):
    """On an NVIDIA GPU (every layer on TRITON_ATTN through the plugin): each layer auto, fp8_e4m3 (its keys with the
    query cast to fp8) or a per-token-head dtype, the brute force's best; a sliding-window model is refused, since
    vLLM's page unification on CUDA is not checked."""
    hopper = get_target("vllm", "hopper", per_layer=True)
    rng = random.Random(3300 + seed)
    schemes = ["fp8_e4m3", "int8_per_token_head", "int4_per_token_head"]
    problem = random_problem(rng, 3, ["fp8_e4m3_qfp8", *schemes[1:]], schemes)
    for layer in problem.layers:
        layer.update(kind="full", window=None)
    flags = {d.schemes: d.flag_value for d in hopper.dtypes}
    for _ in range(2):
        sol = check_against_brute_force(problem, hopper, budget_between(rng, problem, hopper, "avg_bits"))
        if sol is not None:
            assert list(sol.engine.layer_dtypes) == [flags[c] for c in sol.choices]
            assert sol.engine.vllm_gpu == "hopper"
    problem.layers[0].update(kind="sliding", window=64)
    with pytest.raises(SensprofError, match=r"sliding-window models are served on vLLM's CPU backend only so far, "
                                            r"not on hopper: plan this model with --vllm-gpu cpu --per-layer"):
        plan(problem, hopper, make_budget("avg_bits", 12.0))


def test_keys_in_per_token_groups_take_fp8s_bytes_and_mix_with_it_on_a_sliding_window_model():
    """K int8 in 32-channel groups beside V int6 in 32-channel groups is 9 + 7 bits an element: exactly fp8's bytes,
    so on a sliding-window model, where vLLM pads a layer whose bytes do not divide the largest layer's, that pair
    mixes with fp8 and auto layers; where it measures least damage the plan takes it, and nothing is padded."""
    from sensprof.planning.budget import vllm_layer_bytes

    for head_dim in (64, 256):
        assert vllm_layer_bytes("k:int8_t32/v:int6_t32", 1, head_dim, 2) == vllm_layer_bytes("fp8_e4m3", 1, head_dim, 2)
    problem = random_problem(random.Random(7), 4, ["fp8_e4m3_rtz", "int8_t32"], ["fp8_e4m3_rtz", "int6_t32"])
    for i, layer in enumerate(problem.layers):
        layer.update(kv_heads=2, head_dim=64, kind="full" if i == 2 else "sliding", window=None if i == 2 else 64)
        problem.damage[(i, "K", "int8_t32")] = problem.damage[(i, "K", "fp8_e4m3_rtz")] / 20  # as Gemma 3 measured
    flags = {d.schemes: d.flag_value for d in VLLM_CPU_PER_LAYER.dtypes}
    for bits in (8.0, 10.0, 12.0):
        sol = check_against_brute_force(problem, VLLM_CPU_PER_LAYER, make_budget("avg_bits", bits))
        picked = [flags[c] for c in sol.choices]
        assert "k:int8_t32/v:int6_t32" in picked, (bits, picked)
        for itemsize in (2, 4):
            assert not vllm_cpu_pool([(f, 2, 64, layer["window"]) for f, layer in zip(picked, problem.layers)],
                                     itemsize).padded


def test_per_layer_pairs_fit_the_head_dims():
    """A pair whose value groups do not divide a head dim is not offered; a group wider than the head is the head."""
    flags = {d.flag_value for d in get_target("vllm", "cpu", per_layer=True, head_dims=[48]).dtypes}
    assert "k:auto/v:int4_t32" not in flags and {"k:auto/v:int4_t64", "k:auto/v:int4_t128"} <= flags
    assert "k:fp8_e4m3/v:fp8_e5m2" in flags and "k:fp8_e4m3/v:fp8_e4m3" not in flags  # vLLM's own fp8 is that
    flags = {d.flag_value for d in get_target("vllm", "cpu", per_layer=True, head_dims=[64]).dtypes}
    assert {"k:auto/v:int4_t32", "k:auto/v:int4_t64", "k:fp8_e5m2/v:int3_t128"} <= flags
    # keys in per-token groups too (the same int format on both is a pair; fp8 on both is vLLM's own dtype)
    assert {"k:int8_t32/v:int6_t32", "k:int8_t32/v:int8_t32", "k:int4_t128/v:fp8_e4m3"} <= flags
    flags = {d.flag_value for d in get_target("vllm", "cpu", per_layer=True, head_dims=[48]).dtypes}
    assert "k:int8_t32/v:int6_t64" not in flags and "k:int8_t64/v:int6_t64" in flags
