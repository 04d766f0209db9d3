"""Pure-PyTorch reference for every scheme: grouping, codes, scales, fake quantization.

This is the CPU path and the oracle later kernels are tested against. Cached tensors are
[batch, kv_heads, tokens, head_dim]. Codes come from the exact fp32 scale; dequantization uses
the scale as stored (fp16 where the scheme stores fp16), as llama.cpp does.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .constants import FP8_MAX
from .rotation import rotate, unrotate
from .schemes import QuantScheme

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class Quantized:
    """Codes and the stored parameters of a grouped tensor ([..., n_groups, group])."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's roundf, which llama.cpp uses: ties away from zero (torch.round sends them to even)."""
    r = torch.round(v)
    t = torch.trunc(v)
    return torch.where((v - t).abs() == 0.5, t + torch.sign(v), r)


def _stored(scale: torch.Tensor, bits: int) -> torch.Tensor:
    return scale.half().float() if bits == 16 else scale


def _safe_inverse(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, 1.0), torch.zeros_like(scale))


def fp8_toward_zero(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """vLLM's CPU cache write (csrc/cpu/cpu_attn_fp8.hpp, float_to_fp8e4m3_scalar / float_to_fp8e5m2_scalar): clamp
    to +-max, then keep the leading bits of the float32 value, so every code is rounded toward zero (the GPU
    writers' cast rounds to nearest even). e4m3 rescales by 2^-120 so float32's exponent field becomes e4m3's
    (a float32 subnormal then carries e4m3's subnormal codes) and never writes the NaN code 0x7F; e5m2 shifts
    subnormals out by hand. Returns the fp8 tensor those bytes are."""
    fmax = FP8_MAX[fmt]
    v = y.float().clamp(-fmax, fmax)
    if fmt == "fp8_e4m3":
        bits = (v * 2.0**-120).view(torch.int32).long()
        payload = ((bits >> 20) & 0x7F).clamp_max(0x7E)
    else:
        bits = v.view(torch.int32).long()
        exp = ((bits >> 23) & 0xFF) - 127
        shift = (-14 - exp).clamp_min(0)
        sub = torch.where(shift + 21 >= 32, 0, ((0x800000 | (bits & 0x7FFFFF)) >> (shift + 21).clamp_max(31)).clamp_max(3))
        payload = torch.where(exp < -14, sub, ((exp + 15).clamp_min(0) << 2) | ((bits >> 21) & 0x3))
    sign = (bits >> 24) & 0x80
    code = torch.where(v == 0, 0, sign | payload)
    return code.to(torch.uint8).view(FP8_DTYPES[fmt])


def minmax_codes(xg: torch.Tensor, bits: int, dim: int = -1):
    """Asymmetric min-max codes of float32 groups along `dim`, with the exact fp32 scale and minimum (kept
    dims): one definition for the profiler and the runtime's reference kernels, so both store the same codes."""
    levels = 2**bits - 1
    mn = xg.amin(dim, keepdim=True)
    scale = (xg.amax(dim, keepdim=True) - mn) / levels
    codes = torch.floor((xg - mn) * _safe_inverse(scale) + 0.5).clamp(0, levels)
    return codes, scale, mn


def quantize_groups(xg: torch.Tensor, scheme: QuantScheme, absmax: torch.Tensor | None = None) -> Quantized:
    """Quantize float32 groups along the last dim. `absmax` (broadcastable) overrides dynamic stats."""
    b = scheme.bits
    if scheme.codec == "fp8":
        fmax = FP8_MAX[scheme.format]
        if scheme.rounding == "toward_zero":  # vLLM's CPU writer: x * (1 / scale), truncated
            scale = torch.ones_like(xg[..., :1]) if scheme.scale_source == "unit" else (
                (absmax if absmax is not None else xg.abs().amax(-1, keepdim=True)) / fmax).expand_as(
                xg[..., :1]).float().clamp_min(scheme.scale_floor)
            y = xg if scheme.scale_source == "unit" else xg * _safe_inverse(scale)
            return Quantized(fp8_toward_zero(y, scheme.format), scale, None)
        if scheme.scale_source == "unit":  # no scale: the saturating cast alone (x / 1 is x, bit for bit)
            return Quantized(xg.clamp(-fmax, fmax).to(FP8_DTYPES[scheme.format]), torch.ones_like(xg[..., :1]), None)
        amax = absmax if absmax is not None else xg.abs().amax(-1, keepdim=True)
        scale = (amax / fmax).expand_as(xg[..., :1]).float().clamp_min(scheme.scale_floor)
        # As vLLM writes them: a fixed k_scale/v_scale divides (x / k_scale), a dynamic per-token-head scale
        # multiplies by its inverse (x * (1 / scale)); ties land differently, so both are kept.
        if scheme.scale_source == "dynamic":
            y = xg * _safe_inverse(scale)
        else:
            y = torch.where(scale > 0, xg / torch.where(scale > 0, scale, 1.0), 0.0)
        y = y.clamp(-fmax, fmax).to(FP8_DTYPES[scheme.format])
        return Quantized(y, scale, None)
    if scheme.codec == "absmax":
        qmax = 2 ** (b - 1) - 1
        amax = absmax if absmax is not None else xg.abs().amax(-1, keepdim=True)
        scale = (amax / qmax).expand_as(xg[..., :1]).float().clamp_min(scheme.scale_floor)
        codes = round_half_away(xg * _safe_inverse(scale)).clamp(-qmax, qmax)
        return Quantized(codes, _stored(scale, scheme.scale_bits), None)
    if scheme.codec == "signed_max":
        half = 2 ** (b - 1)
        idx = xg.abs().argmax(-1, keepdim=True)
        scale = xg.gather(-1, idx) / -half
        # The scale is signed (it carries the sign of the extreme value).
        inv = torch.where(scale != 0, 1.0 / torch.where(scale != 0, scale, 1.0), torch.zeros_like(scale))
        codes = torch.floor(xg * inv + half + 0.5).clamp(0, 2 * half - 1)
        return Quantized(codes, _stored(scale, scheme.scale_bits), None)
    if scheme.codec == "minmax":
        codes, scale, mn = minmax_codes(xg, b)
        return Quantized(codes, _stored(scale, scheme.scale_bits), _stored(mn, scheme.zero_bits))
    raise ValueError(f"scheme {scheme.name} has nothing to quantize")


def dequantize_groups(q: Quantized, scheme: QuantScheme) -> torch.Tensor:
    if scheme.codec == "fp8":
        return q.codes.float() * q.scale
    if scheme.codec == "absmax":
        return q.codes * q.scale
    if scheme.codec == "signed_max":
        return (q.codes - 2 ** (scheme.bits - 1)) * q.scale
    return q.codes * q.scale + q.zero


def group_last(x: torch.Tensor, g: int) -> torch.Tensor:
    """[..., n] -> [..., ceil(n/g), g]; a short last group is padded by repeating its last
    element, which changes none of min, max, absmax or the largest-magnitude value."""
    n = x.shape[-1]
    pad = (-n) % g
    if pad:
        x = torch.cat([x, x[..., -1:].expand(*x.shape[:-1], pad)], dim=-1)
    return x.reshape(*x.shape[:-1], -1, g)


def ungroup_last(xg: torch.Tensor, n: int) -> torch.Tensor:
    return xg.reshape(*xg.shape[:-2], -1)[..., :n]


@functools.lru_cache(maxsize=64)
def _unrotated(scheme: QuantScheme) -> QuantScheme:
    """The codec a rotated scheme applies in its rotated basis (built once per scheme, not per call)."""
    return dataclasses.replace(scheme, rotation="", channel_order="halves")


def fake_quant(x: torch.Tensor, scheme: QuantScheme, absmax: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize then dequantize a cached tensor [B, H, T, D]; sink tokens pass through.

    `absmax` is the calibrated per-head absmax ([H]) for calibrated schemes. The residual window
    is not applied here: which tokens are recent depends on the query (see hooks).
    """
    if scheme.is_identity:
        return x
    if scheme.is_engine:
        from .engines.emulations import emulate

        return emulate(scheme, x)
    if scheme.rotation:  # the engine quantizes in its rotated basis; attention reads it back in x's
        y = fake_quant(rotate(x, scheme.rotation, scheme.channel_order), _unrotated(scheme), absmax)
        return unrotate(y, scheme.rotation, scheme.channel_order).to(x.dtype)
    out_dtype = x.dtype
    xf = x.float()
    s = min(scheme.sink, xf.shape[-2])
    body = xf[..., s:, :]
    if body.shape[-2] == 0:
        return x
    bsz, heads, t, d = body.shape
    if scheme.granularity == "token":
        g = min(scheme.group or d, d)
        deq = ungroup_last(dequantize_groups(quantize_groups(group_last(body, g), scheme), scheme), d)
    elif scheme.granularity == "channel":
        bt = body.transpose(-1, -2)
        deq = dequantize_groups(quantize_groups(group_last(bt, scheme.group), scheme), scheme)
        deq = ungroup_last(deq, t).transpose(-1, -2)
    else:
        if absmax is not None:
            a = absmax.float().to(x.device)
            a = a.amax() if scheme.granularity == "tensor" else a
            a = a.reshape(1, -1, 1, 1) if a.dim() == 1 else a.reshape(1, 1, 1, 1)
        elif scheme.scale_source == "unit":
            a = None
        elif scheme.granularity == "tensor":
            a = body.abs().amax().reshape(1, 1, 1, 1)
        else:
            a = body.abs().amax(dim=(0, 2, 3)).reshape(1, -1, 1, 1)
        deq = dequantize_groups(quantize_groups(body, scheme, a), scheme)
    if s:
        deq = torch.cat([xf[..., :s, :], deq], dim=-2)
    return deq.to(out_dtype)


def quantize_query(key_scheme: QuantScheme | None, query: torch.Tensor) -> torch.Tensor:
    """The query attention really uses: some engine formats transform it too (vLLM's FlashAttention 3 casts it
    to fp8 e4m3 when the cache is fp8); every other scheme leaves it as is."""
    if key_scheme is None or not key_scheme.query:
        return query
    from .engines.emulations import get_query_transform

    transform = get_query_transform(key_scheme.query)
    if key_scheme.rotation:  # rotated with the keys, transformed there (llama.cpp: q8 blocks of the rotated query)
        r, o = key_scheme.rotation, key_scheme.channel_order
        return unrotate(transform(rotate(query, r, o)), r, o).to(query.dtype)
    return transform(query).to(query.dtype)
