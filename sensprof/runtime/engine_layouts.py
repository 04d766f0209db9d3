"""Engine formats the runtime stores as the engine does, and reads packed (the rest are emulated for profiling only).

Each layout packs a chunk of K or V into a Quantized (codes, scale, zero), reads it back densely (exactly the
profiler's emulation, for prefill) and describes it as a PackedRead for the decode kernels, in the engine's basis:
a rotated layout also says how to rotate the query and the dense tail into it, and the output back.

- vLLM int4_per_token_head: Hadamard-rotated K / V, 4-bit codes per (token, head) with one fp32 word holding the
  scale and, in its low 4 mantissa bits, the zero-point (engines/vllm/per_token_head.py). Held as vLLM holds it: the
  codes as 4 bit-planes (D / 2 bytes, as its nibbles) and the fp32 word, which the kernels split as they read
  (PackedRead.word). Written in one pass (the backend's quantize_pack_int4_rht, bit for bit the emulation's); a
  decode step rotates the query, the dense tail and the output by the rotation's matrix, one matmul each.
- vLLM TurboQuant (engines/vllm/turboquant.py): Lloyd-Max keys of the Hadamard-rotated unit key, read as
  centroid[code] times a per-token scale (the fp16 norm times vLLM's norm correction, computed once at append and
  held in fp32: 2 bytes per token and head more than vLLM's fp16 norm); fp8 keys (k8v4, and Ampere's e4b15) as
  their bit patterns' table; values min/max per (token, head) with fp16 scale and zero, as vLLM holds them.
- vLLM Octave (ROCm; engines/vllm/octave.py): Lloyd-Max codebook codes of the sign-flipped orthonormal Hadamard
  rotation, with one fp16 scale per 64-dim block of keys (per head for compact keys and for values). Block keys
  give their first rope_dim (64) dims 4-bit codes and the rest 3-bit: held as three bit-planes over every dim plus a
  fourth over the wide dims, all in one row of bytes per token (PackedRead.wide), so a token costs exactly vLLM's
  code bytes; the narrow dims read the 3-bit codebook from the table's upper part.
- vLLM nvfp4 / nvfp4_4over6 and ultraquant_4bit: E2M1 codes (a 16-entry table) with one scale byte per block (e4m3
  per 16; UE8M0 per 32, ultraquant's keys Hadamard-rotated), held as vLLM holds them; the scale bytes are decoded per
  read (T x D / 16 values).
"""

from __future__ import annotations

import functools

import torch

from ..engines.vllm import nvfp4 as fp4
from ..engines.vllm import octave as oc
from ..engines.vllm import turboquant as tq
from ..engines.vllm import ultraquant as uq
from ..engines.vllm.nibbles import unpack_nibbles
from ..engines.vllm.per_token_head import largest_pow2_divisor, single_rht
from ..engines.vllm.turboquant_codebook import centroids, hadamard
from ..quant import Quantized
from .kernels import PackedRead, reference, split_word


@functools.lru_cache(maxsize=None)
def code_table(make, device: str, *args) -> torch.Tensor:
    """A code table (code -> value before scaling), built once per device: every decode step of every layer reads
    one. `make(*args)` builds it on the CPU."""
    return make(*args).float().to(device)


def levels(n: int, offset: float = 0.0) -> torch.Tensor:
    """Integer codes 0 .. n - 1 read as code - offset."""
    return torch.arange(n, dtype=torch.float32) - offset


def patterns(decode) -> torch.Tensor:
    """What each of the 256 byte patterns decodes to: by a function, or as the bits of a float8 dtype."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return b.view(decode) if isinstance(decode, torch.dtype) else decode(b)


def _e2m1() -> torch.Tensor:
    return torch.tensor(uq._BITS_TO_VALUE, dtype=torch.float32)


def _rht_matrix(d: int, inverse: bool, divide: bool) -> torch.Tensor:
    """single_rht as a [d, d] matrix (x @ M = single_rht(x)), optionally over b: the rotation is linear and its
    entries are +-1, so a matmul computes it up to the order of fp32 sums, in one op instead of a butterfly's 25."""
    m = single_rht(torch.eye(d), inverse=inverse)
    return m / largest_pow2_divisor(d) if divide else m


class Int4PerTokenHead:
    rotated = True
    packing = "planes"

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        """y [B, H, T, D] in the model dtype -> bit-planes [4, B, H, T, D / 8] and the fp32 word [B, H, T, 1]."""
        b, h, t, d = y.shape
        codes, word = ops.quantize_pack_int4_rht(y.reshape(-1, d))
        return Quantized(codes.view(4, b, h, t, d // 8), word.view(b, h, t, 1), None)

    def read(self, q: Quantized) -> PackedRead:
        """The rotated values as a kernel reads them: code * scale + (-zp * scale), split from the word."""
        lut = code_table(levels, str(q.codes.device), 16)
        return PackedRead(codes=q.codes, scale=q.scale, zero=None, lut=lut, bits=4, token_group=1,
                          channel_group=q.codes.shape[-1] * 8, offset=0.0, word=True)

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        """Tokens [lo, hi) back in the model's basis (float32), as the profiler's emulation computes them."""
        codes, word = q.codes[:, :, :, lo:hi], q.scale[:, :, lo:hi]
        scale, _ = split_word(word)
        zp = (word.view(torch.int32) & 15).float()
        rotated = (ops.unpack_float(codes, 4) - zp) * scale
        return single_rht(rotated, inverse=True) / largest_pow2_divisor(rotated.shape[-1])

    @staticmethod
    def _times(x: torch.Tensor, inverse: bool, divide: bool) -> torch.Tensor:
        return x.float() @ code_table(_rht_matrix, str(x.device), x.shape[-1], inverse, divide)

    def to_rotated(self, x: torch.Tensor) -> torch.Tensor:
        return self._times(x, False, False)

    def from_rotated(self, y: torch.Tensor) -> torch.Tensor:
        return self._times(y, True, True)

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """q such that q . (rotated key) is the model's q . k: rht(q) / b."""
        return self._times(q, False, True)


class TurboQuantKeys:
    """Lloyd-Max codes of the rotated unit key; the kernel scores the rotated query (q @ H) against
    centroid[code] * scale, as vLLM's decode kernel does."""

    rotated = True
    packing = "planes"

    def __init__(self, bits: int, norm_correction: bool):
        self.bits, self.nc = bits, norm_correction

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        idx, norm16 = tq.quantize_key_mse(y, self.bits)
        c = centroids(y.shape[-1], self.bits).to(y.device)[idx]
        scale = norm16.float()
        if self.nc:
            scale = scale * (1.0 / torch.sqrt((c * c).sum(-1) + 1e-16))
        return Quantized(ops.pack_bitplanes(idx, self.bits), scale.unsqueeze(-1).contiguous(), None)

    def read(self, q: Quantized) -> PackedRead:
        lut = code_table(centroids, str(q.codes.device), q.codes.shape[-1] * 8, self.bits)
        return PackedRead(codes=q.codes, scale=q.scale, zero=None, lut=lut, bits=self.bits, token_group=1,
                          channel_group=q.codes.shape[-1] * 8)

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        codes = q.codes[:, :, :, lo:hi]
        lut = code_table(centroids, str(codes.device), codes.shape[-1] * 8, self.bits)
        rotated = lut[ops.unpack_float(codes, self.bits).long()] * q.scale[:, :, lo:hi]
        return self.from_rotated(rotated)

    @staticmethod
    def to_rotated(x: torch.Tensor) -> torch.Tensor:
        return x.float() @ hadamard(x.shape[-1]).to(x.device)

    from_rotated = to_rotated  # H is symmetric and orthonormal: its own inverse
    query = to_rotated


class TurboQuantFp8Keys:
    """k8v4 keys: fp8 bit patterns, no scale, no rotation (`e4b15`: Triton's fp8e4b15 on GPUs before sm89)."""

    rotated = False
    packing = "bytes"

    def __init__(self, e4b15: bool = False):
        self.write = tq.quantize_key_fp8_e4b15 if e4b15 else tq.quantize_key_fp8
        self.decode = tq.dequantize_key_fp8_e4b15 if e4b15 else tq.dequantize_key_fp8

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        codes = self.write(y)
        return Quantized(codes, codes.new_empty(*codes.shape[:-1], 0, dtype=torch.float32), None)  # no scale

    def read(self, q: Quantized) -> PackedRead:
        b, h, t, d = q.codes.shape
        table = code_table(patterns, str(q.codes.device), self.decode)
        one = torch.ones(1, 1, 1, 1, device=q.codes.device).expand(b, h, t, 1)
        return PackedRead(codes=q.codes, scale=one, zero=None, lut=table, bits=8, token_group=1, channel_group=d,
                          packing="bytes")

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        return self.decode(q.codes[:, :, lo:hi])


class TurboQuantValues:
    """Values min/max per (token, head): codes as bit-planes, fp16 scale and zero as vLLM holds them."""

    rotated = False
    packing = "planes"

    def __init__(self, bits: int):
        self.bits = bits

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        codes, scale, zero = tq.quantize_value(y, self.bits)
        return Quantized(ops.pack_bitplanes(codes, self.bits), scale.unsqueeze(-1).contiguous(),
                         zero.unsqueeze(-1).contiguous())

    def read(self, q: Quantized) -> PackedRead:
        d = q.codes.shape[-1] * 8
        lut = code_table(levels, str(q.codes.device), 2 ** self.bits)
        return PackedRead(codes=q.codes, scale=q.scale, zero=q.zero, lut=lut, bits=self.bits, token_group=1,
                          channel_group=d, offset=0.0)

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        codes = ops.unpack_float(q.codes[:, :, :, lo:hi], self.bits)
        return tq.dequantize_value(codes, q.scale[:, :, lo:hi, 0], q.zero[:, :, lo:hi, 0])


class E2M1Blocks:
    """E2M1 codes times a per-block scale byte (nvfp4: e4m3 per 16 values; ultraquant: UE8M0 per 32)."""

    packing = "planes"

    def __init__(self, group: int, quantize, decode_scale, rotate=None):
        self.group, self.quantize, self.decode_scale, self.rotate = group, quantize, decode_scale, rotate
        self.rotated = rotate is not None

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        data, scale = self.quantize(y)
        return Quantized(ops.pack_bitplanes(unpack_nibbles(data), 4), scale.view(torch.uint8).contiguous(), None)

    def read(self, q: Quantized) -> PackedRead:
        return PackedRead(codes=q.codes, scale=self.decode_scale(q.scale), zero=None, lut=code_table(_e2m1, str(q.codes.device)),
                          bits=4, token_group=1, channel_group=self.group)

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        values = code_table(_e2m1, str(q.codes.device))[ops.unpack_float(q.codes[:, :, :, lo:hi], 4).long()]
        values = values * self.decode_scale(q.scale[:, :, lo:hi]).repeat_interleave(self.group, dim=-1)
        return values if self.rotate is None else self.rotate(values)

    def to_rotated(self, x: torch.Tensor) -> torch.Tensor:
        return self.rotate(x)

    from_rotated = to_rotated  # ultraquant's normalised Hadamard is its own inverse
    query = to_rotated


class _OctaveRotation:
    """The sign-flipped orthonormal Hadamard rotation over `block`-dim blocks, as a matrix in the decode path (the
    query, the dense tail, the output) and exactly (octave.rotate / unrotate) where the profiler's values are due."""

    rotated = True

    def _matrix(self, d: int, inverse: bool, device) -> torch.Tensor:
        return code_table(_octave_rotation, str(device), d, self.block(d), inverse)

    @staticmethod
    def problem(head_dim: int) -> str | None:
        return None if head_dim % oc.HADAMARD_BLOCK == 0 else f"Octave needs head_dim in multiples of 64 (got {head_dim})"

    def to_rotated(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self._matrix(x.shape[-1], False, x.device)

    def from_rotated(self, y: torch.Tensor) -> torch.Tensor:
        return y.float() @ self._matrix(y.shape[-1], True, y.device)

    query = to_rotated  # orthonormal: q . k = rot(q) . rot(k)

    def dense(self, q: Quantized, lo: int, hi: int, ops) -> torch.Tensor:
        """Tokens [lo, hi) in the model's basis, as the emulation computes them: the kernels' oracle reads the layout's
        PackedRead (prefill's dense read is not on the decode path), then the exact rotation back."""
        rotated = reference.dequantize_read(self.read(q).narrow(lo, hi))
        return oc.unrotate(rotated, self.block(rotated.shape[-1]))


def _octave_rotation(d: int, block: int, inverse: bool) -> torch.Tensor:
    """octave.rotate (or unrotate) as a [d, d] matrix: x @ M = rotate(x)."""
    return (oc.unrotate if inverse else oc.rotate)(torch.eye(d), block)


def _octave_lut(*bits: int) -> torch.Tensor:
    """The codebooks read back (LUT / 64, exact), the first at 0, a second (the narrow dims') at 2 ** (bits + 1)."""
    first = torch.tensor(oc.LUT[bits[0]], dtype=torch.float32) / oc.LUT_ONE
    if len(bits) == 1:
        return first
    return torch.cat([first, torch.tensor(oc.LUT[bits[1]], dtype=torch.float32) / oc.LUT_ONE])


class OctaveKeys(_OctaveRotation):
    """Block keys: 4-bit codes on the first rope_dim dims and 3-bit on the rest, one fp16 scale per 64 dims; compact
    keys: 3-bit codes everywhere and one scale per head (rotated over the whole head)."""

    packing = "bytes"  # one row of bytes per token (three planes, then the wide dims' fourth), grown along tokens

    def __init__(self, preset: str):
        self.preset, self.compact = preset, oc.PRESETS[preset][1]

    def _layout(self, d: int) -> oc.Layout:
        return oc.Layout(self.preset, d, min(oc.KERNEL_ROPE_DIM, d))

    def block(self, d: int) -> int:
        return oc.k_block(self._layout(d))

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        b, h, t, d = y.shape
        lay = self._layout(d)
        k = oc.rotate(y.float(), self.block(d))
        if lay.compact:
            codes, scale = oc.quantize_lut(k, oc.NOPE_BITS)
            return Quantized(ops.pack_bitplanes(codes, 3).permute(1, 2, 3, 0, 4).reshape(b, h, t, -1).contiguous(),
                             scale.contiguous(), None)
        kb = k.reshape(b, h, t, d // oc.HADAMARD_BLOCK, oc.HADAMARD_BLOCK)
        nr = lay.rope_dim // oc.HADAMARD_BLOCK
        cr, sr = oc.quantize_lut(kb[..., :nr, :], oc.ROPE_BITS)
        cn, sn = oc.quantize_lut(kb[..., nr:, :], oc.NOPE_BITS)
        codes = torch.cat([cr, cn], dim=-2).reshape(b, h, t, d)
        planes = ops.pack_bitplanes(codes & 7, 3).permute(1, 2, 3, 0, 4).reshape(b, h, t, -1)  # [B, H, T, 3 D / 8]
        wide = ops.pack_bitplanes(codes[..., :lay.wide_dim] >> 3, 1)[0]  # bit 3 of the wide dims [B, H, T, W / 8]
        scale = torch.cat([sr[..., 0], sn[..., 0]], dim=-1)  # [B, H, T, D / 64]
        return Quantized(torch.cat([planes, wide], dim=-1).contiguous(), scale.contiguous(), None)

    def read(self, q: Quantized) -> PackedRead:
        b, h, t, row = q.codes.shape
        d = row * 8 // 3 if self.compact else oc.HADAMARD_BLOCK * q.scale.shape[-1]
        wide = self._layout(d).wide_dim
        s = q.codes.stride()
        planes = q.codes.as_strided((3, b, h, t, d // 8), (d // 8, *s), q.codes.storage_offset())
        lut = code_table(_octave_lut, str(q.codes.device), *((oc.ROPE_BITS, oc.NOPE_BITS) if wide else (3,)))
        return PackedRead(codes=planes, scale=q.scale, zero=None, lut=lut, bits=3, token_group=1,
                          channel_group=d // q.scale.shape[-1], wide=wide)



class OctaveValues(_OctaveRotation):
    """v_bits codebook codes over the rotated head, one fp16 scale per (token, head)."""

    packing = "planes"

    def __init__(self, preset: str):
        self.bits = oc.PRESETS[preset][0]

    @staticmethod
    def block(d: int) -> int:
        return oc.v_block(d)

    def pack(self, y: torch.Tensor, ops) -> Quantized:
        codes, scale = oc.quantize_lut(oc.rotate(y.float(), self.block(y.shape[-1])), self.bits)
        return Quantized(ops.pack_bitplanes(codes, self.bits), scale.contiguous(), None)

    def read(self, q: Quantized) -> PackedRead:
        d = q.codes.shape[-1] * 8
        return PackedRead(codes=q.codes, scale=q.scale, zero=None, lut=code_table(_octave_lut, str(q.codes.device),
                                                                                   self.bits),
                          bits=self.bits, token_group=1, channel_group=d)



def _e4m3(scale_bytes: torch.Tensor) -> torch.Tensor:
    return scale_bytes.view(torch.float8_e4m3fn).float()


def _ue8m0(scale_bytes: torch.Tensor) -> torch.Tensor:
    b = scale_bytes.to(torch.int32)
    return torch.where(b == 0, torch.zeros_like(b, dtype=torch.float32), torch.exp2((b - uq.BIAS).float()))


def _fp4_layouts() -> dict:
    return {
        "vllm.nvfp4": lambda: E2M1Blocks(fp4.BLOCK, fp4.quantize_nvfp4, _e4m3),
        "vllm.nvfp4_4over6": lambda: E2M1Blocks(fp4.BLOCK, lambda y: fp4.quantize_nvfp4(y, four_over_six=True),
                                                _e4m3),
        "vllm.ultraquant_4bit.K": lambda: E2M1Blocks(uq.GROUP, lambda y: uq.quantize_ultraquant(y, rotate=True),
                                                     _ue8m0, uq.hadamard_rotate),
        "vllm.ultraquant_4bit.V": lambda: E2M1Blocks(uq.GROUP, lambda y: uq.quantize_ultraquant(y, rotate=False),
                                                     _ue8m0),
    }


def _turboquant() -> dict:
    out = {}
    for preset, (kb, vb, nc) in tq.PRESETS.items():
        out[f"vllm.{preset}.K"] = (lambda kb=kb, nc=nc: TurboQuantFp8Keys() if kb == 8 else TurboQuantKeys(kb, nc))
        out[f"vllm.{preset}.V"] = (lambda vb=vb: TurboQuantValues(vb))
    out["vllm.turboquant_k8v4_e4b15.K"] = lambda: TurboQuantFp8Keys(e4b15=True)
    return out


def _octave() -> dict:
    out = {}
    for preset in oc.PRESETS:
        out[f"vllm.{preset}.K"] = lambda preset=preset: OctaveKeys(preset)
        out[f"vllm.{preset}.V"] = lambda preset=preset: OctaveValues(preset)
    return out


LAYOUTS = {"vllm.int4_per_token_head": Int4PerTokenHead, **_turboquant(), **_fp4_layouts(), **_octave()}


def engine_layout(scheme):
    """The runtime layout of an engine scheme (a tensor-specific one first), or None when the runtime does not
    store it."""
    make = LAYOUTS.get(f"{scheme.emulation}.{scheme.tensor}") or LAYOUTS.get(scheme.emulation)
    return None if make is None else make()
