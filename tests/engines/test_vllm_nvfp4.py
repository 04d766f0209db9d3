"""sensprof's nvfp4 / nvfp4_4over6 emulation.

``nvfp4`` is compared with vLLM 0.33's own NVFP4 PyTorch reference (fixtures from
tools/vllm_golden/nvfp4.py: ``ref_nvfp4_quant``); vLLM's KV writer kernels are CUDA /
FlashInfer only. ``nvfp4_4over6`` has no CPU-runnable vLLM code: it is checked against a
slow re-derivation of the rule in ``config/cache.py`` written here.
"""

from pathlib import Path

import pytest
import torch

from sensprof.engines.vllm import nvfp4 as nv

FIX = Path(__file__).resolve().parents[1] / "data" / "vllm" / "nvfp4.pt"
DATA = torch.load(FIX, weights_only=False)
DIMS = sorted(DATA["dims"])
CASES = [(d, s, side) for d in DIMS for s in (1.0, 0.0625) for side in ("K", "V")]


@pytest.mark.parametrize("d,kv_scale,side", CASES)
def test_codes_scales_and_dequant_match_vllm_reference(d, kv_scale, side):
    f = DATA["dims"][d]
    x = f["key" if side == "K" else "value"]
    ref = f["cases"][kv_scale][side]
    data, scales = nv.quantize_nvfp4(x, kv_scale)
    assert data.dtype == torch.uint8 and data.shape[-1] == d // 2
    assert torch.equal(scales.view(torch.uint8), ref["block_scales"].view(torch.uint8))
    c = data.to(torch.int64)
    bits = torch.stack([c & 0xF, c >> 4], -1).reshape(*data.shape[:-1], d)
    vals = nv._values(bits)
    assert torch.equal(vals, ref["fp4_values"])
    assert torch.equal(torch.signbit(vals), torch.signbit(ref["fp4_values"]))
    torch.testing.assert_close(nv.dequantize_nvfp4(data, scales, kv_scale), ref["deq"], rtol=1e-6, atol=0)
    torch.testing.assert_close(nv.nvfp4(x, kv_scale), ref["deq"], rtol=1e-6, atol=0)


def _slow_e2m1(v: float) -> float:
    """Nearest of the E2M1 grid, ties to the even mantissa (0, 1, 2, 4 are 'even')."""
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    even = {0.0, 1.0, 2.0, 4.0}
    a = min(abs(v), 6.0)
    best = min(grid, key=lambda g: (abs(g - a), g not in even))
    return -best if v < 0 else best


def _slow_block(block: list[float], divisor: float) -> tuple[list[float], float]:
    amax = max(abs(t) for t in block)
    s = float(torch.tensor(min(amax / divisor, 448.0)).to(torch.float8_e4m3fn).float())
    # vLLM multiplies by the fp32 reciprocal of the block scale (ref_nvfp4_quant's
    # output_scale; the CUDA writers use rcp too), so an exact tie can land just above it.
    f32 = torch.float32
    inv = (torch.tensor(1.0, dtype=f32) / torch.tensor(s, dtype=f32)) if s else torch.tensor(0.0, dtype=f32)
    return [_slow_e2m1(float(torch.tensor(t, dtype=f32) * inv)) * s for t in block], s


@pytest.mark.parametrize("d", DIMS)
def test_4over6_against_slow_rederivation(d):
    x = DATA["dims"][d]["key"].float()[:, :1]  # [T, 1, D]
    got = nv.nvfp4_4over6(x)
    plain = nv.nvfp4(x)
    picked4 = 0
    for t in range(x.shape[0]):
        row = x[t, 0].tolist()
        for b in range(0, d, 16):
            blk = row[b : b + 16]
            d6, _ = _slow_block(blk, 6.0)
            d4, _ = _slow_block(blk, 4.0)
            e6 = sum((p - q) ** 2 for p, q in zip(d6, blk))
            e4 = sum((p - q) ** 2 for p, q in zip(d4, blk))
            want = d4 if e4 < e6 else d6
            picked4 += e4 < e6
            torch.testing.assert_close(got[t, 0, b : b + 16], torch.tensor(want), rtol=1e-6, atol=1e-7)
    assert picked4 > 0
    err = ((got - x) ** 2).reshape(-1, 16).sum(-1)
    err_plain = ((plain - x) ** 2).reshape(-1, 16).sum(-1)
    assert (err <= err_plain * (1 + 1e-5) + 1e-12).all()


def test_rounding_ties_and_shapes():
    x = torch.zeros(1, 1, 2, 64)
    x[..., :7] = torch.tensor([6.0, 0.25, 0.75, 2.5, -3.5, 5.0, -1.25])  # amax 6 -> block scale 1
    out = nv.nvfp4(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert out[0, 0, 0, :7].tolist() == [6.0, 0.0, 1.0, 2.0, -4.0, 4.0, -1.0]
    assert out[..., 16:].eq(0).all()  # all-zero blocks stay zero (scale 0)


def test_query_and_bytes():
    q = torch.tensor([0.1, 1.0, 3.3, 1000.0])
    assert nv.query_fp8_sm100(q).tolist() == [0.1015625, 1.0, 3.25, 448.0]
    assert nv.bytes_per_token_head(128) == {"K": 72, "V": 72}
    assert nv.bytes_per_token_head(256) == {"K": 144, "V": 144}
    with pytest.raises(ValueError):
        nv.check_head_dim(96)
    assert set(nv.EMULATIONS) == {"vllm.nvfp4", "vllm.nvfp4_4over6"}
