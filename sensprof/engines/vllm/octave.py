"""vLLM 0.33 Octave KV dtypes (``octave_k3v4``, ``octave_k3v3``, ``octave_k3v3_compact``), ROCm only.

Facts (all from ``v1/attention/ops/rocm_octave.py`` unless said otherwise):

* Every (token, KV head) is one uint8 slot ``[k_rope codes][k_nope codes][v codes][fp16 scales][0 pad]``
  padded to 8 bytes (4 for compact K) (``OctaveFormat.slot_bytes``; the backend publishes it as
  ``state_content_bytes`` in ``RocmOctaveAttentionBackend.customize_spec``).
* Rotation: x * s then an orthonormal Walsh-Hadamard transform, s a fixed +-1 pattern of length
  head_size (``torch.randint`` seeded 0x5E17, ``_signs_cpu``), the same pattern for K, V and the query.
  Block K rotates each 64-dim block; compact K rotates the whole head; V rotates the whole head when
  head_size is a power of two, else 64-dim blocks (``v_block``).
* Block K (k3v4, k3v3): the first ``rope_dim`` dims (the rotary part) get 4-bit codes, the rest 3-bit,
  one fp16 scale per 64-dim block. Compact K: 3-bit codes over all dims, one scale. V: ``v_bits`` codes
  (4 for k3v4, 3 otherwise), one scale.
* Codes: nearest entry of an int8 Lloyd-Max N(0,1) codebook ``LUT`` to ``x / rms * LUT_MULT``
  (``torch.bucketize`` on the midpoints, so an exact tie takes the lower code); the scale is chosen so
  that ``x . x_hat = |x|^2`` (not least squares) and stored as fp16 of ``scale * 64``
  (``_quantize_lut``). A code reads back as ``LUT[c] * fp16_scale / 64`` (``reference_dequantize``).
* Attention scores are taken in the rotated space with the query rotated like K, and the output is
  rotated back (``backends/rocm_octave_attn.py``), so q . unrotate(k_hat) is what attention sees.

The emulations below return the dequantized tensor rotated back to the input basis. They are for
*cached* tokens: decode and chunks of <= 128 query tokens read everything from the packed cache, but a
longer prefill chunk attends to its own tokens' K/V unquantized (fp16, rotated) and only to the cached
prefix packed (``RocmOctaveAttentionImpl._prefill``). Runs only on ROCm RDNA3 (gfx11) / CDNA3 (gfx942)
with head_size 256 and 64 rotary dims (``supports_compute_capability``, ``RocmOctaveAttentionImpl``).
Golden-checked against vLLM's PyTorch reference; the HIP store/decode kernels are not in the wheel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

HADAMARD_BLOCK = 64
SIGN_SEED = 0x5E17
ROPE_BITS, NOPE_BITS = 4, 3
LUT = {
    3: (-127, -79, -45, -14, 14, 45, 79, 127),
    4: (-126, -95, -74, -58, -43, -30, -18, -6, 6, 18, 30, 43, 58, 74, 95, 126),
}
LUT_MULT = {3: 59.0, 4: 46.0}
LUT_ONE = 64.0
# cache dtype -> (v_bits, compact K)   (OctaveFormat.from_cache_dtype)
PRESETS = {"octave_k3v4": (4, False), "octave_k3v3": (3, False), "octave_k3v3_compact": (3, True)}
# The only shape the ROCm kernels accept (backends/rocm_octave_attn.py: _KERNEL_HEAD_SIZE/_KERNEL_ROPE_DIM).
KERNEL_HEAD_SIZE, KERNEL_ROPE_DIM = 256, 64


@dataclass(frozen=True)
class Layout:
    """Byte layout of one slot (pure arithmetic; mirrors OctaveFormat's offsets)."""

    preset: str
    head_dim: int
    rope_dim: int

    def __post_init__(self):
        d, r = self.head_dim, self.rope_dim
        if self.preset not in PRESETS:
            raise ValueError(f"unknown Octave preset {self.preset!r}")
        if d % HADAMARD_BLOCK or r % HADAMARD_BLOCK or not 0 <= r <= d or d == 0:
            raise ValueError(f"Octave needs head_dim and rope_dim in multiples of 64; got {d}, {r}")
        if self.compact and d & (d - 1):
            raise ValueError(f"compact Octave K needs a power-of-two head_dim, got {d}")

    @property
    def v_bits(self) -> int:
        return PRESETS[self.preset][0]

    @property
    def compact(self) -> bool:
        return PRESETS[self.preset][1]

    @property
    def wide_dim(self) -> int:
        """K dims with 4-bit codes: the rotary dims, none for compact K."""
        return 0 if self.compact else self.rope_dim

    @property
    def k_code_bytes(self) -> int:
        return (self.wide_dim * ROPE_BITS + (self.head_dim - self.wide_dim) * NOPE_BITS) // 8

    @property
    def v_code_bytes(self) -> int:
        return self.head_dim * self.v_bits // 8

    @property
    def k_scales(self) -> int:
        return 1 if self.compact else self.head_dim // HADAMARD_BLOCK

    @property
    def slot_bytes(self) -> int:
        raw = self.k_code_bytes + self.v_code_bytes + 2 * (self.k_scales + 1)
        align = 4 if self.compact else 8
        return -(-raw // align) * align

    @property
    def pad_bytes(self) -> int:
        return self.slot_bytes - self.k_code_bytes - self.v_code_bytes - 2 * (self.k_scales + 1)


# ---------------------------------------------------------------- rotation
@functools.cache
def _sign_vector(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SIGN_SEED)
    bits = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64)
    return (1 - 2 * bits).to(torch.float32)


def signs(n: int, device=None) -> torch.Tensor:
    """The fixed +-1 pattern (bit 1 -> -1), float32."""
    return _sign_vector(n).to(device) if device is not None else _sign_vector(n)


def fwht(x: torch.Tensor, block: int) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard over consecutive `block`-dim chunks of the last dim (float32).

    Radix-2 butterflies with stride 1, 2, 4, ... then one multiply by 1/sqrt(block): the same
    summation order as vLLM's ``fwht_blocks``, so rotated values (and hence codes) agree bit for bit.
    """
    shape = x.shape
    y = x.float().reshape(-1, block)
    stride = 1
    while stride < block:
        pairs = y.reshape(y.shape[0], block // (2 * stride), 2, stride)
        lo, hi = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((lo + hi, lo - hi), dim=2).reshape(-1, block)
        stride *= 2
    return (y * (1.0 / math.sqrt(block))).reshape(shape)


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    return fwht(x.float() * signs(x.shape[-1], x.device), block)


def unrotate(y: torch.Tensor, block: int) -> torch.Tensor:
    return fwht(y, block) * signs(y.shape[-1], y.device)


def v_block(head_dim: int) -> int:
    return head_dim if head_dim & (head_dim - 1) == 0 else HADAMARD_BLOCK


def k_block(lay: Layout) -> int:
    return lay.head_dim if lay.compact else HADAMARD_BLOCK


# ---------------------------------------------------------------- codebook quantizer
def _lut(bits: int, device) -> torch.Tensor:
    return torch.tensor(LUT[bits], dtype=torch.float32, device=device)


def quantize_lut(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (uint8) and stored fp16 scales (``scale * 64``) for each last-dim row of rotated x."""
    lut = _lut(bits, x.device)
    ss = x.pow(2).sum(-1, keepdim=True)
    rms = (ss / x.shape[-1]).sqrt().clamp_min(1e-12)
    codes = torch.bucketize(x / rms * LUT_MULT[bits], (lut[1:] + lut[:-1]) / 2)
    dot = (x * lut[codes]).sum(-1, keepdim=True)
    scale = torch.where(dot > 0, ss / dot.clamp_min(1e-30), 0.0) * LUT_ONE
    return codes.to(torch.uint8), scale.to(torch.float16)


def dequantize_lut(codes: torch.Tensor, scale16: torch.Tensor, bits: int) -> torch.Tensor:
    return _lut(bits, codes.device)[codes.long()] * (scale16.float() / LUT_ONE)


# ---------------------------------------------------------------- bit packing
def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., n] -> bytes. 4 bits: per 8 dims, byte j = dim j | dim j+4 << 4. 3 bits: a 2-bit
    plane (per 16 dims, byte j bits 2i..2i+1 = dim 4i+j) then a 1-bit plane (per 32 dims, byte j
    bit i = dim 4i+j)."""
    c = codes.to(torch.int64)
    lead, n = c.shape[:-1], c.shape[-1]
    if bits == 4:
        g = c.reshape(*lead, n // 8, 2, 4)
        return (g[..., 0, :] | (g[..., 1, :] << 4)).reshape(*lead, n // 2).to(torch.uint8)
    lo = (c & 3).reshape(*lead, n // 16, 4, 4)
    hi = (c >> 2).reshape(*lead, n // 32, 8, 4)
    lo_b = torch.zeros_like(lo[..., 0, :])
    for i in range(4):
        lo_b |= lo[..., i, :] << (2 * i)
    hi_b = torch.zeros_like(hi[..., 0, :])
    for i in range(8):
        hi_b |= hi[..., i, :] << i
    return torch.cat((lo_b.reshape(*lead, n // 4), hi_b.reshape(*lead, n // 8)), -1).to(torch.uint8)


def unpack(packed: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    p = packed.to(torch.int64)
    lead = p.shape[:-1]
    if bits == 4:
        g = p.reshape(*lead, n // 8, 1, 4)
        return torch.cat((g & 15, g >> 4), -2).reshape(*lead, n)
    lo = p[..., : n // 4].reshape(*lead, n // 16, 1, 4)
    hi = p[..., n // 4 :].reshape(*lead, n // 32, 1, 4)
    lo_c = (lo >> (2 * torch.arange(4, device=p.device)).view(4, 1)) & 3
    hi_c = (hi >> torch.arange(8, device=p.device).view(8, 1)) & 1
    return lo_c.reshape(*lead, n) + 4 * hi_c.reshape(*lead, n)


# ---------------------------------------------------------------- K and V
def quantize_k(x: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """K [..., D] -> (packed codes [..., k_code_bytes] uint8, fp16 scales [..., k_scales])."""
    d = lay.head_dim
    k = rotate(x, k_block(lay))
    if lay.compact:
        codes, sc = quantize_lut(k, NOPE_BITS)
        return pack(codes, NOPE_BITS), sc
    kb = k.reshape(*k.shape[:-1], d // HADAMARD_BLOCK, HADAMARD_BLOCK)
    nr = lay.rope_dim // HADAMARD_BLOCK
    cr, sr = quantize_lut(kb[..., :nr, :], ROPE_BITS)
    cn, sn = quantize_lut(kb[..., nr:, :], NOPE_BITS)
    lead = k.shape[:-1]
    packed = torch.cat(
        (pack(cr.reshape(*lead, lay.rope_dim), ROPE_BITS), pack(cn.reshape(*lead, d - lay.rope_dim), NOPE_BITS)), -1
    )
    return packed, torch.cat((sr[..., 0], sn[..., 0]), -1)


def dequantize_k(packed: torch.Tensor, scales: torch.Tensor, lay: Layout, rotated: bool = False) -> torch.Tensor:
    d = lay.head_dim
    lead = packed.shape[:-1]
    if lay.compact:
        k = dequantize_lut(unpack(packed, d, NOPE_BITS), scales, NOPE_BITS)
    else:
        split = lay.rope_dim * ROPE_BITS // 8
        idx = torch.cat((unpack(packed[..., :split], lay.rope_dim, ROPE_BITS),
                         unpack(packed[..., split:], d - lay.rope_dim, NOPE_BITS)), -1)
        vals = torch.cat((_lut(ROPE_BITS, packed.device)[idx[..., : lay.rope_dim]],
                          _lut(NOPE_BITS, packed.device)[idx[..., lay.rope_dim :]]), -1)
        vals = vals.reshape(*lead, d // HADAMARD_BLOCK, HADAMARD_BLOCK)
        k = (vals * (scales.float() / LUT_ONE)[..., None]).reshape(*lead, d)
    return k if rotated else unrotate(k, k_block(lay))


def quantize_v(x: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """V [..., D] -> (packed codes [..., v_code_bytes] uint8, fp16 scale [..., 1])."""
    codes, sc = quantize_lut(rotate(x, v_block(lay.head_dim)), lay.v_bits)
    return pack(codes, lay.v_bits), sc


def dequantize_v(packed: torch.Tensor, scale: torch.Tensor, lay: Layout, rotated: bool = False) -> torch.Tensor:
    v = dequantize_lut(unpack(packed, lay.head_dim, lay.v_bits), scale, lay.v_bits)
    return v if rotated else unrotate(v, v_block(lay.head_dim))


def quantize_slots(key: torch.Tensor, value: torch.Tensor, lay: Layout) -> torch.Tensor:
    """K, V [..., D] -> the uint8 slots [..., slot_bytes] exactly as vLLM lays them out (pad = 0)."""
    kc, ks = quantize_k(key, lay)
    vc, vs = quantize_v(value, lay)
    sc = torch.cat((ks, vs), -1).contiguous().view(torch.uint8)
    pad = torch.zeros(*kc.shape[:-1], lay.pad_bytes, dtype=torch.uint8, device=kc.device)
    return torch.cat((kc, vc, sc, pad), -1)


def dequantize_slots(slots: torch.Tensor, lay: Layout, rotated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    o_v = lay.k_code_bytes
    o_s = o_v + lay.v_code_bytes
    sc = slots[..., o_s : o_s + 2 * (lay.k_scales + 1)].contiguous().view(torch.float16)
    k = dequantize_k(slots[..., :o_v], sc[..., : lay.k_scales], lay, rotated)
    v = dequantize_v(slots[..., o_v:o_s], sc[..., lay.k_scales :], lay, rotated)
    return k, v


# ---------------------------------------------------------------- emulations
def _layout(preset: str, x: torch.Tensor, rope_dim: int) -> Layout:
    return Layout(preset, x.shape[-1], min(rope_dim, x.shape[-1]))


def emulate_k(x: torch.Tensor, preset: str, rope_dim: int = KERNEL_ROPE_DIM) -> torch.Tensor:
    """What attention reads for cached K, rotated back: q . result == q_rot . k_hat_rot (float error).

    rope_dim is the model's rotary dim (head_dim * partial_rotary_factor, ``rope_dim_from_hf_config``);
    the default 64 is the only value the ROCm kernels accept.
    """
    lay = _layout(preset, x, rope_dim)
    return dequantize_k(*quantize_k(x.float(), lay), lay)


def emulate_v(x: torch.Tensor, preset: str, rope_dim: int = KERNEL_ROPE_DIM) -> torch.Tensor:
    """What attention reads for cached V, rotated back (vLLM rotates the attention output back)."""
    lay = _layout(preset, x, rope_dim)
    return dequantize_v(*quantize_v(x.float(), lay), lay)


def emulation(preset: str, tensor: str, rope_dim: int = KERNEL_ROPE_DIM) -> Callable[[torch.Tensor], torch.Tensor]:
    fn = emulate_k if tensor == "K" else emulate_v
    return functools.partial(fn, preset=preset, rope_dim=rope_dim)


EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    f"vllm.{p}.{t}": emulation(p, t) for p in PRESETS for t in ("K", "V")
}
