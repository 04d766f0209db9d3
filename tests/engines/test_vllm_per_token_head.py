"""sensprof's emulation of vLLM 0.33's per-token-head KV dtypes and plain fp8, against fixtures written by vLLM's own
kernels (tools/vllm_golden/per_token_head.py), plus the fp8 query, checked from source."""

from __future__ import annotations

import os

import pytest
import torch

from sensprof.engines.vllm import fp8 as f8
from sensprof.engines.vllm import per_token_head as pth

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "vllm", "per_token_head.pt")
DIMS = (64, 96, 128, 256)


@pytest.fixture(scope="module")
def gold():
    return torch.load(DATA, weights_only=False)


def _bhtd(x):
    """Fixture tensors are vLLM's [tokens, heads, dim]; sensprof's emulations take [batch, heads, tokens, dim]."""
    return x.transpose(0, 1).unsqueeze(0)


def _thd(x):
    return x.squeeze(0).transpose(0, 1)


def test_rht_signs_match_vllm(gold):
    for b, signs in gold["signs"].items():
        assert torch.equal(pth.rht_signs(b), signs)


@pytest.mark.parametrize("d", DIMS)
def test_int4_codes_and_scales_bit_exact(gold, d):
    case = gold[d]
    for t in "kv":
        packed, scale = pth.quantize_int4(case[t])
        assert torch.equal(packed, case["int4"][f"{t}_codes"])
        assert torch.equal(scale.view(torch.int32), case["int4"][f"{t}_scale"].view(torch.int32))


@pytest.mark.parametrize("d", DIMS)
def test_int4_readback_in_input_basis(gold, d):
    case = gold[d]
    for t in "kv":
        got = _thd(pth.int4_per_token_head(_bhtd(case[t])))
        want = case["int4"][f"{t}_read"]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_int4_scores_are_the_rotated_product(gold):
    """q . emulated_k == rht(q) . k_rot_hat / b, the score vLLM's split-dot kernel forms."""
    for d in DIMS:
        k = gold[d]["k"]
        packed, scale = pth.quantize_int4(k)
        k_rot_hat = pth.dequantize_int4_rotated(packed, scale)
        q = torch.randn(7, d, generator=torch.Generator().manual_seed(d))
        b = pth.largest_pow2_divisor(d)
        want = torch.einsum("qd,thd->qth", pth.single_rht(q), k_rot_hat) / b
        got = torch.einsum("qd,thd->qth", q, _thd(pth.int4_per_token_head(_bhtd(k))))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_int4_zero_point_and_scale_floor(gold):
    case = gold[64]
    bits = case["int4"]["k_scale"].view(torch.int32)
    assert ((bits & ~0xF).view(torch.float32)[1, 0] - 1e-6).abs() < 1e-10  # zero head -> floor
    assert (case["int4"]["k_codes"][1, 0] == 0).all()


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("d", DIMS)
def test_int8_fp8_codes_bit_exact(gold, fmt, d):
    case = gold[d]
    for t in "kv":
        codes, scale = pth.quantize_per_token_head(case[t], fmt)
        want = case[fmt][f"{t}_codes"]
        assert codes.dtype == want.dtype
        assert torch.equal(codes.view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(scale, case[fmt][f"{t}_scale"])
        deq = pth.EMULATIONS[f"vllm.{fmt}_per_token_head"](_bhtd(case[t]))
        torch.testing.assert_close(_thd(deq), want.float() * case[fmt][f"{t}_scale"][..., None], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["e4m3", "e4m3_s", "e5m2", "e5m2_s"])
@pytest.mark.parametrize("d", (64, 128, 256))
def test_plain_fp8_is_a_saturating_cast(gold, name, d):
    """vLLM's Triton writer stores a saturating cast of x / scale; for fp8_e5m2 too it writes e4m3fn bits."""
    case = gold[d]
    g = case[f"plain_{name}"]
    for t in "kv":
        got = f8.quantize_fp8(case[t], g[f"{t}_scale"], "e4m3")
        assert torch.equal(got.view(torch.uint8), g[f"{t}_codes"])
    if name.endswith("_s"):  # the small scales push the outlier channels past the fp8 range
        assert (g["k_codes"].view(torch.float8_e4m3fn).float().abs() == 448).any()
    if name == "e4m3":
        assert torch.equal(f8.EMULATIONS["vllm.fp8_e4m3"](case["k"]), g["k_codes"].view(torch.float8_e4m3fn).float())


def test_query_fp8_from_source():
    """Re-derivation of QuantFP8.forward_native (static, per tensor / per KV head), then the kernel's descale."""
    q = torch.randn(2, 8, 3, 64, generator=torch.Generator().manual_seed(3)) * 5
    q[0, 0, 0, :3] = torch.tensor([500.0, -700.0, 1e-4])
    for s in (1.0, 0.05):
        want = (q * (1.0 / torch.tensor(s))).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
        assert torch.equal(f8.quantize_query_fp8(q, s), want)
    per_head = torch.tensor([0.5, 2.0])  # 2 KV heads, 4 query heads each
    got = f8.quantize_query_fp8(q, per_head)
    for h in range(8):
        s = per_head[h // 4]
        assert torch.equal(got[:, h], (q[:, h] * (1 / s)).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s)
    assert f8.EMULATIONS["vllm.query_fp8"] is f8.quantize_query_fp8


def test_fp8_e5m2_from_source():
    """FlashInfer's e5m2 cache: saturating nearest-even cast (csrc ``__nv_cvt_float_to_fp8(x / s, SATFINITE)``)."""
    x = torch.tensor([1.0, 1.125, 1.375, 6.0e4, -1.0e5, 3.0e-6])
    assert f8.fp8_e5m2(x).tolist() == [1.0, 1.0, 1.5, 57344.0, -57344.0, x[5].to(torch.float8_e5m2).float().item()]


def test_int4_beats_naive_symmetric_on_outliers(gold):
    k = _bhtd(gold[128]["k"]).float()
    err = lambda y: ((y - k).norm() / k.norm()).item()  # noqa: E731
    assert err(pth.int4_per_token_head(_bhtd(gold[128]["k"]))) < 0.6 * err(pth.naive_int4_symmetric(k))


def test_registry():
    from sensprof.engines.emulations import get_emulation

    for name in ("int4", "int8", "fp8"):
        assert get_emulation(f"vllm.{name}_per_token_head") is pth.EMULATIONS[f"vllm.{name}_per_token_head"]
    x = torch.randn(1, 2, 3, 64).bfloat16()
    for fn in pth.EMULATIONS.values():
        y = fn(x)
        assert y.dtype == torch.float32 and y.shape == x.shape


def test_int4_hadacore_variant_close(gold):
    """rht="hadacore" (bf16 rotation, the CUDA path) is from source only: it must stay near the exact path."""
    k = _bhtd(gold[128]["k"])
    a, b = pth.int4_per_token_head(k), pth.int4_per_token_head(k, rht="hadacore")
    assert ((a - b).norm() / a.norm()).item() < 0.05
