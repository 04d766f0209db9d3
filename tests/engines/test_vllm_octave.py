"""sensprof's Octave emulation vs vLLM 0.33's own PyTorch reference (tools/vllm_golden/octave.py)."""

from pathlib import Path

import pytest
import torch

from sensprof.engines.vllm import octave as oc

FIX = torch.load(Path(__file__).parents[1] / "data" / "vllm" / "octave.pt")
CASES = FIX["cases"]


def _id(c):
    return f"{c['preset']}-d{c['head_dim']}-r{c['rope_dim']}"


def test_signs_match_vllm():
    for n, s in FIX["signs"].items():
        assert torch.equal(oc.signs(n), s)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_slots_bit_exact(case):
    lay = oc.Layout(case["preset"], case["head_dim"], case["rope_dim"])
    assert lay.slot_bytes == case["slot_bytes"]
    k, v = case["k"].float(), case["v"].float()
    assert torch.equal(oc.quantize_slots(k, v, lay), case["slots"])
    # the lower-level codes and fp16 scales are the slot's fields
    kc, ks = oc.quantize_k(k, lay)
    vc, vs = oc.quantize_v(v, lay)
    slots = case["slots"]
    o_s = lay.k_code_bytes + lay.v_code_bytes
    assert torch.equal(kc, slots[..., : lay.k_code_bytes])
    assert torch.equal(vc, slots[..., lay.k_code_bytes : o_s])
    assert ks.dtype == vs.dtype == torch.float16
    assert torch.equal(torch.cat((ks, vs), -1).view(torch.uint8), slots[..., o_s : o_s + 2 * (lay.k_scales + 1)])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_dequantized_match_vllm(case):
    lay = oc.Layout(case["preset"], case["head_dim"], case["rope_dim"])
    kd, vd = oc.dequantize_slots(case["slots"], lay)
    torch.testing.assert_close(kd, case["k_deq"], rtol=0, atol=1e-6)
    torch.testing.assert_close(vd, case["v_deq"], rtol=0, atol=1e-6)
    if "k_rot" in case:
        kr, vr = oc.dequantize_slots(case["slots"], lay, rotated=True)
        assert torch.equal(kr, case["k_rot"]) and torch.equal(vr, case["v_rot"])
    # the codec functions on [B, H, T, D] input, bf16 as the model caches it
    k4 = case["k"].permute(1, 0, 2).unsqueeze(0)
    v4 = case["v"].permute(1, 0, 2).unsqueeze(0)
    if case["rope_dim"] == oc.KERNEL_ROPE_DIM:
        fk, fv = oc.EMULATIONS[f"vllm.{case['preset']}.K"], oc.EMULATIONS[f"vllm.{case['preset']}.V"]
    else:
        fk, fv = oc.emulation(case["preset"], "K", case["rope_dim"]), oc.emulation(case["preset"], "V", case["rope_dim"])
    ek, ev = fk(k4), fv(v4)
    assert ek.dtype == torch.float32 and ek.shape == k4.shape
    torch.testing.assert_close(ek[0].permute(1, 0, 2), case["k_deq"], rtol=0, atol=1e-6)
    torch.testing.assert_close(ev[0].permute(1, 0, 2), case["v_deq"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("idx", range(3))
def test_attention_with_plain_qk_matches_vllm_reference_attention(idx):
    ref = FIX["attention"][idx]
    inp = FIX["attention_inputs"]
    q, k, v = inp["q"].float(), inp["k"].float(), inp["v"].float()
    ek = oc.EMULATIONS[f"vllm.{ref['preset']}.K"](k).repeat_interleave(2, dim=1)
    ev = oc.EMULATIONS[f"vllm.{ref['preset']}.V"](v).repeat_interleave(2, dim=1)
    out = torch.zeros_like(ref["out"])
    for i, klen in enumerate(inp["klen"]):
        s = torch.einsum("hd,thd->ht", q[i], ek[:klen]) * inp["scale"]
        out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), ev[:klen])
    torch.testing.assert_close(out, ref["out"], rtol=1e-5, atol=1e-5)


def test_rotated_query_product_equals_plain_product():
    """vLLM scores q_rot . k_hat_rot; the emulation returns k_hat rotated back, so q . k_emul agrees."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 256, generator=g), torch.randn(7, 256, generator=g)
    for preset in oc.PRESETS:
        lay = oc.Layout(preset, 256, 64)
        kr = oc.dequantize_k(*oc.quantize_k(k, lay), lay, rotated=True)
        qr = oc.rotate(q, oc.k_block(lay))
        torch.testing.assert_close(qr @ kr.T, q @ oc.emulate_k(k, preset).T, rtol=1e-5, atol=1e-4)


def test_slot_sizes_and_support():
    # head 256, rotary 64 (the only shape the ROCm kernels take)
    assert [oc.Layout(p, 256, 64).slot_bytes for p in oc.PRESETS] == [248, 216, 196]
    lay = oc.Layout("octave_k3v4", 256, 64)
    assert (lay.k_code_bytes, lay.k_scales, lay.v_code_bytes, lay.pad_bytes) == (104, 4, 128, 6)
    with pytest.raises(ValueError):
        oc.Layout("octave_k3v4", 96, 64)
    with pytest.raises(ValueError):
        oc.Layout("octave_k3v3_compact", 192, 64)
    assert oc.Layout("octave_k3v3", 192, 64).slot_bytes == 8 * -(-(32 + 48 + 72 + 8) // 8)


def test_pack_layout_loop_rederivation():
    """Bit layout straight from the rocm_octave docstring, one dim at a time."""
    g = torch.Generator().manual_seed(1)
    n = 64
    c4 = torch.randint(0, 16, (n,), generator=g)
    c3 = torch.randint(0, 8, (n,), generator=g)
    b4, b3 = oc.pack(c4, 4).tolist(), oc.pack(c3, 3).tolist()
    for dim in range(n):
        w, j = divmod(dim, 8)
        byte = b4[4 * w + j % 4]
        assert (byte >> (4 * (j // 4))) & 15 == c4[dim]
        w16, r16 = divmod(dim, 16)
        lo = (b3[4 * w16 + r16 % 4] >> (2 * (r16 // 4))) & 3
        w32, r32 = divmod(dim, 32)
        hi = (b3[n // 4 + 4 * w32 + r32 % 4] >> (r32 // 4)) & 1
        assert lo + 4 * hi == c3[dim]
    assert torch.equal(oc.unpack(oc.pack(c3, 3), n, 3), c3) and torch.equal(oc.unpack(oc.pack(c4, 4), n, 4), c4)
