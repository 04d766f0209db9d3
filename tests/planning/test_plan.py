"""The plan artifact: built from a real profile of a tiny model for every target, saved and loaded back
unchanged, refused when it is not a plan of this format; its predicted storage is memory.py's."""

from __future__ import annotations

import dataclasses

import json
import os

import pytest
import torch
from conftest import VOCAB, make_tiny_model

from sensprof.planning.budget import Budget
from sensprof.planning.plan import make_plan
from sensprof.errors import SensprofError
from sensprof.memory import MODEL_BITS, bits_per_element
from sensprof.artifacts import PLAN_FORMAT_VERSION, PLAN_KIND, EngineSettings, Plan, load_plan
from sensprof.constants import FP8_E4M3_MAX
from sensprof.planning.plan import predicted_summary
from sensprof.profiling.table import OBJECTIVES
from sensprof.profiling.profile import run_profile
from sensprof.schemes import get_scheme, parse_schemes
from sensprof.profiling.table import load_profile
from sensprof.targets import engine_dtype_for, get_target

SCHEMES = ("fp8_e4m3,fp8_e4m3_cal,int8_per_token_head,int4_per_token_head,q8_0,q4_0,q4_1,"
           "llamacpp_q8_0.K,llamacpp_q4_0.K,llamacpp_q4_1.K,llamacpp_q8_0.V,llamacpp_q4_0.V,llamacpp_q4_1.V,"
           "int4_c32,int4_t32,int2_c32,int2_t32")
HEAD_DIM = 32  # tiny gemma3


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory, _one_thread):
    """A complete profile of the tiny gemma3 (layers 0, 1 sliding, 2 full) on fixed random windows."""
    out = tmp_path_factory.mktemp("plan-profile") / "prof"
    model = make_tiny_model("gemma3")
    ids = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    run_profile(model, ids, parse_schemes(SCHEMES), out_dir=str(out), model_id="tiny-gemma3", progress=False,
                extra_meta={"window_slots": [3, 5], "text_files": None})
    return str(out)


@pytest.fixture(scope="module")
def profile(profile_dir):
    return load_profile(profile_dir)


# budget per target, picked so that every target has a real choice to make
BUDGETS = {"sensprof": Budget("avg_bits", 6), "vllm": Budget("avg_bits", 10), "sglang": Budget("avg_bits", 12),
           "llamacpp": Budget("fraction", 0.4)}


@pytest.fixture(scope="module")
def plans(profile_dir):
    return {t: make_plan(profile_dir, t, b) for t, b in BUDGETS.items()}


def _bits(layer):
    return (bits_per_element(get_scheme(layer.k_scheme), layer.head_dim)
            + bits_per_element(get_scheme(layer.v_scheme), layer.head_dim)) / 2


@pytest.mark.parametrize("target", list(BUDGETS))
def test_plan_records_the_profile_and_solution(plans, profile, target):
    plan = plans[target]
    assert plan.kind == PLAN_KIND and plan.format_version == PLAN_FORMAT_VERSION
    assert plan.target == target and plan.objective == "kl"
    assert plan.model_id == "tiny-gemma3"
    assert plan.model_fingerprint == profile.meta["model"]["fingerprint"]
    assert plan.budget == BUDGETS[target]
    assert plan.solver.status == "Optimal"
    assert [p.layer for p in plan.layers] == [0, 1, 2]
    assert [(p.kind, p.window) for p in plan.layers] == [("sliding", 8), ("sliding", 8), ("full", None)]
    assert all(p.kv_heads == 2 and p.head_dim == HEAD_DIM for p in plan.layers)
    table = profile.table
    for p in plan.layers:
        assert p.absmax == profile.calibration[str(p.layer)]
        assert set(p.absmax) >= {"K", "V"}
        for tensor, scheme, dmg in (("K", p.k_scheme, p.k_damage), ("V", p.v_scheme, p.v_damage)):
            if scheme == "none":
                assert dmg == 0.0
            else:
                row = table[(table.layer == p.layer) & (table.tensor == tensor) & (table.scheme == scheme)]
                # the measured KL priced for the target's reads at the serving length (sensprof.planning.pricing)
                scale = plan.predicted.pricing["scales"].get(scheme, 1.0)
                assert dmg == pytest.approx(float(row.kl.iloc[0]) * scale, rel=1e-12)
    assert plan.predicted.damage == pytest.approx(sum(p.k_damage + p.v_damage for p in plan.layers), rel=1e-9)
    assert plan.predicted.budget_used <= plan.predicted.budget_limit * (1 + 1e-9)
    assert plan.profile.window_slots == (3, 5)
    assert plan.profile.settings == profile.meta["settings"]
    assert plan.created


@pytest.mark.parametrize("target", list(BUDGETS))
def test_plan_respects_its_budget_and_target(plans, target):
    plan = plans[target]
    avg = sum(_bits(p) for p in plan.layers) / len(plan.layers)  # every layer has the same size here
    b = BUDGETS[target]
    cap = b.value if b.kind == "avg_bits" else b.value * MODEL_BITS
    assert avg <= cap + 1e-9
    pairs = [(p.k_scheme, p.v_scheme) for p in plan.layers]
    tgt = get_target(target)
    if target == "vllm":
        kept = {c for c in pairs if c != ("none", "none")}
        assert len(kept) == 1
        (k_scheme, v_scheme), = kept
        assert (plan.engine.k_scheme, plan.engine.v_scheme) == (k_scheme, v_scheme)
        assert plan.engine.kv_cache_dtype == engine_dtype_for(tgt, k_scheme, v_scheme).flag_value
        assert list(plan.engine.skip_layers) == [i for i, c in enumerate(pairs) if c == ("none", "none")]
    elif target == "sglang":
        assert len(set(pairs)) == 1 and pairs[0][0] == pairs[0][1]
        assert plan.engine.kv_cache_dtype == engine_dtype_for(tgt, pairs[0][0]).flag_value
    elif target == "llamacpp":
        assert len(set(pairs)) == 1
        assert plan.engine.cache_type_k == next(d.flag_value for d in tgt.dtypes if d.k_scheme == pairs[0][0])
        assert plan.engine.cache_type_v == next(d.flag_value for d in tgt.dtypes if d.v_scheme == pairs[0][1])
    else:
        assert plan.engine == EngineSettings()
        assert plan.predicted.damage > 0  # 6 of 16 bits: quantizing is unavoidable


@pytest.mark.parametrize("target", list(BUDGETS))
def test_predicted_avg_bits_is_memory_bits_per_element(plans, target):
    plan = plans[target]
    expected = sum(_bits(p) for p in plan.layers) / len(plan.layers)
    pred = plan.predicted
    assert pred.avg_bits == pytest.approx(expected, rel=1e-12)
    assert pred.fraction_of_bf16 == pytest.approx(expected / MODEL_BITS, rel=1e-12)
    elems = sum(2 * p.kv_heads * p.head_dim for p in plan.layers)
    assert pred.bf16_bytes_per_token == elems * 2
    assert pred.bytes_per_token == pytest.approx(expected * elems / 8, rel=1e-12)
    assert predicted_summary(plan.layers) == {k: getattr(pred, k) for k in
                                              ("avg_bits", "bytes_per_token", "bf16_bytes_per_token",
                                               "fraction_of_bf16")}


def test_predicted_summary_by_hand():
    from sensprof.artifacts import LayerPlan

    layers = [LayerPlan(0, "full", None, 2, 64, "q4_0", "q8_0", 0.0, 0.0),  # 4.5 and 8.5 bits
              LayerPlan(1, "full", None, 1, 128, "none", "int2_c32", 0.0, 0.0)]  # 16 and 2 + 32/32 bits
    s = predicted_summary(layers)
    bits = (4.5 + 8.5) * 128 + (16 + 3) * 128
    assert s["avg_bits"] == pytest.approx(bits / 512)
    assert s["bytes_per_token"] == pytest.approx(bits / 8)
    assert s["bf16_bytes_per_token"] == 512 * 2


@pytest.mark.parametrize("target", list(BUDGETS))
def test_save_and_load_round_trip(plans, tmp_path, target):
    plan = plans[target]
    path = tmp_path / "sub" / "plan.json"
    plan.save(str(path))
    raw = json.loads(path.read_text())
    assert raw["kind"] == PLAN_KIND and raw["format_version"] == PLAN_FORMAT_VERSION
    again = load_plan(str(path))
    assert again == plan
    assert again.to_json() == plan.to_json()
    assert type(again.layers[0]).__name__ == "LayerPlan"
    assert again.fp8_scale(2, "V") == pytest.approx(max(plan.layers[2].absmax["V"]) / FP8_E4M3_MAX)
    assert not [p for p in tmp_path.joinpath("sub").iterdir() if p.name.startswith(".tmp-")]


def test_larger_budget_never_predicts_more_damage(profile_dir, profile):
    damages = [make_plan(profile_dir, "sensprof", Budget("avg_bits", b)).predicted.damage for b in (4, 6, 10, 16)]
    assert all(a >= b for a, b in zip(damages, damages[1:])), damages
    assert damages[0] > damages[1] > damages[2]
    assert damages[-1] == 0.0  # 16 bits: nothing needs quantizing


def test_objective_changes_the_recorded_damage(profile_dir, profile):
    plan = make_plan(profile_dir, "sensprof", Budget("avg_bits", 6), objective="local")
    assert plan.objective == "local"
    t = profile.table
    for p in plan.layers:
        if p.k_scheme != "none":
            row = t[(t.layer == p.layer) & (t.tensor == "K") & (t.scheme == p.k_scheme)]
            assert p.k_damage == pytest.approx(float(row[OBJECTIVES["local"]].iloc[0]))


def test_infeasible_plan_from_a_real_profile(profile_dir):
    with pytest.raises(SensprofError, match="infeasible for target vllm.*--avg-bits 5"):
        make_plan(profile_dir, "vllm", Budget("avg_bits", 3))  # int4_per_token_head is 5 bits at head_dim 32


def test_describe_and_default_path(plans):
    plan = plans["vllm"]
    text = plan.describe()
    assert "target vllm" in text and f"kv_cache_dtype={plan.engine.kv_cache_dtype}" in text
    assert len(text.splitlines()) == 4 + len(plan.layers)  # + what the engine is predicted to measure (prediction.py)
    assert text.splitlines()[1].startswith("predicted KL ")
    assert "per token slot: sliding-window layers hold less, --context-len N" in text.splitlines()[0]  # hybrid
    assert f" tokens (per-layer sum {plan.predicted.damage:.3e}" in text
    assert plan.default_path() == "plans/tiny-gemma3-vllm-10bits.json"
    assert plans["llamacpp"].default_path() == "plans/tiny-gemma3-llamacpp-0.4frac.json"


def test_plan_at_a_context_length(profile_dir, tmp_path):
    """Priced at 80 tokens, the residual windows and incomplete groups an 80-token cache holds are paid for."""
    from sensprof.planning.plan import held_avg_bits

    plan = make_plan(profile_dir, "sensprof", Budget("avg_bits", 6, context_len=80))
    p = plan.predicted
    assert p.context_len == 80 and p.avg_bits_at_context == pytest.approx(held_avg_bits(plan.layers, 80))
    assert p.avg_bits_at_context <= 6 + 1e-9
    # its sliding layers hold 8 of the 80 tokens, so bits there are cheap: the plan spends more bits per token slot
    # than 6 (the long-context average), and still holds no more than 6 bits per element at 80 tokens
    assert p.avg_bits > 6
    assert plan.budget.context_len == 80 and plan.default_path() == "plans/tiny-gemma3-sensprof-6bits-at80.json"
    assert "held at 80 tokens" in plan.describe()
    assert p.pricing["context_len"] == 80 and p.pricing["reads"] == "streaming"  # its damage is priced there too
    path = tmp_path / "p.json"
    plan.save(str(path))
    assert load_plan(str(path)).budget == plan.budget
    # int4_c32 keys on the full layer: 40 tokens = one group of 32 quantized, 8 waiting at 16 bits; on a sliding
    # layer (window 8) no group ever completes
    full = plan.layers[2]
    assert full.kind == "full" and plan.layers[0].kind == "sliding" and plan.layers[0].window == 8
    k = bits_per_element(get_scheme("int4_c32"), HEAD_DIM)
    one = [dataclasses.replace(full, k_scheme="int4_c32", v_scheme="none")]
    assert held_avg_bits(one, 40) == pytest.approx(((32 * k + 8 * 16) / 40 + 16) / 2)
    assert held_avg_bits([dataclasses.replace(plan.layers[0], k_scheme="int4_c32", v_scheme="none")], 40) == 16


def test_a_budget_at_a_length_weighs_each_layer_by_the_tokens_it_holds():
    """On a hybrid model a sliding-window layer holds only its window: bits there cost less memory than on a full
    layer, and an average per element held (what --avg-bits B --context-len N caps) must say so, or a plan that
    moves bits onto the full layers stores more bytes than the uniform setting of the same average."""
    from sensprof.memory import layer_cache_bits
    from sensprof.planning.plan import held_avg_bits
    from types import SimpleNamespace

    layers = [{"index": 0, "kind": "sliding", "window": 256, "kv_heads": 1, "head_dim": 64},
              {"index": 1, "kind": "full", "window": None, "kv_heads": 1, "head_dim": 64}]
    budget = Budget("avg_bits", 4.0, context_len=1024)

    def held_bytes(pairs):
        return sum(layer_cache_bits(get_scheme(s), 256 if l["kind"] == "sliding" else 1024, 1, 64)
                   for (k, v), l in zip(pairs, layers) for s in (k, v)) / 8

    uniform = [("int4_c64", "int3_t64")] * 2
    to_full = [("int2_c64", "int3_t64"), ("int6_c64", "int3_t64")]  # the same bits a slot, moved to the full layer
    for pairs in (uniform, to_full):  # the budget's cost and held_avg_bits are the bytes held, in its unit
        cost = budget.layers_cost(pairs, layers)
        assert cost == pytest.approx(held_bytes(pairs) * 8 / 1024)
        shaped = [SimpleNamespace(k_scheme=k, v_scheme=v, **l) for (k, v), l in zip(pairs, layers)]
        assert held_avg_bits(shaped, 1024) == pytest.approx(cost / budget.elements(layers))
    assert Budget("avg_bits", 4.0).layers_cost(to_full, layers) == Budget("avg_bits", 4.0).layers_cost(uniform, layers)
    assert held_bytes(to_full) > held_bytes(uniform) and budget.layers_cost(to_full, layers) > \
        budget.layers_cost(uniform, layers)
    assert budget.elements(layers) == pytest.approx(2 * 64 * (256 / 1024 + 1))
    assert budget.describe(budget.layers_cost(uniform, layers), layers) == "--avg-bits 4"


# --------------------------------------------------------------------------- refused files


def _write(tmp_path, obj, name="plan.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


@pytest.fixture
def plan_json(plans):
    return plans["sensprof"].to_json()


@pytest.mark.parametrize("version", [0, 3, "1", None, True])
def test_other_format_version_is_refused(tmp_path, plan_json, version):
    plan_json["format_version"] = version
    with pytest.raises(SensprofError, match=r"plan format version .*this sensprof reads versions 1 and 2.*sensprof plan"):
        load_plan(_write(tmp_path, plan_json))


def test_a_version_1_plan_is_read(tmp_path, plans, profile_dir):
    """Version 1: the profile path absolute, no profile fingerprint; read as the same plan."""
    plan = plans["vllm"]
    old = plan.to_json() | {"format_version": 1}
    old["profile"] = {k: v for k, v in old["profile"].items() if k != "fingerprint"} | {
        "path": os.path.abspath(profile_dir)}
    again = load_plan(_write(tmp_path, old))
    assert again.layers == plan.layers and again.engine == plan.engine and again.predicted == plan.predicted
    assert again.profile.fingerprint == plan.model_fingerprint and again.profile.locate() == os.path.abspath(profile_dir)


def test_the_profile_path_is_stored_relative_to_the_plan(tmp_path, plans, profile_dir):
    """A plan moved together with its profile still finds it; an absolute path is never written."""
    import shutil

    home = tmp_path / "project"
    shutil.copytree(profile_dir, home / "profiles" / "p")
    plan = plans["sensprof"].replace(profile=dataclasses.replace(plans["sensprof"].profile,
                                                                 path=str(home / "profiles" / "p")))
    plan.save(str(home / "plans" / "x.json"))
    stored = json.loads((home / "plans" / "x.json").read_text())["profile"]["path"]
    assert stored == os.path.join("..", "profiles", "p")
    moved = tmp_path / "elsewhere"
    shutil.move(str(home), str(moved))
    again = load_plan(str(moved / "plans" / "x.json"))
    assert again.profile.locate() == os.path.normpath(str(moved / "profiles" / "p"))


def test_missing_format_version_is_refused(tmp_path, plan_json):
    del plan_json["format_version"]
    with pytest.raises(SensprofError, match="format version None"):
        load_plan(_write(tmp_path, plan_json))


@pytest.mark.parametrize("kind", ["sensprof-profile", None, ""])
def test_wrong_kind_is_refused(tmp_path, plan_json, kind):
    plan_json["kind"] = kind
    with pytest.raises(SensprofError, match="is not a sensprof plan"):
        load_plan(_write(tmp_path, plan_json))


def test_profile_meta_is_not_a_plan(profile_dir):
    with pytest.raises(SensprofError, match="is not a sensprof plan"):
        load_plan(f"{profile_dir}/meta.json")


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2, 3]", "\"plan\"", "null"])
def test_malformed_json_is_refused(tmp_path, text):
    with pytest.raises(SensprofError) as e:
        load_plan(_write(tmp_path, text))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mutate", [
    lambda o: o.pop("layers"),
    lambda o: o.pop("engine"),
    lambda o: o["layers"][0].pop("k_scheme"),
    lambda o: o["layers"][0].update(extra_field=1),
    lambda o: o.update(layers=[1, 2]),
    lambda o: o.update(layers=None),
    lambda o: o.update(unexpected=True),
])
def test_malformed_plan_is_refused(tmp_path, plan_json, mutate):
    mutate(plan_json)
    with pytest.raises(SensprofError, match="malformed plan"):
        load_plan(_write(tmp_path, plan_json))


def test_missing_plan_file_is_refused(tmp_path):
    with pytest.raises(SensprofError, match="does not exist"):
        load_plan(str(tmp_path / "nope.json"))
    with pytest.raises(SensprofError, match="is a folder, not a plan file"):
        load_plan(str(tmp_path))  # a directory: said so, not "does not exist" (issue 24)


def test_plan_from_json_rejects_non_dict():
    with pytest.raises(SensprofError, match="not a sensprof plan"):
        Plan.from_json([1, 2])


def test_every_example_plan_loads_and_reads():
    """The plans shipped in plans/ (and the benchmark results') load with this code and describe themselves: a change
    to the plan's fields that old files cannot satisfy fails here."""
    import glob

    root = os.path.join(os.path.dirname(__file__), "..", "..")

    def is_plan(path):  # results also hold benchmark JSON (GPU timings, kernel checks): every plan names its kind
        with open(path) as f:
            obj = json.load(f)
        return isinstance(obj, dict) and obj.get("kind") == PLAN_KIND

    results = [p for p in glob.glob(os.path.join(root, "benchmarks", "results", "*", "*.json")) if is_plan(p)]
    paths = sorted(glob.glob(os.path.join(root, "plans", "*.json")) + results)
    assert len(paths) >= 10 and results
    for path in paths:
        plan = load_plan(path)
        text = plan.describe()
        assert text.startswith(f"plan for {plan.model_id} -> target {plan.target}"), path
        if plan.predicted.joint_factor:
            for n in plan.predicted.joint_factor:
                assert plan.predicted.joint_factor_at(int(n)) == plan.predicted.joint_factor[n]


def test_predicted_advantage_benchmark_never_finds_a_uniform_the_planner_missed(profile_dir, tmp_path):
    """benchmarks/predicted_advantage.py: with the plan priced at the length it compares at, every uniform
    configuration of no more memory is one the planner could have chosen, so none is predicted lower."""
    import subprocess
    import sys

    import pandas as pd

    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "predicted_advantage.py")
    out = tmp_path / "advantage.csv"
    run = subprocess.run([sys.executable, script, profile_dir, "--avg-bits", "3,5,6", "--length", "256",
                          "--context-len", "256", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    df = pd.read_csv(out)
    assert list(df.budget) == [3, 5, 6]
    assert (df.best_uniform_avg_bits <= df.plan_avg_bits + 1e-9).all()
    assert (df.plan_predicted_kl <= df.best_uniform_predicted_kl * (1 + 1e-9)).all()
    assert (df.predicted_plan_over_uniform - df.plan_predicted_kl / df.best_uniform_predicted_kl).abs().max() < 1e-3
    assert df.predicted_plan_over_uniform.iloc[-1] < 1  # 6 bits leaves room to spend bits where they pay
