"""sensprof's TurboQuant emulation vs vLLM 0.33's own Triton kernels (run under the Triton
interpreter by tools/vllm_golden/turboquant.py -> tests/data/vllm/turboquant.pt).

Exception: the interpreter's fp32->fp8e4nv cast is not the GPU's, so k8v4 key bytes are checked
against a slow re-derivation of cvt.rn.satfinite.e4m3 (and fp8e4b15 for pre-sm89) written here.
"""

import math
from pathlib import Path

import pytest
import torch

from sensprof.engines.vllm import turboquant as tq
from sensprof.engines.vllm.turboquant_codebook import centroids, hadamard

FIX = Path(__file__).resolve().parents[1] / "data" / "vllm" / "turboquant.pt"
PRESETS = list(tq.PRESETS)


@pytest.fixture(scope="module")
def gold():
    return torch.load(FIX)


def _cases(gold):
    return [(c, p) for c in gold["cases"] for p in PRESETS]


def _e4m3_loop(x: float) -> int:
    """Nearest e4m3fn value (ties to even code), saturated at 448: cvt.rn.satfinite.e4m3."""
    s = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 448.0)
    best, best_err = 0, None
    for c in range(127):
        e, m = c >> 3, c & 7
        val = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        err = abs(val - a)
        if best_err is None or err < best_err or (err == best_err and c % 2 == 0):
            best, best_err = c, err
    return s | best


def _e4b15_loop(x: float) -> int:
    """Triton fp8e4b15 from fp32: toward-zero fp16, clamp 1.75, nearest with ties away."""
    h = torch.tensor([x], dtype=torch.float32).half().item()
    while abs(h) > abs(x):  # undo RNE rounding away from zero: step fp16 toward zero
        zero = torch.zeros(1, dtype=torch.float16)
        h = torch.nextafter(torch.tensor([h], dtype=torch.float16), zero).item()
    s = 0x80 if math.copysign(1.0, h) < 0 else 0
    a = min(abs(h), 1.75)
    best, best_err = 0, None
    for c in range(127):
        e, m = c >> 3, c & 7
        val = m * 2.0**-17 if e == 0 else (1 + m / 8) * 2.0 ** (e - 15)
        err = abs(val - a)
        if best_err is None or err < best_err or (err == best_err and val > a):
            best, best_err = c, err
    return s | best


def test_centroids_bit_exact(gold):
    for (d, bits), c in gold["centroids"].items():
        assert torch.equal(centroids(d, bits), c), (d, bits)


def test_layout_matches_vllm_config(gold):
    for c, p in _cases(gold):
        lay = tq.slot_layout(p, c["d"])
        assert (lay["key"], lay["value"], lay["slot"], lay["slot_aligned"]) == tuple(c[p]["sizes"])
        assert c[p]["slot"].shape[-1] == lay["slot_aligned"]


def test_store_bytes_bit_exact(gold):
    for c, p in _cases(gold):
        mine = tq.store_slot(c["k"], c["v"], p)
        ref = c[p]["slot"]
        if p == "turboquant_k8v4":
            d = c["d"]
            assert torch.equal(mine[..., d:], ref[..., d:]), (p, d)  # values, scale, zero
        else:
            assert torch.equal(mine, ref), (p, c["d"])


def test_fp8_key_bytes_vs_loop(gold):
    for c in gold["cases"]:
        k = c["k"].float()
        mine = tq.quantize_key_fp8(k)
        loop = torch.tensor([_e4m3_loop(v) for v in k.flatten().tolist()], dtype=torch.uint8)
        assert torch.equal(mine.flatten(), loop)
        # where the interpreter's bytes differ, they are never closer to the input than ours
        interp = tq.dequantize_key_fp8(c["turboquant_k8v4"]["slot"][..., : c["d"]].contiguous())
        ours = tq.dequantize_key_fp8(mine)
        diff = interp != ours
        assert ((ours - k).abs()[diff] <= (interp - k).abs()[diff]).all()
    extreme = torch.tensor([500.0, -1000.0, 464.0, 449.0, 2.0**-10, 3 * 2.0**-11, -0.53125, -7.84])
    got = tq.quantize_key_fp8(extreme)
    assert got.tolist() == [_e4m3_loop(v) for v in extreme.tolist()]


def test_fp8_e4b15_vs_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(300, generator=g) * s for s in (1e-4, 0.05, 1.0, 3.0)])
    x = torch.cat([x, torch.tensor([1.0625, -1.1875, 3 * 2.0**-18, 2.0**-17, 1e6, -0.0])])
    x = x.bfloat16().float()
    mine = tq.quantize_key_fp8_e4b15(x)
    assert mine.tolist() == [_e4b15_loop(v) for v in x.tolist()]
    back = tq.dequantize_key_fp8_e4b15(mine)
    assert back.abs().max() <= 1.75
    assert tq.EMULATIONS_PRE_SM89["vllm.turboquant_k8v4.K"](x[None, None, None]).abs().max() == 1.75


def test_read_path_matches_vllm_dequant(gold):
    """_tq_full_dequant_kv (fp16 out) on vLLM's bytes == our parse of the same bytes."""
    for c, p in _cases(gold):
        k_rot, v = tq.read_slot(c[p]["slot"], p, c["d"], rotated=True)
        assert torch.equal(k_rot.transpose(0, 1).half(), c[p]["k_deq"]), (p, c["d"])
        assert torch.equal(v.transpose(0, 1).half(), c[p]["v_deq"]), (p, c["d"])
        v16 = tq.continuation_read(c["v"].transpose(0, 1), p, "V", torch.float16)
        assert torch.equal(v16.half(), c[p]["v_deq"])


def _attend(q, k, v, gqa):
    d = q.shape[-1]
    k, v = k.repeat_interleave(gqa, 0), v.repeat_interleave(gqa, 0)
    s = (q[:, None, :] * k).sum(-1) / math.sqrt(d)
    return (s.softmax(-1)[..., None] * v).sum(1)


def test_decode_attention_matches_vllm(gold):
    """Plain softmax(q.k) v over the emulated K/V (model basis) == vLLM's decode kernel, which
    rotates q and scores the rotated, norm-corrected key."""
    for c, p in _cases(gold):
        q = c["q"].float()[0]
        ref = c[p]["decode_out"][0].float()
        if p == "turboquant_k8v4":  # attend to the bytes the interpreter stored
            k = tq.read_slot(c[p]["slot"], p, c["d"])[0].transpose(0, 1)
        else:
            k = tq.EMULATIONS[f"vllm.{p}.K"](c["k"].transpose(0, 1)[None])[0]
        v = tq.EMULATIONS[f"vllm.{p}.V"](c["v"].transpose(0, 1)[None])[0]
        out = _attend(q, k, v, gold["GQA"])
        assert (out - ref).abs().max() < 2e-3, (p, c["d"])


def test_rotated_product_equivalence():
    d = 128
    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, 2, 7, d, generator=g).bfloat16()
    q = torch.randn(2, d, generator=g)
    for bits in (3, 4):
        idx, n16 = tq.quantize_key_mse(k, bits)
        k_rot = tq.rotated_key_read(idx, n16, bits, True)[0]
        vllm_scores = torch.einsum("hd,htd->ht", q @ hadamard(d), k_rot)
        mine = torch.einsum("hd,htd->ht", q, tq.EMULATIONS[f"vllm.turboquant_{bits}bit_nc.K"](k)[0])
        assert torch.allclose(mine, vllm_scores, atol=1e-4, rtol=1e-5)
        # norm correction: the rotated key has the stored fp16 norm exactly (up to fp32 error)
        assert torch.allclose(k_rot.norm(dim=-1), n16[0].float(), rtol=1e-5)


def test_emulations_shapes_and_names():
    names = {f"vllm.{p}.{t}" for p in PRESETS for t in "KV"} | {"vllm.turboquant_k8v4_e4b15.K"}
    assert set(tq.EMULATIONS) == names
    assert tq.EMULATIONS["vllm.turboquant_k8v4_e4b15.K"] is tq.EMULATIONS_PRE_SM89["vllm.turboquant_k8v4.K"]
    assert tq.EMULATIONS["vllm.turboquant_k3v4_nc.K"] is tq.EMULATIONS["vllm.turboquant_3bit_nc.K"]
    x = torch.randn(2, 3, 5, 64).half()
    for name, fn in tq.EMULATIONS.items():
        if "e4b15" in name:
            continue  # saturates at 1.75: most of a unit Gaussian survives, but not the mean error bound
        y = fn(x)
        assert y.dtype == torch.float32 and y.shape == x.shape, name
        assert (y - x.float()).abs().mean() < 0.5 * x.float().abs().mean(), name


def test_engine_facts():
    assert tq.boundary_skip_layers(32) == [0, 1, 30, 31]
    assert tq.boundary_skip_layers(3) == [0, 2]
    assert tq.boundary_skip_layers(1) == []
    assert tq.boundary_skip_layers(48, is_hybrid=True) == []
    assert tq.supports_head_dim("turboquant_k8v4", 96)
    assert not tq.supports_head_dim("turboquant_4bit_nc", 96)
    assert tq.supports_head_dim("turboquant_3bit_nc", 256)
    lay = tq.slot_layout("turboquant_k3v4_nc", 128)
    assert lay == {"key": 50, "value": 68, "slot": 118, "slot_aligned": 118}
