"""The engine checks' configurations (sensprof/validation/engine_checks.py): what each runs in the engine and what the
emulation is given, the deliberately wrong emulations included."""

from __future__ import annotations

from conftest import make_tiny_model
from sensprof.validation.engine_checks import LLAMACPP_PAIRS, llamacpp_runs, uniform_plan, vllm_cpu_runs
from sensprof.models import describe_layers


def test_vllm_cpu_runs_and_their_round_to_nearest_twins():
    model = make_tiny_model("llama")
    n = len(describe_layers(model))
    absmax = [{"k": [1.0], "v": [2.0]} for _ in range(n)]
    runs = vllm_cpu_runs("tiny", model, absmax, skip=(1,))
    assert [r.name for r in runs] == ["engine baseline", "fp8", "fp8 skip", "fp8 cal", "fp8 cal skip", "fp8_e5m2",
                                      "fp8_e5m2 skip"]
    by = {r.name: r for r in runs}
    assert by["fp8 cal skip"].settings == {"kv_cache_dtype": "fp8", "skip_layers": [1], "scaled": True}
    assert [p.k_scheme for p in by["fp8 skip"].layers] == ["fp8_e4m3_rtz", "none"][:n] + ["fp8_e4m3_rtz"] * (n - 2)
    assert by["fp8 cal"].layers[0].absmax == absmax[0]
    wrong = {r.name: r for r in vllm_cpu_runs("tiny", model, absmax, skip=(1,), round_to_nearest=True)}
    for name, run in by.items():  # the engine runs the same configuration; only the emulation's rounding differs
        assert wrong[name].settings == run.settings
        if run.plan is not None:
            assert {p.k_scheme for p in wrong[name].layers} - {"none"} == {
                s.removesuffix("_rtz") for s in {p.k_scheme for p in run.layers} - {"none"}}


def test_llamacpp_runs_and_their_swapped_twins():
    model = make_tiny_model("llama")
    runs = llamacpp_runs("tiny", model)
    assert [r.name for r in runs[2:]] == [f"{k}/{v}" for k, v in LLAMACPP_PAIRS]
    assert runs[1].floor and runs[0].plan is None
    swapped = {r.name: r for r in llamacpp_runs("tiny", model, swap=True)}
    plain = {r.name: r for r in runs}
    for k, v in LLAMACPP_PAIRS:
        name = f"{k}/{v}"
        assert swapped[name].settings == plain[name].settings == {"type_k": k, "type_v": v}
        assert swapped[name].layers[0].v_scheme == plain[f"{v}/{k}"].layers[0].v_scheme


def test_uniform_plan_keeps_the_skipped_layers():
    model = make_tiny_model("llama")
    plan = uniform_plan("tiny", model, "int4_c32", "int4_t32", skip=(0,))
    assert [(p.k_scheme, p.v_scheme) for p in plan.layers][:2] == [("none", "none"), ("int4_c32", "int4_t32")]
