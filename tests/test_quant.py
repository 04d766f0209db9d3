"""The pure-PyTorch reference quantizers, checked against independent numpy/scalar references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sensprof.quant import (
    dequantize_groups,
    fake_quant,
    quantize_groups,
    round_half_away,
)
from sensprof.schemes import REGISTRY, get_scheme

QUANTIZED = [n for n, s in REGISTRY.items() if not s.is_identity]
F32 = np.float32


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def varied(*shape, seed=0):
    """Random data with very different magnitudes per head, token and channel (like a real K cache)."""
    g = torch.Generator().manual_seed(seed)
    b, h, t, d = shape
    mag = torch.exp(torch.randn(b, h, t, 1, generator=g)) * torch.exp(torch.randn(1, 1, 1, d, generator=g))
    return torch.randn(*shape, generator=g) * mag + 0.3 * torch.randn(1, h, 1, d, generator=g)


def fp16(a):
    return np.asarray(a, dtype=F32).astype(np.float16).astype(F32)


def c_roundf(v):
    """C's roundf (half away from zero), computed in float64 where |v| + 0.5 is exact for float32 v."""
    v64 = np.asarray(v, dtype=np.float64)
    return (np.sign(v64) * np.floor(np.abs(v64) + 0.5)).astype(F32)


def safe_inv(d):
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def blocks(x, g, axis):
    """Yield (slice, block) over groups of g along axis (-1 channels, -2 tokens); the last may be short."""
    n = x.shape[axis]
    for start in range(0, n, g):
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(start, min(start + g, n))
        yield tuple(sl), x[tuple(sl)]


# ------------------------------------------------------------------------------------ independent references


def ref_minmax(x, bits, g, axis, store16=True):
    """Asymmetric min/max groups (KIVI; llama.cpp quantize_row_q4_1/q5_1): q = min(L, trunc((x-min)*id + 0.5))."""
    x = np.asarray(x, dtype=F32)
    out = np.empty_like(x)
    levels = F32(2**bits - 1)
    for sl, blk in blocks(x, g, axis):
        mn = blk.min(axis, keepdims=True)
        mx = blk.max(axis, keepdims=True)
        d = (mx - mn) / levels
        q = np.minimum(levels, np.trunc((blk - mn) * safe_inv(d) + F32(0.5)))
        ds, ms = (fp16(d), fp16(mn)) if store16 else (d, mn)
        out[sl] = q * ds + ms
    return out


def ref_signed_max(x, bits, g=32):
    """llama.cpp quantize_row_q4_0/q5_0 along the last axis, written as ggml does it, element by element."""
    x = np.asarray(x, dtype=F32)
    half = 2 ** (bits - 1)
    top = 2**bits - 1
    out = np.empty_like(x)
    for sl, blk in blocks(x, g, -1):
        amax = np.zeros(blk.shape[:-1], F32)
        mx = np.zeros(blk.shape[:-1], F32)
        for j in range(blk.shape[-1]):  # the value of largest magnitude, first one on ties, sign kept
            v = blk[..., j]
            upd = amax < np.abs(v)
            amax = np.where(upd, np.abs(v), amax)
            mx = np.where(upd, v, mx)
        d = (mx / F32(-half))[..., None]
        q = np.minimum(top, np.trunc(blk * safe_inv(d) + F32(half + 0.5)))
        out[sl] = (q - F32(half)) * fp16(d)
    return out


def ref_absmax(x, bits, g, store16):
    """Symmetric absmax along the last axis (llama.cpp quantize_row_q8_0; vLLM per-token-head)."""
    x = np.asarray(x, dtype=F32)
    qmax = F32(2 ** (bits - 1) - 1)
    out = np.empty_like(x)
    for sl, blk in blocks(x, g, -1):
        d = np.abs(blk).max(-1, keepdims=True) / qmax
        q = np.clip(c_roundf(blk * safe_inv(d)), -qmax, qmax)
        out[sl] = q * (fp16(d) if store16 else d)
    return out


def fq(x, name, **kw):
    return fake_quant(x, get_scheme(name), **kw)


# ------------------------------------------------------------------------------------ shape, dtype, round trips


@pytest.mark.parametrize("name", QUANTIZED)
def test_fake_quant_keeps_shape_dtype_and_is_finite(name):
    x = varied(2, 3, 37, 64, seed=1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        y = fq(xd, name)
        assert y.shape == xd.shape and y.dtype == dtype
        assert torch.isfinite(y).all()
        assert not torch.equal(y, xd)  # something was quantized


# Engine formats that rotate before quantizing (vLLM's int4_per_token_head, UltraQuant, TurboQuant, Octave), or
# whose scale comes from a rounded statistic (UltraQuant's power-of-two 0.156 * absmax), are not projections: their
# round trip is pinned by golden tests (tests/engines/) instead.
ROTATED = {"int4_per_token_head", "ultraquant_4bit.K", "ultraquant_4bit.V", "turboquant_4bit_nc.K", "turboquant_k3v4_nc.K",
           "turboquant_3bit_nc.K", *(n for n in REGISTRY if n.startswith("octave"))}


@pytest.mark.parametrize("name", [n for n in QUANTIZED if n not in ROTATED])
def test_fake_quant_is_idempotent(name):
    """Quantizing an already quantized tensor again changes nothing, bit for bit."""
    x = varied(2, 4, 96, 64, seed=2)
    y = fq(x, name)
    assert torch.equal(fq(y, name), y)


@pytest.mark.parametrize("name", ["fp8_e4m3_cal", "fp8_e5m2_head", "int8"])
def test_calibrated_fake_quant_is_idempotent_with_fixed_absmax(name):
    x = varied(1, 4, 50, 32, seed=3)
    absmax = x.abs().amax(dim=(0, 2, 3)) * 0.7  # some saturation too
    y = fq(x, name, absmax=absmax)
    assert torch.equal(fq(y, name, absmax=absmax), y)


def test_identity_returns_the_input():
    x = randn(1, 2, 5, 8, dtype=torch.bfloat16)
    assert fake_quant(x, REGISTRY["none"]) is x


def test_fake_quant_does_not_modify_its_input():
    x = varied(1, 2, 40, 32, seed=4)
    before = x.clone()
    for name in ("int4_c32_s4", "q4_0", "fp8_e4m3_head", "int8_per_token_head"):
        fq(x, name)
    assert torch.equal(x, before)


def test_residual_is_not_applied_by_fake_quant():
    x = varied(1, 2, 70, 64, seed=5)
    for base in ("int4_t32", "int4_c32", "q4_0"):
        assert torch.equal(fq(x, base + "_r16"), fq(x, base))
        assert torch.equal(fq(x, base + "_pre"), fq(x, base))


# ------------------------------------------------------------------------------------ exact vs references


@pytest.mark.parametrize("bits", (8, 6, 5, 4, 3, 2))
@pytest.mark.parametrize("group", (32, 64, 128))
def test_minmax_schemes_match_numpy_reference(bits, group):
    x = varied(2, 3, 37, 64, seed=bits * 1000 + group)  # 37 tokens: a short last token group
    xn = x.numpy()
    # per channel: groups of G tokens for each channel; per token: groups of G channels
    assert np.array_equal(fq(x, f"int{bits}_c{group}").numpy(), ref_minmax(xn, bits, group, axis=-2))
    assert np.array_equal(fq(x, f"int{bits}_t{group}").numpy(), ref_minmax(xn, bits, min(group, 64), axis=-1))


@pytest.mark.parametrize("name, bits, g", [("int4_t32", 4, 32), ("int3_t64", 3, 64), ("int2_t128", 2, 80)])
def test_token_groups_with_head_dim_not_a_multiple(name, bits, g):
    x = varied(1, 2, 9, 80, seed=6)  # head_dim 80: a short last channel group
    assert np.array_equal(fq(x, name).numpy(), ref_minmax(x.numpy(), bits, g, axis=-1))


@pytest.mark.parametrize("name, fn", [
    ("q4_0", lambda x: ref_signed_max(x, 4)),
    ("q5_0", lambda x: ref_signed_max(x, 5)),
    ("q4_1", lambda x: ref_minmax(x, 4, 32, axis=-1)),
    ("q5_1", lambda x: ref_minmax(x, 5, 32, axis=-1)),
    ("q8_0", lambda x: ref_absmax(x, 8, 32, store16=True)),
])
@pytest.mark.parametrize("head_dim", (64, 128))
def test_llama_cpp_formats_match_ggml_reference(name, fn, head_dim):
    x = varied(2, 3, 24, head_dim, seed=head_dim)
    assert np.array_equal(fq(x, name).numpy(), fn(x.numpy()))


@pytest.mark.parametrize("name, fn", [
    ("q4_0", lambda x: ref_signed_max(x, 4)),
    ("q5_0", lambda x: ref_signed_max(x, 5)),
    ("q8_0", lambda x: ref_absmax(x, 8, 32, store16=True)),
    ("q4_1", lambda x: ref_minmax(x, 4, 32, axis=-1)),
])
def test_llama_cpp_formats_on_many_blocks(name, fn):
    """A larger sample (8k blocks) of random data, to catch rare rounding differences."""
    x = randn(2, 8, 128, 128, seed=7, scale=3.0)
    assert np.array_equal(fq(x, name).numpy(), fn(x.numpy()))


@pytest.mark.parametrize("name, bits", [("q4_0", 4), ("q5_0", 5)])
def test_signed_max_takes_the_first_value_of_largest_magnitude(name, bits):
    half = 2 ** (bits - 1)
    x = torch.linspace(-1, 1, 64).reshape(1, 1, 1, 64).clone()
    x[..., 3] = -5.0  # block 0: -5 comes first, +5 later
    x[..., 10] = 5.0
    x[..., 33] = 5.0  # block 1: +5 comes first, -5 later
    x[..., 40] = -5.0
    y = fq(x, name)
    assert np.array_equal(y.numpy(), ref_signed_max(x.numpy(), bits))
    # block 0: d = -5/-half > 0: -5 is code 0 (exact), +5 would be code 2*half, clamped to 2*half-1
    d0 = float(fp16(5.0 / half))
    assert y[0, 0, 0, 3] == -5.0
    assert y[0, 0, 0, 10] == pytest.approx((half - 1) * d0)
    # block 1: d < 0: +5 is code 0 and exact, -5 clamps
    assert y[0, 0, 0, 33] == 5.0
    assert y[0, 0, 0, 40] == pytest.approx(-(half - 1) * d0)


@pytest.mark.parametrize("name, bits", [("int8_per_token_head", 8)])
def test_per_token_head_absmax_matches_reference(name, bits):
    x = varied(2, 3, 20, 64, seed=8)
    # one fp32 scale per token and head (the whole head_dim), not rounded to fp16
    assert np.array_equal(fq(x, name).numpy(), ref_absmax(x.numpy(), bits, 64, store16=False))


def test_round_half_away_on_halves():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.4, -0.6, 126.5, -126.5, 0.0])
    assert round_half_away(v).tolist() == [1, 2, 3, -1, -2, -3, 0, -1, 127, -127, 0]


def test_round_half_away_matches_c_roundf_just_below_one_half():
    v = torch.tensor([np.nextafter(F32(0.5), F32(0)), -np.nextafter(F32(0.5), F32(0))], dtype=torch.float32)
    assert round_half_away(v).tolist() == c_roundf(v.numpy()).tolist() == [0.0, 0.0]


def test_q8_0_rounds_like_ggml_just_below_one_half():
    x = torch.zeros(1, 1, 1, 32)
    x[..., 0] = 127.0
    x[..., 1] = float(np.nextafter(F32(0.5), F32(0)))
    y = fq(x, "q8_0")
    assert np.array_equal(y.numpy(), ref_absmax(x.numpy(), 8, 32, store16=True))
    assert y[0, 0, 0, 1] == 0.0


# ------------------------------------------------------------------------------------ fp8


@pytest.mark.parametrize("fmt, fmax, dtype", [("fp8_e4m3", 448.0, torch.float8_e4m3fn),
                                               ("fp8_e5m2", 57344.0, torch.float8_e5m2)])
def test_unit_scale_fp8_is_a_saturating_cast(fmt, fmax, dtype):
    x = varied(2, 3, 30, 64, seed=9) * (fmax / 20)  # a good share beyond fmax
    x[0, 0, 0, :4] = torch.tensor([1e30, -1e30, fmax * 1.0001, -fmax * 3])
    assert (x.abs() > fmax).float().mean() > 0.01
    y = fq(x, fmt)
    assert torch.equal(y, x.clamp(-fmax, fmax).to(dtype).float())
    assert torch.isfinite(y).all()
    assert y.abs().max() == fmax
    assert y[0, 0, 0, :4].tolist() == [fmax, -fmax, fmax, -fmax]


@pytest.mark.parametrize("fmt, fmax, dtype", [("fp8_e4m3", 448.0, torch.float8_e4m3fn),
                                               ("fp8_e5m2", 57344.0, torch.float8_e5m2)])
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
def test_unit_scale_fp8_in_half_precision(fmt, fmax, dtype, in_dtype):
    x = (varied(1, 2, 20, 32, seed=10) * 50).to(in_dtype)
    y = fq(x, fmt)
    assert y.dtype == in_dtype
    assert torch.equal(y, x.float().clamp(-fmax, fmax).to(dtype).float().to(in_dtype))
    assert torch.isfinite(y).all()


def test_fp8_relative_error_bound():
    """e4m3 keeps 3 mantissa bits, e5m2 2: relative error <= 2^-4 (2^-3) in the normal range."""
    x = varied(2, 2, 40, 64, seed=11)
    x = x[(x.abs() > 2**-5) & (x.abs() < 400)]
    x = x.reshape(1, 1, 1, -1)
    assert ((fq(x, "fp8_e4m3") - x).abs() <= x.abs() * 2**-4).all()
    assert ((fq(x, "fp8_e5m2") - x).abs() <= x.abs() * 2**-3).all()


def _fp8_ref(x, amax, fmax, dtype):
    scale = amax / fmax
    return (x * (1.0 / scale)).clamp(-fmax, fmax).to(dtype).float() * scale


@pytest.mark.parametrize("fmt, fmax, dtype", [("fp8_e4m3", 448.0, torch.float8_e4m3fn),
                                               ("fp8_e5m2", 57344.0, torch.float8_e5m2)])
def test_calibrated_fp8_uses_the_given_absmax(fmt, fmax, dtype):
    x = varied(2, 4, 30, 32, seed=12)
    absmax = torch.tensor([0.5, 2.0, 7.0, 40.0])  # smaller than the data for some heads: saturation
    # per tensor: one scale, max over heads of the calibrated absmax
    y = fq(x, fmt + "_cal", absmax=absmax)
    assert torch.equal(y, _fp8_ref(x, torch.tensor(40.0), fmax, dtype))
    # per head: absmax[h] / fmax
    y = fq(x, fmt + "_head", absmax=absmax)
    assert torch.equal(y, _fp8_ref(x, absmax.reshape(1, 4, 1, 1), fmax, dtype))
    for h in range(4):
        assert y[:, h].abs().max() <= absmax[h] * (1 + 1e-6)  # saturated at the calibrated range
        assert torch.isfinite(y[:, h]).all()
    assert (x[:, 0].abs() > 0.5).any()
    assert torch.allclose(y[:, 0].abs().max(), absmax[0])


@pytest.mark.parametrize("fmt, fmax, dtype", [("fp8_e4m3", 448.0, torch.float8_e4m3fn),
                                               ("fp8_e5m2", 57344.0, torch.float8_e5m2)])
def test_calibrated_fp8_without_absmax_uses_the_tensor(fmt, fmax, dtype):
    x = varied(2, 4, 30, 32, seed=13)
    y = fq(x, fmt + "_cal")
    assert torch.equal(y, _fp8_ref(x, x.abs().amax(), fmax, dtype))
    y = fq(x, fmt + "_head")
    assert torch.equal(y, _fp8_ref(x, x.abs().amax(dim=(0, 2, 3)).reshape(1, 4, 1, 1), fmax, dtype))


def test_fp8_per_token_head_scales_each_token():
    x = varied(2, 3, 20, 64, seed=14)
    y = fq(x, "fp8_per_token_head")
    assert torch.equal(y, _fp8_ref(x, x.abs().amax(-1, keepdim=True), 448.0, torch.float8_e4m3fn))


def test_fp8_head_scales_are_independent_per_head():
    x = randn(1, 2, 32, 64, seed=15)
    x[0, 1, 5, 7] = 1e6  # tiny values of head 1 fall below e4m3's smallest subnormal once scaled
    per_head = fq(x, "fp8_e4m3_head") - x
    per_tensor = fq(x, "fp8_e4m3_cal") - x
    scale0 = x[0, 0].abs().max() / 448
    assert (per_head[0, 0].abs() <= x[0, 0].abs() * 2**-4 + scale0 * 2**-10).all()  # head 0: full fp8 precision
    assert per_head[0, 1].abs().mean() > 0.3  # head 1 flushed towards zero
    assert per_tensor[0, 0].abs().mean() > 0.3  # one tensor scale: every head suffers


def test_int8_calibrated_uses_the_given_absmax_and_saturates():
    x = varied(2, 4, 30, 32, seed=16)
    absmax = torch.tensor([0.5, 2.0, 7.0, 3.0])
    scale = np.float32(7.0) / F32(127)
    ref = np.clip(c_roundf(x.numpy() * (F32(1) / scale)), -127, 127) * scale  # fp32 scale, per tensor
    y = fq(x, "int8", absmax=absmax)
    assert np.array_equal(y.numpy(), ref)
    assert y.abs().max() <= 7.0 * (1 + 1e-6)
    assert (x.abs() > 7.0).any()
    # without calibration: the tensor's own absmax, so the largest value is exact up to rounding
    y = fq(x, "int8")
    amax = x.abs().max()
    assert torch.allclose(y.abs().max(), amax, rtol=1e-6)
    assert ((y - x).abs() <= amax / 127 / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_cal", "fp8_e5m2_head", "int8", "fp8_per_token_head"])
def test_saturation_never_gives_nan_or_inf(name):
    x = varied(1, 2, 16, 32, seed=17) * 1e4
    x[0, 0, 0, 0] = 3e38
    x[0, 1, 3, 2] = -3e38
    for kw in ({}, {"absmax": torch.tensor([1.0, 1e-3])}):
        y = fq(x, name, **kw)
        assert torch.isfinite(y).all(), kw
        assert (torch.sign(y[0, 0, 0, 0]) >= 0) and (torch.sign(y[0, 1, 3, 2]) <= 0)


# ------------------------------------------------------------------------------------ error bounds


def _group_stats(x, g, axis):
    """min, max, absmax of each element's group, broadcast back to x's shape."""
    mn, mx, am = (np.empty_like(x) for _ in range(3))
    for sl, blk in blocks(x, g, axis):
        mn[sl] = blk.min(axis, keepdims=True)
        mx[sl] = blk.max(axis, keepdims=True)
        am[sl] = np.abs(blk).max(axis, keepdims=True)
    return mn, mx, am


@pytest.mark.parametrize("name", [f"int{b}_{k}{g}" for b in (8, 4, 2) for k in "ct" for g in (32, 128)]
                         + ["q4_1", "q5_1"])
def test_minmax_error_bound(name):
    s = get_scheme(name)
    x = varied(2, 3, 37, 64, seed=18).numpy()
    axis = -2 if s.granularity == "channel" else -1
    mn, mx, _ = _group_stats(x, s.group, axis)
    levels = 2**s.bits - 1
    d = (mx - mn) / levels
    slack = levels * np.abs(fp16(d) - d) + np.abs(fp16(mn) - mn) + 4e-7 * (np.abs(mn) + np.abs(mx))
    err = np.abs(x - fq(torch.from_numpy(x), name).numpy())
    assert (err <= d / 2 + slack).all()
    assert err.max() > 0.3 * (d / 2).max()  # the bound is not vacuous


@pytest.mark.parametrize("name, store16", [("q8_0", True), ("int8_per_token_head", False)])
def test_absmax_error_bound(name, store16):
    s = get_scheme(name)
    x = varied(2, 3, 20, 64, seed=19).numpy()
    _, _, am = _group_stats(x, min(s.group or 64, 64), -1)
    qmax = 2 ** (s.bits - 1) - 1
    d = am / qmax
    slack = (qmax * np.abs(fp16(d) - d) if store16 else 0) + 4e-7 * am
    err = np.abs(x - fq(torch.from_numpy(x), name).numpy())
    assert (err <= d / 2 + slack).all()
    assert err.max() > 0.3 * (d / 2).max()


@pytest.mark.parametrize("name", ["q4_0", "q5_0"])
def test_signed_max_error_bound(name):
    s = get_scheme(name)
    half = 2 ** (s.bits - 1)
    x = varied(2, 3, 20, 64, seed=20).numpy()
    _, _, am = _group_stats(x, 32, -1)
    d = am / half
    slack = half * np.abs(fp16(d) - d) + 4e-7 * am
    err = np.abs(x - fq(torch.from_numpy(x), name).numpy())
    # values of the sign opposite to the extreme one can reach code 2^b, clamped to 2^b - 1: one step
    assert (err <= d + slack).all()
    sign_extreme = np.empty_like(x)
    for sl, blk in blocks(x, 32, -1):
        idx = np.abs(blk).argmax(-1)[..., None]
        sign_extreme[sl] = np.sign(np.take_along_axis(blk, idx, -1))
    inside = -x * sign_extreme < am - d / 2  # not in the top half-step on the clamped side
    assert (err[inside] <= d[inside] / 2 + slack[inside]).all()


@pytest.mark.parametrize("kind", ["c32", "t32", "c128", "t64"])
def test_error_shrinks_as_bits_grow(kind):
    x = varied(1, 4, 128, 64, seed=21)
    rel = [float((fq(x, f"int{b}_{kind}") - x).norm() / x.norm()) for b in (2, 3, 4, 5, 6, 8)]
    assert all(a > b for a, b in zip(rel, rel[1:])), rel
    for a, b in zip(rel[1:4], rel[2:5]):  # one more bit roughly halves the error
        assert 1.6 < a / b < 2.6, rel
    assert rel[-1] < 0.015 and rel[0] > 0.2


def test_llama_cpp_error_ordering():
    x = varied(1, 4, 64, 128, seed=22)
    rel = {n: float((fq(x, n) - x).norm() / x.norm()) for n in ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")}
    assert rel["q8_0"] < rel["q5_1"] < rel["q4_1"]
    assert rel["q5_0"] < rel["q4_0"]
    assert rel["q8_0"] < 0.01 and rel["q4_0"] < 0.15


# ------------------------------------------------------------------------------------ grouping axis


def test_per_channel_outlier_affects_only_its_channel_group():
    x = randn(1, 2, 96, 16, seed=23)
    x[0, 1, 40, 5] = 1000.0
    y = fq(x, "int4_c32")
    err = (y - x).abs()
    coarse = torch.zeros_like(err, dtype=torch.bool)
    coarse[0, 1, 32:64, 5] = True
    coarse[0, 1, 40, 5] = False  # the outlier itself is the group max: exact up to fp16 storage
    # step ~1000/15: every other value of that group gets code 0, i.e. the group's min (stored as fp16)
    assert (y[coarse] == float(fp16(x[coarse].min()))).all()
    assert err[coarse].mean() > 0.8
    fine = ~coarse
    fine[0, 1, 40, 5] = False
    assert err[fine].max() < 0.35  # everything else: its own ~ +-3 range / 15 / 2
    assert err[0, 1, 40, 5] < 15 * 0.0625  # the outlier: fp16 storage of a ~67 scale


def test_per_token_outlier_affects_only_its_token_group():
    x = randn(1, 2, 16, 64, seed=24)
    x[0, 0, 7, 5] = 1000.0
    for name in ("int4_t32", "q4_1"):
        y = fq(x, name)
        err = (y - x).abs()
        coarse = torch.zeros_like(err, dtype=torch.bool)
        coarse[0, 0, 7, 0:32] = True
        coarse[0, 0, 7, 5] = False
        assert (y[coarse] == float(fp16(x[coarse].min()))).all(), name
        assert err[coarse].mean() > 0.8, name
        fine = ~coarse
        fine[0, 0, 7, 5] = False
        assert err[fine].max() < 0.35, name
    # per token and head (whole head_dim): the whole token is coarse, other tokens are not
    err = (fq(x, "int8_per_token_head") - x).abs()
    assert err[0, 0, 7].max() > 1.0
    assert err[0, 0, 6].max() < 0.02 and err[0, 1].max() < 0.02 and err[0, 0, 8:].max() < 0.02


def test_per_channel_and_per_token_are_different_axes():
    """A channel that is large for every token: per-channel groups absorb it, per-token ones do not."""
    x = randn(1, 1, 64, 64, seed=25)
    x[..., 3] += 50.0
    e_c = float((fq(x, "int4_c32") - x).norm() / x.norm())
    e_t = float((fq(x, "int4_t32") - x).norm() / x.norm())
    assert e_c < e_t / 4
    xt = x.transpose(-1, -2).contiguous()  # now a large token: the reverse
    e_c2 = float((fq(xt, "int4_c32") - xt).norm() / xt.norm())
    e_t2 = float((fq(xt, "int4_t32") - xt).norm() / xt.norm())
    assert e_t2 < e_c2 / 4
    assert e_c == pytest.approx(e_t2, rel=1e-5) and e_t == pytest.approx(e_c2, rel=1e-5)


# ------------------------------------------------------------------------------------ sinks


@pytest.mark.parametrize("base", ["int4_c32", "int2_t32", "q4_0", "q8_0", "fp8_e4m3", "fp8_e4m3_cal",
                                  "fp8_e5m2_head", "int8", "int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sinks_pass_through(base, dtype):
    x = varied(2, 3, 37, 64, seed=26)
    x[..., :4, :] *= 1000.0  # huge sinks must not change the body's statistics
    x = x.to(dtype)
    y = fq(x, base + "_s4")
    assert y.dtype == dtype
    assert torch.equal(y[..., :4, :], x[..., :4, :])
    assert torch.equal(y[..., 4:, :], fq(x[..., 4:, :].contiguous(), base))
    body_err = float((y[..., 4:, :].float() - x[..., 4:, :].float()).norm() / x[..., 4:, :].float().norm())
    assert body_err < 0.6  # int2 included; with the sinks' statistics it would be ~1


def test_sink_groups_count_from_the_first_non_sink():
    x = randn(1, 1, 36, 8, seed=27)
    x[0, 0, 35, 0] = 100.0  # last token of the body
    y = fq(x, "int4_c32_s4")  # body = tokens 4..35: one complete group of 32 holding the outlier
    assert np.array_equal(y[..., 4:, :].numpy(), ref_minmax(x[..., 4:, :].numpy(), 4, 32, axis=-2))
    err = (y - x).abs()
    assert err[0, 0, 4:35, 0].mean() > 1.0  # whole body group of channel 0 is coarse


@pytest.mark.parametrize("sink", [37, 40])
def test_sinks_covering_everything_return_the_input(sink):
    x = varied(1, 2, 37, 32, seed=28).half()
    y = fq(x, f"int4_c32_s{sink}")
    assert torch.equal(y, x) and y.dtype == torch.float16


# ------------------------------------------------------------------------------------ zeros and constants


@pytest.mark.parametrize("name", QUANTIZED)
def test_all_zero_tensors_stay_zero(name):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.zeros(2, 3, 37, 64, dtype=dtype)
        y = fq(x, name)
        assert torch.isfinite(y).all() and (y == 0).all() and y.dtype == dtype
    if get_scheme(name).scale_source == "calibrated":
        y = fq(torch.zeros(1, 3, 5, 64), name, absmax=torch.zeros(3))
        assert torch.isfinite(y).all() and (y == 0).all()


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "q4_0", "q4_1", "q8_0", "int8_per_token_head", "fp8_per_token_head"])
def test_zero_groups_among_nonzero_ones(name):
    x = varied(1, 2, 64, 64, seed=29)
    x[0, 0, 32:64, 0:32] = 0.0  # a whole group for the c32/t32/q* schemes; zeros within a group otherwise
    y = fq(x, name)
    assert torch.isfinite(y).all()
    assert (y[0, 0, 32:64, 0:32] == 0).all()
    assert (y[0, 0, 32:64, 32:] != 0).any() and (y[0, 1] != 0).any()


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "q4_1", "q5_1"])
def test_constant_minmax_groups_give_the_fp16_stored_min(name):
    x = torch.full((1, 2, 32, 64), 0.1)
    y = fq(x, name)
    assert (y == float(fp16(0.1))).all()


# ------------------------------------------------------------------------------------ half precision


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "q4_0", "q8_0", "int8_per_token_head", "fp8_e4m3_cal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(name, dtype):
    x = varied(2, 3, 37, 64, seed=30).to(dtype)
    y = fq(x, name)
    assert y.dtype == dtype and y.shape == x.shape
    # computed in float32 from the (exactly representable) input, then rounded once to the input dtype
    assert torch.equal(y, fq(x.float(), name).to(dtype))
    rel = float((y.float() - x.float()).norm() / x.float().norm())
    assert rel < 0.15


# ------------------------------------------------------------------------------------ quantize_groups


@pytest.mark.parametrize("name", ["int4_t32", "int2_c32", "q4_1", "q4_0", "q5_0", "q8_0", "int8_per_token_head"])
def test_quantize_groups_codes_scales_and_dequantization(name):
    """Groups are the last axis of what quantize_groups gets, whatever the scheme's granularity."""
    s = get_scheme(name)
    xg = varied(2, 3, 10, 64, seed=31).reshape(2, 3, 10, 2, 32)
    q = quantize_groups(xg, s)
    codes = q.codes
    assert torch.equal(codes, torch.round(codes))
    assert q.scale.shape == xg.shape[:-1] + (1,)
    if s.scale_bits == 16:
        assert torch.equal(q.scale, q.scale.half().float())
    x32 = xg.numpy()
    if s.codec == "absmax":
        qmax = 2 ** (s.bits - 1) - 1
        assert codes.min() >= -qmax and codes.max() <= qmax
        assert (codes.abs().amax(-1) == qmax).all()  # the absmax element uses the top code
        assert q.zero is None
        ref = ref_absmax(x32, s.bits, 32, store16=s.scale_bits == 16)
    elif s.codec == "minmax":
        assert codes.min() >= 0 and codes.max() <= 2**s.bits - 1
        assert torch.equal(q.zero, xg.amin(-1, keepdim=True).half().float())
        assert (codes.amin(-1) == 0).all() and (codes.amax(-1) == 2**s.bits - 1).all()
        ref = ref_minmax(x32, s.bits, 32, axis=-1)
    else:
        assert codes.min() >= 0 and codes.max() <= 2**s.bits - 1
        assert (codes.amin(-1) == 0).all()  # the extreme value has code 0
        ref = ref_signed_max(x32, s.bits)
    assert np.array_equal(dequantize_groups(q, s).numpy(), ref)


def test_quantize_groups_absmax_override():
    s = get_scheme("int8_per_token_head")
    xg = varied(1, 2, 4, 32, seed=32)
    assert xg.abs().max() > 2.0
    q = quantize_groups(xg, s, absmax=torch.tensor(2.0))
    scale = F32(2.0) / F32(127)
    assert (q.scale == torch.tensor(scale)).all()
    codes = np.clip(c_roundf(xg.numpy() * (F32(1) / scale)), -127, 127)
    assert np.array_equal(q.codes.numpy(), codes)
    assert q.codes.abs().max() == 127


def test_fp8_codes_are_fp8():
    xg = randn(1, 2, 3, 16, seed=33)
    assert quantize_groups(xg, get_scheme("fp8_e4m3")).codes.dtype == torch.float8_e4m3fn
    assert quantize_groups(xg, get_scheme("fp8_e5m2_cal")).codes.dtype == torch.float8_e5m2


def test_identity_has_nothing_to_quantize():
    with pytest.raises(ValueError):
        quantize_groups(randn(1, 1, 1, 4), REGISTRY["none"])
