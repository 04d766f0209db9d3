"""sensprof.profiling.taps: which keys a streaming cache still holds in full precision, and mixed attention."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tiny_model

from sensprof.models import model_eager
from sensprof.models import decoder_layers
from sensprof.quant import fake_quant
from sensprof.schemes import get_scheme
from sensprof.profiling.taps import full_precision_from, mixed_attention

# ---------------------------------------------------------------- full_precision_from


@pytest.mark.parametrize("name", ["int4_t32", "q4_0", "int8_per_token_head", "fp8_e4m3", "int8", "int4_t32_s4",
                                  "int4_t32_pre"])
@pytest.mark.parametrize("n", [1, 37, 64])
def test_no_residual_per_token_means_everything_quantized(name, n):
    assert full_precision_from(get_scheme(name), n) is None


@pytest.mark.parametrize("name,r", [("int4_t32_r16", 16), ("q4_0_r1", 1), ("fp8_e4m3_r8", 8),
                                    ("int8_per_token_head_r100", 100), ("int2_t32_pre_r5_s4", 5)])
@pytest.mark.parametrize("n", [7, 64])
def test_residual_keeps_the_last_r_tokens(name, r, n):
    start = full_precision_from(get_scheme(name), n)
    assert start is not None and start.shape == (n,)
    assert start.tolist() == [t + 1 - r for t in range(n)]


@pytest.mark.parametrize("name,g,s", [("int4_c32", 32, 0), ("int2_c64", 64, 0), ("int4_c32_s4", 32, 4),
                                      ("int8_c128_s3", 128, 3), ("int4_c32_pre", 32, 0)])
@pytest.mark.parametrize("n", [64, 101])
def test_per_channel_groups_wait_in_full_precision(name, g, s, n):
    """Without a residual: the tokens of the group not yet complete stay in full precision."""
    start = full_precision_from(get_scheme(name), n)
    assert start is not None and start.shape == (n,)
    for t in range(max(s - 1, 0), n):  # before t + 1 = s only sinks were seen; fake_quant never quantizes them
        assert int(start[t]) == min(t + 1, s + g * math.floor((t + 1 - s) / g)), (name, t)
    # a group becomes quantized exactly when it is complete
    if s + g - 1 < n:
        assert int(start[s + g - 2]) == s and int(start[s + g - 1]) == s + g


@pytest.mark.parametrize("name,g,r,s", [("int4_c32_r16", 32, 16, 0), ("int4_c32_r48", 32, 48, 0),
                                        ("int4_c32_r16_s4", 32, 16, 4), ("int8_c128_r8_s3", 128, 8, 3),
                                        ("int2_c32_r32", 32, 32, 0)])
@pytest.mark.parametrize("n", [64, 101, 200])
def test_per_channel_groups_with_residual(name, g, r, s, n):
    """With a residual R: the last R tokens always stay in full precision, only whole groups are
    quantized, and what is quantized agrees with the storage model (memory.quantized_token_count).

    Note: the brief's rule was start = min(t+1-R, S + G*floor((t+1-S)/G)) (a group is quantized once
    complete, residual cut mid-group); the working tree now quantizes a group only once it is complete
    AND out of the residual window, i.e. start = S + G*floor(max(0, t+1-S-R)/G), the same rule as
    memory.quantized_token_count. Both agree when R = 0 (tested above).
    """
    from sensprof.memory import quantized_token_count

    scheme = get_scheme(name)
    start = full_precision_from(scheme, n)
    assert start is not None and start.shape == (n,)
    for t in range(n):
        st = int(start[t])
        assert st <= t + 1 - r or t + 1 - r <= s, (name, t, st)  # the residual window is never quantized
        assert st >= s and (st - s) % g == 0, (name, t, st)  # whole groups after the sinks
        assert max(0, min(st, t + 1) - s) == quantized_token_count(scheme, t + 1), (name, t)
        assert st == s + g * (max(0, t + 1 - s - r) // g), (name, t)  # the working tree's rule
    assert start.diff().min() >= 0  # what was quantized stays quantized


# ---------------------------------------------------------------- mixed_attention vs a reference by hand


def _reference(module, q, k_q, v_q, k, v, fp_from, window=None, q_offset=0):
    """Loop over queries; each reads key j quantized if j < fp_from[t], else full precision."""
    groups = q.shape[1] // k.shape[1]
    kq, vq, kf, vf = (x.repeat_interleave(groups, dim=1).double() for x in (k_q, v_q, k, v))
    qd = q.double()
    n = k.shape[-2]
    b, h, m, d = q.shape
    out = torch.zeros(b, m, h, d, dtype=torch.float64)
    weights = torch.zeros(b, h, m, n, dtype=torch.float64)
    for i in range(m):
        t = q_offset + i
        lo = 0 if window is None else max(0, t - window + 1)
        js = torch.arange(lo, t + 1)
        quant = js < int(fp_from[t])
        keys = torch.where(quant[None, None, :, None], kq[:, :, js], kf[:, :, js])
        vals = torch.where(quant[None, None, :, None], vq[:, :, js], vf[:, :, js])
        scores = torch.einsum("bhd,bhjd->bhj", qd[:, :, i], keys) * module.scaling
        p = torch.softmax(scores, dim=-1)
        weights[:, :, i, js] = p
        out[:, i] = torch.einsum("bhj,bhjd->bhd", p, vals)
    return out, weights


@pytest.fixture(scope="module")
def llama_attn():
    model = make_tiny_model("llama")
    return decoder_layers(model)[0].self_attn


def _qkv(n, m=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = torch.randn(2, 4, m, 16, generator=g)
    k = torch.randn(2, 2, n, 16, generator=g)
    v = torch.randn(2, 2, n, 16, generator=g)
    return q, k, v


def _mask(n, window=None, batch=2):
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    ok = j <= i
    if window is not None:
        ok &= j > i - window
    neg = torch.finfo(torch.float32).min
    return torch.where(ok, 0.0, neg).float()[None, None].expand(batch, 1, n, n).contiguous()


@pytest.mark.parametrize("name", ["int4_t32_r16", "int2_c32", "int2_c32_r16_s4", "int2_t32_r5"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "sliding"])
def test_mixed_attention_matches_reference(llama_attn, name, mask_kind):
    n = 64
    scheme = get_scheme(name)
    q, k, v = _qkv(n)
    k_q, v_q = fake_quant(k, scheme), fake_quant(v, scheme)
    assert (k_q - k).abs().max() > 1e-2  # quantization is visible at these bits
    fp_from = full_precision_from(scheme, n)
    assert fp_from is not None
    window = 24 if mask_kind == "sliding" else None  # wider than the residual: some reads stay quantized
    mask = None if mask_kind == "none" else _mask(n, window)
    eager = model_eager(llama_attn)
    out, w = mixed_attention(eager, llama_attn, q, k_q, v_q, k, v, mask, fp_from,
                             {"scaling": llama_attn.scaling, "dropout": 0.0})
    ref_out, ref_w = _reference(llama_attn, q, k_q, v_q, k, v, fp_from, window)
    assert out.shape == (2, n, 4, 16) and w.shape == (2, 4, n, n)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)
    # and it differs from both all-quantized and all-full-precision attention
    all_q, _ = eager(llama_attn, q, k_q, v_q, _mask(n, window), scaling=llama_attn.scaling, dropout=0.0)
    all_fp, _ = eager(llama_attn, q, k, v, _mask(n, window), scaling=llama_attn.scaling, dropout=0.0)
    assert (out - all_q).abs().max() > 1e-4
    assert (out - all_fp).abs().max() > 1e-4


def test_mixed_attention_with_fewer_queries_than_keys(llama_attn):
    """Decode-like call: the last m queries over all n keys (mask given and mask None)."""
    n, m = 40, 5
    scheme = get_scheme("int2_c32_r4")
    q, k, v = _qkv(n, m, seed=3)
    k_q, v_q = fake_quant(k, scheme), fake_quant(v, scheme)
    fp_from = full_precision_from(scheme, n)
    eager = model_eager(llama_attn)
    ref_out, ref_w = _reference(llama_attn, q, k_q, v_q, k, v, fp_from, q_offset=n - m)
    kw = {"scaling": llama_attn.scaling, "dropout": 0.0}
    for mask in (None, _mask(n)[..., n - m:, :]):
        out, w = mixed_attention(eager, llama_attn, q, k_q, v_q, k, v, mask, fp_from, kw)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)


def test_mixed_attention_all_full_precision_equals_plain_attention(llama_attn):
    n = 32
    q, k, v = _qkv(n, seed=5)
    k_q, v_q = k + 1.0, v - 1.0  # would show if any key were read quantized
    fp_from = torch.zeros(n, dtype=torch.long)
    eager = model_eager(llama_attn)
    out, w = mixed_attention(eager, llama_attn, q, k_q, v_q, k, v, None, fp_from,
                             {"scaling": llama_attn.scaling, "dropout": 0.0})
    ref, ref_w = eager(llama_attn, q, k, v, _mask(n), scaling=llama_attn.scaling, dropout=0.0)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w, ref_w, rtol=1e-6, atol=1e-7)


def test_decode_step_reads_as_the_last_position():
    """One query over a cache of n keys (a decode step) is the last row of the full prefill's attention."""
    import torch

    from sensprof.profiling.hooks import attention_taps
    from sensprof.schemes import get_scheme
    from sensprof.profiling.taps import QuantTap
    from conftest import make_tiny_model

    model = make_tiny_model("llama")
    ids = torch.randint(3, 200, (1, 48), generator=torch.Generator().manual_seed(0))
    pair = (get_scheme("int4_c32"), get_scheme("int4_t32"))
    with attention_taps(model) as sess, torch.inference_mode():
        for i in range(3):
            sess.set_tap(i, QuantTap(sess, i, [pair], 1, local=False))
        full = model(ids, use_cache=False).logits[:, -1]
        from transformers import DynamicCache

        from sensprof.runtime.generate import cache_kwarg

        cache = {cache_kwarg(model): DynamicCache(config=model.config)}
        model(ids[:, :-1], use_cache=True, **cache)
        step = model(ids[:, -1:], use_cache=True, **cache).logits[:, -1]
    assert torch.allclose(step, full, atol=1e-4), float((step - full).abs().max())
