"""vLLM 0.33 per-(token, head) KV dtypes: ``int4_per_token_head``, ``int8_per_token_head``, ``fp8_per_token_head``.

Facts (paths relative to the ``vllm`` package):

* Only the Triton backend takes these dtypes (``v1/attention/backends/triton_attn.py``,
  ``TritonAttentionBackend.supported_kv_cache_dtypes``). Each (token, KV head) holds the head's codes then
  one float32 scale, for K and for V (``customize_spec``; ``_ensure_scale_caches``).
* int8 / fp8 write: ``v1/attention/ops/triton_reshape_and_cache_flash.py``, ``_reshape_cache_per_token_head``:
  x in fp32, ``scale = max(absmax / QMAX, 1e-6)``, ``q = x * (1 / scale)``; int8 adds +-0.5 (half away from
  zero), clamps to [-128, 127] and the int8 store truncates; fp8 clamps to +-448 (e4m3fn; +-224 on fnuz ROCm)
  and the store rounds to nearest even. Read (``triton_unified_attention.py``): code cast to the query dtype
  (exact) and the fp32 scale applied to the score / to P, i.e. ``code * scale``.
* int4 write: ``v1/attention/ops/int4_per_token_head.py``, ``reshape_and_cache_int4``: K and V are first
  rotated, ``single_rht(x.float()).to(x.dtype)`` = H_b (D * x) blockwise, H_b the unnormalized Sylvester
  Hadamard matrix of size b = largest power-of-two divisor of head_dim, D a +-1 vector of length b from
  ``torch.bernoulli`` with a CPU generator seeded ``0x9E3779B9`` (``_get_rht_signs``). Then
  ``_reshape_cache_int4_kernel``: ``scale = max((max - min) / 15, 1e-6)``, ``zp = clamp(rha(-min / scale), 0, 15)``,
  ``code = clamp(rha(x * (1 / scale) + zp), 0, 15)`` with rha = round half away from zero (``trunc(v +- 0.5)`` in
  fp32); even dims in the low nibble, odd dims in the high nibble; the stored fp32 scale is the scale's bits with
  the low 4 mantissa bits replaced by zp. Read (``_attn_packed``): ``(code - zp) * (scale bits & ~0xF)``.
  The query is rotated the same way and the softmax scale divided by b (``unified_attention_int4``), and the
  output is rotated back and divided by b, so attention sees ``q . rht^-1(k_rot_hat) / b``.

Known divergences from a GPU (not checkable on CPU): Triton's fp32 ``/`` is ``div.full.f32`` (<= 2 ulp) and
mul+add may fuse into an FMA, so a value within an ulp of a rounding boundary can land on the other code; on
CUDA sm80+ ``fast_hadamard_transform`` runs the ``hadacore`` op in bf16 (``rht="hadacore"`` approximates it).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ...constants import FP8_E4M3_MAX
from .nibbles import pack_nibbles, unpack_nibbles

INT4_LEVELS = 15
SCALE_FLOOR = 1e-6
RHT_SEED = 0x9E3779B9
QMAX = {"int8": (127.0, -128.0), "fp8": (FP8_E4M3_MAX, -FP8_E4M3_MAX)}
ZP_MASK = 0xF


def largest_pow2_divisor(d: int) -> int:
    return d & -d


@functools.lru_cache(maxsize=None)
def rht_signs(b: int) -> torch.Tensor:
    """The +-1 vector of ``_get_rht_signs(b, 0)``: Bernoulli(0.5) draws from a CPU generator seeded 0x9E3779B9."""
    gen = torch.Generator(device="cpu").manual_seed(RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((b,), 0.5), generator=gen) - 1.0


def _hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard butterfly along the last (power-of-two) dim, in the same pair order as vLLM's
    CPU tier of ``fast_hadamard_transform``, so fp32 sums round identically."""
    d = x.shape[-1]
    h = 1
    while h < d:
        xv = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = xv[..., 0, :], xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(*x.shape[:-1], d)
        h <<= 1
    return x


def _hadacore(x: torch.Tensor) -> torch.Tensor:
    """Approximation of the CUDA path: x to bf16, H x / sqrt(d) rounded to bf16, times sqrt(d) in fp32."""
    d = x.shape[-1]
    y = _hadamard(x.bfloat16().float()) / d**0.5
    return y.bfloat16().float() * d**0.5


def single_rht(x: torch.Tensor, inverse: bool = False, rht: str = "exact") -> torch.Tensor:
    """vLLM's ``single_rht`` on fp32 x: forward H(D x), inverse D(H x), blockwise over b-sized blocks."""
    d = x.shape[-1]
    b = largest_pow2_divisor(d)
    xb = x.reshape(*x.shape[:-1], d // b, b)
    s = rht_signs(b).to(x.device)
    had = _hadacore if rht == "hadacore" else _hadamard
    y = had(xb) * s if inverse else had(xb * s)
    return y.reshape(x.shape)


def _rha_trunc(v: torch.Tensor) -> torch.Tensor:
    """``where(v >= 0, v + 0.5, v - 0.5).to(int32)`` in fp32: half away from zero, with the fp32 add's rounding."""
    return torch.where(v >= 0, v + 0.5, v - 0.5).trunc()


def quantize_int4(x: torch.Tensor, rht: str = "exact"):
    """Stored int4 cache for x [..., D] (D even): (packed uint8 [..., D/2], fp32 scale-with-zp [...]).

    x is what the model hands vLLM (bf16/fp16/fp32); it is rotated in fp32 and rounded back to x.dtype.
    """
    xr = single_rht(x.float(), rht=rht).to(x.dtype).float()
    mn = xr.amin(-1)
    mx = xr.amax(-1)
    scale = torch.clamp((mx - mn) / 15.0, min=SCALE_FLOOR)
    zp = _rha_trunc(-mn / scale).clamp(0.0, 15.0)
    inv = 1.0 / scale
    codes = _rha_trunc(xr * inv[..., None] + zp[..., None]).clamp(0.0, 15.0).to(torch.uint8)
    packed = pack_nibbles(codes)
    bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return packed, bits.view(torch.float32)


def dequantize_int4_rotated(packed: torch.Tensor, scale_zp: torch.Tensor) -> torch.Tensor:
    """What the read kernel multiplies with the rotated query: (code - zp) * (scale bits & ~0xF)."""
    codes = unpack_nibbles(packed).float()
    bits = scale_zp.view(torch.int32)
    zp = (bits & ZP_MASK).float()
    scale = (bits & -16).view(torch.float32)
    return (codes - zp[..., None]) * scale[..., None]


def int4_per_token_head(x: torch.Tensor, rht: str = "exact") -> torch.Tensor:
    """K or V as attention sees it, in x's basis (float32): rht^-1(dequantized rotated) / b.

    q . result equals vLLM's score ``rht(q) . k_rot_hat / b`` up to float error (vLLM also rounds rht(q) to
    the query dtype, a query-side effect not applied here); for V the same map gives vLLM's output.
    """
    b = largest_pow2_divisor(x.shape[-1])
    deq = dequantize_int4_rotated(*quantize_int4(x, rht=rht))
    return single_rht(deq, inverse=True) / b


def quantize_per_token_head(x: torch.Tensor, fmt: str):
    """Stored int8 / fp8 cache for x [..., D]: (codes as torch.int8 or float8_e4m3fn, fp32 scale [...])."""
    qmax, qmin = QMAX[fmt]
    xf = x.float()
    scale = torch.clamp(xf.abs().amax(-1) / qmax, min=SCALE_FLOOR)
    q = xf * (1.0 / scale)[..., None]
    if fmt == "int8":
        return _rha_trunc(q).clamp(qmin, qmax).to(torch.int8), scale
    return q.clamp(qmin, qmax).to(torch.float8_e4m3fn), scale


def _per_token_head(fmt: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        codes, scale = quantize_per_token_head(x, fmt)
        return codes.float() * scale[..., None]

    fn.__name__ = f"{fmt}_per_token_head"
    fn.__doc__ = f"{fmt} per-(token, head) absmax: code * fp32 scale, float32 (no rotation, no query change)."
    return fn


int8_per_token_head = _per_token_head("int8")
fp8_per_token_head = _per_token_head("fp8")


def naive_int4_symmetric(x: torch.Tensor) -> torch.Tensor:
    """Baseline for comparison only (not a vLLM format): per-(token, head) absmax int4 in +-7, no rotation."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True) / 7.0
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return _rha_trunc(xf * inv).clamp(-7, 7) * scale


EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.int4_per_token_head": int4_per_token_head,
    "vllm.int8_per_token_head": int8_per_token_head,
    "vllm.fp8_per_token_head": fp8_per_token_head,
}
