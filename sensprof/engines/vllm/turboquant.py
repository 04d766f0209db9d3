"""vLLM 0.33 TurboQuant KV dtypes: turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc,
turboquant_3bit_nc (write path -> stored slot bytes -> what the attention kernels read).

Facts (paths relative to the vllm package):
- Presets, quantization/turboquant/config.py::TQ_PRESETS: (key bits, value bits, norm correction)
  k8v4 (8=fp8 e4m3 keys, 4, no), 4bit_nc (4, 4, yes), k3v4_nc (3, 4, yes), 3bit_nc (3, 3, yes).
- One packed slot per (token, kv head), K then V: config.py::key_packed_size / value_packed_size /
  slot_size_aligned; the cache is [num_blocks, block_size, Hk, slot_size_aligned] uint8.
- Store: v1/attention/ops/triton_turboquant_store.py (_tq_fused_store_fp8 / _tq_fused_store_mse,
  launcher triton_turboquant_store). Read: v1/attention/ops/triton_turboquant_decode.py
  (_tq_decode_stage1 for decode and short continuation chunks; _tq_full_dequant_kv + fp16
  `@ Pi_half` for continuation chunks > 128 tokens, backends/turboquant_attn.py).
- First-chunk prefill attends over the raw, unquantized K/V (flash_attn on the batch's own K/V,
  turboquant_attn.py::_prefill_attention); the cache is only read by later steps.
- This module follows the default CUDA/XPU path (AoS slots). ROCm gfx950 with FlyDSL uses the SoA
  store (ops/turboquant_soa), which folds 1/||c|| into the stored fp16 norm at write time: same
  codes, slightly different rounding of the norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...constants import FP8_E4M3_MAX as FP8_MAX
from .turboquant_codebook import centroids, hadamard, midpoints

# config.py::TQ_PRESETS
PRESETS: dict[str, tuple[int, int, bool]] = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}


# ---------------------------------------------------------------- layout / engine facts


def slot_layout(preset: str, head_dim: int) -> dict[str, int]:
    """Bytes per token per kv head (config.py properties; the slot holds K and V together)."""
    kb, vb, _ = PRESETS[preset]
    if kb == 8:
        key = head_dim  # 1 fp8 byte per element, no scale
    else:
        key = math.ceil(head_dim * kb / 8) + 2  # packed indices + fp16 ||k||
    val = math.ceil(head_dim * vb / 8) + 4  # packed codes + fp16 scale + fp16 zero (= min)
    slot = key + val
    return {"key": key, "value": val, "slot": slot, "slot_aligned": slot + slot % 2}


def supports_head_dim(preset: str, head_dim: int) -> bool:
    """MSE keys need the d x d Hadamard (power of two); 3-bit packing works in groups of 8."""
    kb, vb, _ = PRESETS[preset]
    if kb != 8 and (head_dim & (head_dim - 1) or head_dim < 8):
        return False
    return not (vb == 3 and head_dim % 8)


def boundary_skip_layers(num_hidden_layers: int, is_hybrid: bool = False, n: int = 2) -> list[int]:
    """config.py::TurboQuantConfig.get_boundary_skip_layers, applied by engine/arg_utils.py.

    Dense: the first and last min(2, L // 2) decoder-layer indices (of num_hidden_layers) run at
    the model dtype ("auto"); hybrid (attention + mamba/linear): none.
    """
    if is_hybrid or n <= 0 or num_hidden_layers <= 0:
        return []
    n = min(n, num_hidden_layers // 2)
    return sorted(set(range(n)) | set(range(num_hidden_layers - n, num_hidden_layers)))


# ---------------------------------------------------------------- fp8 keys (k8v4)


def quantize_key_fp8(x: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3fn bytes (uint8) as _tq_fused_store_fp8 writes them, no scale.

    Key (model dtype) -> fp32 -> tl.float8e4nv; Triton lowers that to cvt.rn.satfinite on sm89+:
    round-to-nearest-even, clamped to +-448 (torch's own cast would give NaN past 464).
    """
    y = x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return y.view(torch.uint8)


def dequantize_key_fp8(b: torch.Tensor) -> torch.Tensor:
    return b.view(torch.float8_e4m3fn).float()


def _f32_to_f16_rtz(x: torch.Tensor) -> torch.Tensor:
    h = x.half()
    over = h.float().abs() > x.abs()  # RNE went away from zero (or to inf): step one ulp back
    return torch.where(over, (h.view(torch.int16) - 1).view(torch.float16), h)


def quantize_key_fp8_e4b15(x: torch.Tensor) -> torch.Tensor:
    """Pre-sm89 (Ampere/Ada) k8v4 key bytes: Triton's fp8e4b15 (e4m3 layout, exponent bias 15).

    triton/language/extra/cuda/utils.py (Triton 3.9) convert_custom_float8 +
    convert_float16_to_fp8e4b15: fp32 -> fp16 rounding toward zero, |h| clamped to 1.75 (0x3F00),
    byte = sign | ((bits(|h|) + 0x40) >> 7), i.e. ties away from zero. Keys saturate at +-1.75.
    """
    h = _f32_to_f16_rtz(x.float()).view(torch.int16).to(torch.int32)
    mag = (h & 0x7FFF).clamp(max=0x3F00)
    return (((h >> 8) & 0x80) | ((mag + 0x40) >> 7)).to(torch.uint8)


def dequantize_key_fp8_e4b15(b: torch.Tensor) -> torch.Tensor:
    """convert_fp8e4b15_to_float16: fp16 bits = sign << 8 | (byte & 0x7F) << 7 (exact)."""
    b = b.to(torch.int32)
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    return bits.to(torch.int16).view(torch.float16).float()


# ---------------------------------------------------------------- MSE keys (Hadamard + Lloyd-Max)


def quantize_key_mse(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices int64 [..., d], fp16 norms [...]) as triton_turboquant_store's MSE path makes them.

    ||k|| in fp32, x_hat = k / (||k|| + 1e-8), y = x_hat @ H (fp32), index = number of float32
    midpoints <= y (the kernel's binary search with `y >= mid`); the stored norm is fp16(||k||).
    """
    d = x.shape[-1]
    k = x.float().reshape(-1, d)
    norms = k.norm(dim=1, keepdim=True)
    y = (k / (norms + 1e-8)) @ hadamard(d).to(k.device)
    idx = torch.searchsorted(midpoints(d, bits).to(k.device), y.contiguous(), right=True)
    return idx.reshape(x.shape), norms.reshape(x.shape[:-1]).half()


def rotated_key_read(idx: torch.Tensor, norm16: torch.Tensor, bits: int, nc: bool) -> torch.Tensor:
    """The rotated key the decode kernel scores against: fp16 norm * centroid[idx], and with norm
    correction the centroid vector divided by sqrt(sum c^2 + 1e-16) (_tq_decode_stage1)."""
    c = centroids(idx.shape[-1], bits).to(idx.device)[idx]
    if nc:
        c = c * (1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16))
    return norm16.float().unsqueeze(-1) * c


# ---------------------------------------------------------------- values (uniform asymmetric)


def quantize_value(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes int32, fp16 scale, fp16 zero) as _store_quantized_value computes them.

    Per (token, head) over the whole head_dim, fp32: scale = (max - min) / (2**bits - 1) floored at
    1e-8, code = int((v - min) / scale + 0.5) clamped; scale and min are then stored as fp16.
    On NVIDIA GPUs Triton compiles fp32 `/` to div.full.f32 (<= 2 ulp), so a code sitting within
    an ulp or two of a rounding boundary can differ from this IEEE division (rare).
    """
    v = x.float()
    lo = v.amin(-1, keepdim=True)
    hi = v.amax(-1, keepdim=True)
    top = 2**bits - 1
    scale = (hi - lo) / float(top)
    scale = torch.where(scale > 1e-8, scale, torch.full_like(scale, 1e-8))
    codes = ((v - lo) / scale + 0.5).to(torch.int32).clamp(0, top)
    return codes, scale.squeeze(-1).half(), lo.squeeze(-1).half()


def dequantize_value(codes: torch.Tensor, scale16: torch.Tensor, zero16: torch.Tensor) -> torch.Tensor:
    """code * scale + zero in fp32 (decode kernel; the bulk dequant then rounds this to fp16)."""
    return codes.float() * scale16.float().unsqueeze(-1) + zero16.float().unsqueeze(-1)


# ---------------------------------------------------------------- bit packing


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """4-bit: element 2i in the low nibble of byte i. 3-bit: each run of 8 codes is a 24-bit
    little-endian word (code j at bit 3j) in 3 bytes. Matches the store kernels."""
    c = codes.to(torch.int64)
    if bits == 4:
        c = c.reshape(*c.shape[:-1], -1, 2)
        return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    if bits == 3:
        g = c.reshape(*c.shape[:-1], -1, 8)
        w = (g << (3 * torch.arange(8, device=g.device))).sum(-1)
        return torch.stack([(w >> s) & 0xFF for s in (0, 8, 16)], -1).flatten(-2).to(torch.uint8)
    raise ValueError(bits)


def unpack_codes(b: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """The read kernels' gather: bits [bits*j, bits*j + bits) of the little-endian byte stream."""
    b16 = torch.cat([b, torch.zeros_like(b[..., :1])], -1).to(torch.int64)
    off = torch.arange(d, device=b.device) * bits
    raw = b16[..., off // 8] | (b16[..., off // 8 + 1] << 8)
    return (raw >> (off % 8)) & ((1 << bits) - 1)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8).reshape(*x.shape, 2)  # little-endian, as the kernel


def store_slot(k: torch.Tensor, v: torch.Tensor, preset: str) -> torch.Tensor:
    """The uint8 cache slot [..., slot_size_aligned] vLLM writes for each (token, head).

    [key bytes | (norm fp16) | value codes | scale fp16 | zero fp16 | pad to even].
    """
    kb, vb, _ = PRESETS[preset]
    lay = slot_layout(preset, k.shape[-1])
    if kb == 8:
        kpart = quantize_key_fp8(k)
    else:
        idx, n16 = quantize_key_mse(k, kb)
        kpart = torch.cat([pack_codes(idx, kb), _f16_bytes(n16)], -1)
    codes, s16, z16 = quantize_value(v, vb)
    parts = [kpart, pack_codes(codes, vb), _f16_bytes(s16), _f16_bytes(z16)]
    if lay["slot_aligned"] != lay["slot"]:
        parts.append(torch.zeros_like(kpart[..., :1]))
    return torch.cat(parts, -1)


def read_slot(
    slot: torch.Tensor, preset: str, d: int, rotated: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) float32 the decode kernel uses, parsed from stored bytes; K back in the model basis
    unless `rotated` (for MSE keys the kernel itself scores against the rotated key)."""
    kb, vb, nc = PRESETS[preset]
    lay = slot_layout(preset, d)
    if kb == 8:
        k = dequantize_key_fp8(slot[..., :d].contiguous())
    else:
        mb = lay["key"] - 2
        n16 = slot[..., mb : mb + 2].contiguous().view(torch.float16).squeeze(-1)
        k = rotated_key_read(unpack_codes(slot[..., :mb], kb, d), n16, kb, nc)
        if not rotated:
            k = k @ hadamard(d).to(k.device)
    vs = slot[..., lay["key"] : lay["key"] + lay["value"]]
    vd = lay["value"] - 4
    s16 = vs[..., vd : vd + 2].contiguous().view(torch.float16).squeeze(-1)
    z16 = vs[..., vd + 2 : vd + 4].contiguous().view(torch.float16).squeeze(-1)
    return k, dequantize_value(unpack_codes(vs[..., :vd], vb, d), s16, z16)


# ---------------------------------------------------------------- emulations (quantize -> store -> read)


def _key_fp8(x: torch.Tensor) -> torch.Tensor:
    """vllm.turboquant_k8v4.K: fp8 e4m3 keys (RNE, saturating), no scale, no rotation; the decode
    kernel multiplies them with the unrotated query in fp32. On sm < 8.9 see _key_fp8_e4b15."""
    return dequantize_key_fp8(quantize_key_fp8(x))


def _key_fp8_e4b15(x: torch.Tensor) -> torch.Tensor:
    """turboquant_k8v4 keys on Ampere/Ada (ops/triton_turboquant_decode.py::_use_fp8_e4b15:
    capability < (8, 9)): Triton fp8e4b15, saturating at +-1.75."""
    return dequantize_key_fp8_e4b15(quantize_key_fp8_e4b15(x))


def _key_mse(bits: int, nc: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        idx, n16 = quantize_key_mse(x, bits)
        return rotated_key_read(idx, n16, bits, nc) @ hadamard(x.shape[-1]).to(x.device)

    fn.__doc__ = (
        f"{bits}-bit Lloyd-Max keys after the Hadamard rotation{', norm-corrected on read' if nc else ''}. "
        "vLLM never un-rotates: it scores q @ H against the rotated dequantized key. This returns that "
        "key rotated back (@ H, H = H^-1), so plain q.k equals vLLM's rotated product up to float error."
    )
    return fn


def _value(bits: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return dequantize_value(*quantize_value(x, bits))

    fn.__doc__ = f"{bits}-bit asymmetric per-(token, head) values, fp16 scale and zero, read in fp32."
    return fn


def continuation_read(x: torch.Tensor, preset: str, which: str, model_dtype=torch.bfloat16) -> torch.Tensor:
    """What a long continuation chunk (> 128 new tokens with a cached prefix) reads instead:
    _tq_full_dequant_kv rounds K (rotated) and V to fp16, K then goes through an fp16 `@ Pi_half`,
    and both are cast to the model dtype before flash_attn. Approximate for K (the fp16 GEMM's
    accumulation order is cuBLAS's)."""
    kb, vb, nc = PRESETS[preset]
    if which == "V":
        return dequantize_value(*quantize_value(x, vb)).half().to(model_dtype).float()
    if kb == 8:
        return _key_fp8(x).half().to(model_dtype).float()
    idx, n16 = quantize_key_mse(x, kb)
    kr = rotated_key_read(idx, n16, kb, nc).half().float()
    h16 = hadamard(x.shape[-1]).to(x.device).half().float()
    return (kr @ h16).half().to(model_dtype).float()


_V4 = _value(4)
_K3 = _key_mse(3, True)
EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.turboquant_k8v4.K": _key_fp8,
    "vllm.turboquant_k8v4.V": _V4,
    "vllm.turboquant_4bit_nc.K": _key_mse(4, True),
    "vllm.turboquant_4bit_nc.V": _V4,
    "vllm.turboquant_k3v4_nc.K": _K3,
    "vllm.turboquant_k3v4_nc.V": _V4,
    "vllm.turboquant_3bit_nc.K": _K3,
    "vllm.turboquant_3bit_nc.V": _value(3),
}
# Same codec names as vLLM runs them on sm80/sm86 (A100, A10, RTX 30xx) and sm < 8.9 in general:
# only the k8v4 key differs (fp8e4b15); every other entry is as in EMULATIONS.
EMULATIONS_PRE_SM89: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    **EMULATIONS,
    "vllm.turboquant_k8v4.K": _key_fp8_e4b15,
}
# Ampere (sm < 8.9) k8v4 keys, under their own name so a plan can say which GPU it was made for.
EMULATIONS["vllm.turboquant_k8v4_e4b15.K"] = _key_fp8_e4b15
