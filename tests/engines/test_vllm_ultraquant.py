"""sensprof's ultraquant_4bit emulation against vLLM 0.33's own kernels (fixtures from
tools/vllm_golden/ultraquant.py: Triton store/dequant under TRITON_INTERPRET=1, PyTorch reference)."""

from pathlib import Path

import pytest
import torch

from sensprof.engines.vllm import ultraquant as uq

FIX = Path(__file__).resolve().parents[1] / "data" / "vllm" / "ultraquant.pt"
DATA = torch.load(FIX, weights_only=False)
DIMS = sorted(DATA["dims"])


def test_constants_match_fixture():
    assert DATA["constant_c"] == uq.C and DATA["group_size"] == uq.GROUP
    assert DIMS == [64, 128, 256]


@pytest.mark.parametrize("d", DIMS)
def test_codes_and_scales_bit_exact_vs_triton_store(d):
    f = DATA["dims"][d]
    kc, ks = uq.quantize_ultraquant(f["key"], rotate=True)
    vc, vs = uq.quantize_ultraquant(f["value"], rotate=False)
    assert torch.equal(kc, f["k_codes"]) and torch.equal(ks, f["k_scales"])
    assert torch.equal(vc, f["v_codes"]) and torch.equal(vs, f["v_scales"])
    assert torch.equal(torch.cat([kc, ks, vc, vs], -1), f["slot"])
    assert f["slot"].shape[-1] == f["slot_size"] == sum(uq.bytes_per_token_head(d).values())


@pytest.mark.parametrize("d", DIMS)
def test_dequant_matches_triton_full_dequant(d):
    f = DATA["dims"][d]
    k_rot = uq.dequantize_ultraquant(f["k_codes"], f["k_scales"])
    v = uq.dequantize_ultraquant(f["v_codes"], f["v_scales"])
    assert torch.equal(k_rot.bfloat16(), f["k_deq_rot"])
    assert torch.equal(v.bfloat16(), f["v_deq"])
    # the emulation hands K back in the input basis: rotating it again recovers the cache view
    k4 = f["key"].permute(1, 0, 2).unsqueeze(0)  # [1, Hk, T, D]
    out = uq.ultraquant_k(k4)
    assert out.dtype == torch.float32 and out.shape == k4.shape
    back = uq.hadamard_rotate(out)[0].permute(1, 0, 2)
    torch.testing.assert_close(back, k_rot, rtol=1e-5, atol=1e-5 * k_rot.abs().max().item())
    torch.testing.assert_close(uq.ultraquant_v(f["value"]), v, rtol=0, atol=0)


@pytest.mark.parametrize("d", DIMS)
def test_attention_matches_vllm_reference(d):
    """q' . K' with the FP8 query haircut and GQA equals reference_ultraquant_attention."""
    f = DATA["dims"][d]
    q = f["query"][0].float()  # [Hq, D]
    k = uq.ultraquant_k(f["key"].transpose(0, 1))  # [Hk, T, D]
    v = uq.ultraquant_v(f["value"].transpose(0, 1))
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    qq = uq.ultraquant_query(q)
    p = torch.softmax(torch.einsum("hd,hnd->hn", qq, k) * f["sm_scale"], -1)
    out = torch.einsum("hn,hnd->hd", p, v)
    ref = f["ref_attn"][0].float()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    # without the FP8 query haircut the match is visibly worse or equal, never better by much
    p0 = torch.softmax(torch.einsum("hd,hnd->hn", q, k) * f["sm_scale"], -1)
    assert (out - ref).abs().max() <= (torch.einsum("hn,hnd->hd", p0, v) - ref).abs().max() + 1e-2


def test_rounding_ties_go_down_and_zero_group():
    # V path (no rotation): amax 6 -> 0.156*6 = 0.936 -> exp 0 -> divisor 1
    x = torch.zeros(32)
    x[:7] = torch.tensor([6.0, 0.25, -0.25, 2.5, -2.5, 5.0, 0.75])
    codes, scales = uq.quantize_ultraquant(x, rotate=False)
    assert scales.tolist() == [127]
    got = uq.dequantize_ultraquant(codes, scales)[:7].tolist()
    assert got == [6.0, 0.0, -0.5, 2.0, -3.0, 4.0, 0.5]
    c0, s0 = uq.quantize_ultraquant(torch.zeros(64), rotate=True)
    assert s0.tolist() == [0, 0] and c0.eq(0).all()


def test_head_dims_and_bytes():
    assert uq.bytes_per_token_head(128) == {"K": 68, "V": 68}
    assert uq.bytes_per_token_head(256) == {"K": 136, "V": 136}
    for bad in (16, 96, 80):
        with pytest.raises(ValueError):
            uq.check_head_dim(bad)
    assert set(uq.EMULATIONS) == {"vllm.ultraquant_4bit.K", "vllm.ultraquant_4bit.V"}
