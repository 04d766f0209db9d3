"""Triton versions of the reference kernels, same signatures (contract.py). Imported only when Triton is present.

pack_bitplanes and quantize_pack_* write bit-planes in one pass (a decode step's append is one launch, not
a handful of PyTorch ops). decode_attention reads the packed cache directly (no dequantized copy), in any
layout contract.PackedRead describes: each program takes one (sequence, KV head) and one slice of the tokens
(split-K), unpacks the bit-planes (or loads the fp8 bytes) in registers, looks the codes up in their table (or
subtracts the affine offset), scales them by parameters of any group and stride, rotates keys stored before RoPE,
dequantizes each tile to the query's dtype, computes q.K^T and p.V with tl.dot for all the KV head's query heads
at once (GQA) and keeps an online softmax over the tokens the read mask keeps (batch rows of different lengths);
the slices and the full-precision tail are merged by log-sum-exp.
Tiles span the head dim, which Triton allows in powers of two only: the writers hand other shapes to the
reference, and decode_attention declares it (NEEDS_POWER_OF_TWO_HEAD_DIM) so that the caller reads them densely.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .contract import PackedRead

# the dense read path: PyTorch's own GPU kernels do these well
from .reference import dequantize_channels, dequantize_tokens, quantize_pack_int4_rht, unpack_float  # noqa: F401

NAME = "triton"
_TILE_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
NEEDS_POWER_OF_TWO_HEAD_DIM = True


def _tileable(*sizes: int) -> bool:
    """Sizes a tile may span (tl.arange): powers of two."""
    return all(n > 0 and not n & (n - 1) for n in sizes)


@triton.jit
def _pack_kernel(codes_ptr, out_ptr, n_rows, D: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nb = tl.arange(0, D // 8)
    sh = tl.arange(0, 8)
    rmask = rows < n_rows
    offs = rows[:, None, None] * D + nb[None, :, None] * 8 + sh[None, None, :]
    c = tl.load(codes_ptr + offs, mask=rmask[:, None, None], other=0).to(tl.int32)
    for k in tl.static_range(BITS):
        plane = tl.sum(((c >> k) & 1) << sh[None, None, :], axis=2)
        tl.store(out_ptr + k * n_rows * (D // 8) + rows[:, None] * (D // 8) + nb[None, :], plane.to(tl.uint8),
                 mask=rmask[:, None])


def pack_bitplanes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    d = codes.shape[-1]
    if d % 8 or not _tileable(d // 8) or not codes.numel():
        return reference.pack_bitplanes(codes, bits)  # which also says why a dim is not packable
    flat = codes.to(torch.uint8).reshape(-1, d).contiguous()
    n = flat.shape[0]
    out = torch.empty(bits, n, d // 8, dtype=torch.uint8, device=codes.device)
    block = 16
    _pack_kernel[(triton.cdiv(n, block),)](flat, out, n, D=d, BITS=bits, BLOCK_N=block)
    return out.reshape(bits, *codes.shape[:-1], d // 8)


@triton.jit
def _pack_rows(c, out_ptr, row_off, D: tl.constexpr, BITS: tl.constexpr, PLANE):
    """Store integer codes c [R, D] as BITS bit-planes: out[k, row, byte] (row_off [R] = row * D/8)."""
    c8 = tl.reshape(c, (c.shape[0], D // 8, 8))
    sh = tl.arange(0, 8)
    nb = tl.arange(0, D // 8)
    for k in tl.static_range(BITS):
        plane = tl.sum(((c8 >> k) & 1) << sh[None, None, :], axis=2)
        tl.store(out_ptr + k * PLANE + row_off[:, None] + nb[None, :], plane.to(tl.uint8))


@triton.jit
def _quantize_tokens_kernel(x_ptr, codes_ptr, scale_ptr, zero_ptr, N, D: tl.constexpr, G: tl.constexpr,
                            BITS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rows, N - 1)  # a short last block recomputes the last row (identical stores)
    d = tl.arange(0, D)
    x = tl.load(x_ptr + rows[:, None] * D + d[None, :]).to(tl.float32)
    xg = tl.reshape(x, (BLOCK_N, D // G, G))
    mn = tl.min(xg, axis=2)
    mx = tl.max(xg, axis=2)
    scale = tl.math.div_rn(mx - mn, (2**BITS - 1) * 1.0)
    inv = tl.where(scale > 0, tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), 0.0)
    c = tl.floor((xg - mn[:, :, None]) * inv[:, :, None] + 0.5)
    c = tl.minimum(tl.maximum(c, 0.0), 2**BITS - 1.0).to(tl.int32)
    _pack_rows(tl.reshape(c, (BLOCK_N, D)), codes_ptr, rows * (D // 8), D, BITS, N * (D // 8))
    ng = tl.arange(0, D // G)
    tl.store(scale_ptr + rows[:, None] * (D // G) + ng[None, :], scale.to(tl.float16))
    tl.store(zero_ptr + rows[:, None] * (D // G) + ng[None, :], mn.to(tl.float16))


def quantize_pack_tokens(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    if not _tileable(d, group):
        return reference.quantize_pack_tokens(x, bits, group)
    x = x.contiguous()
    codes = torch.empty(bits, n, d // 8, dtype=torch.uint8, device=x.device)
    scale = torch.empty(n, d // group, dtype=torch.float16, device=x.device)
    zero = torch.empty_like(scale)
    if n:
        block = 16
        _quantize_tokens_kernel[(triton.cdiv(n, block),)](x, codes, scale, zero, n, D=d, G=group, BITS=bits,
                                                          BLOCK_N=block)
    return codes, scale, zero


@triton.jit
def _quantize_channels_kernel(x_ptr, codes_ptr, scale_ptr, zero_ptr, T, N_T, D: tl.constexpr, G: tl.constexpr,
                              BITS: tl.constexpr):
    pid = tl.program_id(0)  # one (sequence, group of G tokens)
    n = pid // (T // G)
    grp = pid % (T // G)
    t = grp * G + tl.arange(0, G)
    d = tl.arange(0, D)
    x = tl.load(x_ptr + (n * T + t[:, None]) * D + d[None, :]).to(tl.float32)
    mn = tl.min(x, axis=0)
    mx = tl.max(x, axis=0)
    scale = tl.math.div_rn(mx - mn, (2**BITS - 1) * 1.0)
    inv = tl.where(scale > 0, tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), 0.0)
    c = tl.floor((x - mn[None, :]) * inv[None, :] + 0.5)
    c = tl.minimum(tl.maximum(c, 0.0), 2**BITS - 1.0).to(tl.int32)
    _pack_rows(c, codes_ptr, (n * T + t) * (D // 8), D, BITS, N_T * (D // 8))
    tl.store(scale_ptr + pid * D + d, scale.to(tl.float16))
    tl.store(zero_ptr + pid * D + d, mn.to(tl.float16))


def quantize_pack_channels(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, t, d = x.shape
    if not _tileable(d, group):
        return reference.quantize_pack_channels(x, bits, group)
    x = x.contiguous()
    codes = torch.empty(bits, n, t, d // 8, dtype=torch.uint8, device=x.device)
    scale = torch.empty(n, t // group, d, dtype=torch.float16, device=x.device)
    zero = torch.empty_like(scale)
    if n * t:
        _quantize_channels_kernel[(n * (t // group),)](x, codes, scale, zero, t, n * t, D=d, G=group, BITS=bits)
    return codes, scale, zero


@triton.jit
def _codes_tile(c_ptr, base, CP, CT, t, tm, ch, BITS: tl.constexpr, BYTES: tl.constexpr, WIDE: tl.constexpr):
    """Integer codes [BLOCK_T, len(ch)] of tokens t at channels ch: bytes (token stride CT), or bit-planes (plane
    stride CP; plane k holds bit k of eight codes a byte, the first code in the lowest bit). base is int64 and the
    planes are reached by pointer steps, so no offset wraps at 2^31 (8-bit planes of 128K tokens x batch 32).
    WIDE > 0: channels below it take one more bit from plane BITS, the others index the second codebook."""
    if BYTES:
        c = tl.load(c_ptr + base + t[:, None] * CT + ch[None, :], mask=tm[:, None], other=0).to(tl.int32)
    else:
        ptr = c_ptr + base + t[:, None] * CT + (ch[None, :] // 8)
        bit = ch[None, :] % 8
        c = tl.zeros([t.shape[0], ch.shape[0]], dtype=tl.int32)
        for k in tl.static_range(BITS):
            byte = tl.load(ptr, mask=tm[:, None], other=0).to(tl.int32)
            c += ((byte >> bit) & 1) << k
            ptr += CP
        if WIDE > 0:
            wide = ch[None, :] < WIDE
            byte = tl.load(ptr, mask=tm[:, None] & wide, other=0).to(tl.int32)
            c += tl.where(wide, ((byte >> bit) & 1) << BITS, 2 ** (BITS + 1))
    return c


@triton.jit
def _dequant_tile(c_ptr, lut_ptr, s_ptr, z_ptr, offset, b, h, t, tm, ch,
                  CP, CB, CH, CT, SB, SH, ST, SC, ZB, ZH, ZT, ZC,
                  BITS: tl.constexpr, BYTES: tl.constexpr, AFFINE: tl.constexpr, HAS_ZERO: tl.constexpr,
                  TG: tl.constexpr, CG: tl.constexpr, WORD: tl.constexpr, DENSE: tl.constexpr,
                  WIDE: tl.constexpr):
    """lut[code] * scale[b, h, t // TG, ch // CG] + zero[same] as float32 [BLOCK_T, len(ch)] (contract.PackedRead):
    the code's value computed (code - offset) where AFFINE, else gathered from the table; parameters by strides.
    WORD: s_ptr holds vLLM's int4 words as int32, split into scale and zero here (contract.split_word). DENSE: c_ptr
    holds the values themselves (an unquantized side), loaded as they are."""
    if DENSE:
        return tl.load(c_ptr + b * CB + h * CH + t[:, None] * CT + ch[None, :], mask=tm[:, None], other=0.0).to(tl.float32)
    c = _codes_tile(c_ptr, b * CB + h * CH, CP, CT, t, tm, ch, BITS, BYTES, WIDE)
    if AFFINE:
        x = c.to(tl.float32) - offset
    else:
        x = tl.load(lut_ptr + c)
    gt = (t // TG)[:, None]
    gc = (ch // CG)[None, :]
    if WORD:
        bits = tl.load(s_ptr + b * SB + h * SH + gt * ST + gc * SC, mask=tm[:, None], other=0)
        scale = (bits & -16).to(tl.float32, bitcast=True)
        x = x * scale - (bits & 15).to(tl.float32) * scale
    else:
        x = x * tl.load(s_ptr + b * SB + h * SH + gt * ST + gc * SC, mask=tm[:, None], other=0.0).to(tl.float32)
    if HAS_ZERO:
        x += tl.load(z_ptr + b * ZB + h * ZH + gt * ZT + gc * ZC, mask=tm[:, None], other=0.0).to(tl.float32)
    return x


@triton.jit
def _dot(a, b, TILE_DTYPE: tl.constexpr):
    """a @ b accumulated in fp32; fp32 tiles in full precision (no TF32), 16-bit ones on the tensor cores."""
    if TILE_DTYPE == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b, out_dtype=tl.float32)


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, klut_ptr, ks_ptr, kz_ptr, vc_ptr, vlut_ptr, vs_ptr, vz_ptr, cos_ptr, sin_ptr,
                   mask_ptr, m_ptr, l_ptr, acc_ptr,
                   HKV, T, tokens_per_split, scaling, k_offset, v_offset,
                   KC_P, KC_B, KC_H, KC_T, KS_B, KS_H, KS_T, KS_C, KZ_B, KZ_H, KZ_T, KZ_C,
                   VC_P, VC_B, VC_H, VC_T, VS_B, VS_H, VS_T, VS_C, VZ_B, VZ_H, VZ_T, VZ_C, R_B, R_T, M_B,
                   D: tl.constexpr, BITS_K: tl.constexpr, BITS_V: tl.constexpr, K_BYTES: tl.constexpr,
                   V_BYTES: tl.constexpr, K_AFFINE: tl.constexpr, V_AFFINE: tl.constexpr, K_ZERO: tl.constexpr,
                   V_ZERO: tl.constexpr, K_TG: tl.constexpr, K_CG: tl.constexpr, V_TG: tl.constexpr,
                   V_CG: tl.constexpr, K_WORD: tl.constexpr, V_WORD: tl.constexpr, K_DENSE: tl.constexpr,
                   V_DENSE: tl.constexpr, K_WIDE: tl.constexpr, V_WIDE: tl.constexpr, ROPE: tl.constexpr,
                   HAS_MASK: tl.constexpr,
                   BLOCK_T: tl.constexpr, N_SPLITS: tl.constexpr, N_BLOCKS: tl.constexpr,
                   REP: tl.constexpr, REP_P2: tl.constexpr, USE_DOT: tl.constexpr, TILE_DTYPE: tl.constexpr):
    """One program per (sequence, KV head, split) over any packed layout (contract.PackedRead): the KV head's REP
    query heads share each dequantized tile, so the packed cache is read once, not once per query head. Keys
    stored before RoPE (ROPE = R > 0) get rotate-half RoPE over their first R channels in the tile (each channel's
    partner dequantized alongside); tokens the mask excludes score -inf and add nothing. With USE_DOT (every tile
    side >= 16, as tl.dot needs) q.K^T and p.V run on the tensor cores: tiles dequantized in registers to
    TILE_DTYPE (the query's fp16/bf16; fp32 in full IEEE precision), accumulated in fp32."""
    pid = tl.program_id(0)  # b * HKV + hkv
    split = tl.program_id(1)
    b = (pid // HKV).to(tl.int64)  # int64 offsets from here on: a cache may pass 2^31 elements
    hkv = (pid % HKV).to(tl.int64)
    r = tl.arange(0, REP_P2)
    rm = r < REP
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (pid * REP + r)[:, None] * D + d[None, :], mask=rm[:, None], other=0.0).to(tl.float32)
    m_i = tl.full([REP_P2], -float("inf"), tl.float32)
    l_i = tl.zeros([REP_P2], dtype=tl.float32)
    acc = tl.zeros([REP_P2, D], dtype=tl.float32)
    start = split * tokens_per_split
    end = tl.minimum(T, start + tokens_per_split)
    for i in range(N_BLOCKS):  # a loop, not unrolled
        t = start + i * BLOCK_T + tl.arange(0, BLOCK_T)
        tm = t < end
        if HAS_MASK:
            tm = tm & (tl.load(mask_ptr + b * M_B + t, mask=tm, other=0) != 0)
        kf = _dequant_tile(kc_ptr, klut_ptr, ks_ptr, kz_ptr, k_offset, b, hkv, t, tm, d,
                           KC_P, KC_B, KC_H, KC_T, KS_B, KS_H, KS_T, KS_C, KZ_B, KZ_H, KZ_T, KZ_C,
                           BITS_K, K_BYTES, K_AFFINE, K_ZERO, K_TG, K_CG, K_WORD, K_DENSE, K_WIDE)  # [BLOCK_T, D]
        if ROPE > 0:  # out[d] = x[d] cos - x[d + R/2] sin; out[d + R/2] = x[d + R/2] cos + x[d] sin
            partner = tl.where(d < ROPE // 2, d + ROPE // 2, tl.where(d < ROPE, d - ROPE // 2, d))
            kp = _dequant_tile(kc_ptr, klut_ptr, ks_ptr, kz_ptr, k_offset, b, hkv, t, tm, partner,
                               KC_P, KC_B, KC_H, KC_T, KS_B, KS_H, KS_T, KS_C, KZ_B, KZ_H, KZ_T, KZ_C,
                               BITS_K, K_BYTES, K_AFFINE, K_ZERO, K_TG, K_CG, K_WORD, K_DENSE, K_WIDE)
            rmask = tm[:, None] & (d[None, :] < ROPE)
            r_off = b * R_B + t[:, None] * R_T + (d % (ROPE // 2))[None, :]
            cs = tl.load(cos_ptr + r_off, mask=rmask, other=1.0)
            sn = tl.load(sin_ptr + r_off, mask=rmask, other=0.0)
            sign = tl.where(d < ROPE // 2, -1.0, 1.0)
            kf = kf * cs + sign[None, :] * kp * sn
        if USE_DOT:
            s = _dot(q.to(TILE_DTYPE), tl.trans(kf.to(TILE_DTYPE)), TILE_DTYPE) * scaling  # [REP_P2, BLOCK_T]
        else:
            s = tl.sum(q[:, None, :] * kf[None, :, :], axis=2) * scaling
        s = tl.where(tm[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        empty = m_new == -float("inf")  # no token read yet (a split, or masked rows)
        alpha = tl.where(empty, 1.0, tl.exp(m_i - m_new))
        p = tl.exp(s - tl.where(empty, 0.0, m_new)[:, None])  # exp(-inf) = 0 for the tokens not read
        vf = _dequant_tile(vc_ptr, vlut_ptr, vs_ptr, vz_ptr, v_offset, b, hkv, t, tm, d,
                           VC_P, VC_B, VC_H, VC_T, VS_B, VS_H, VS_T, VS_C, VZ_B, VZ_H, VZ_T, VZ_C,
                           BITS_V, V_BYTES, V_AFFINE, V_ZERO, V_TG, V_CG, V_WORD, V_DENSE, V_WIDE)
        vf = tl.where(tm[:, None], vf, 0.0)  # tokens not read add nothing, whatever their codes
        if USE_DOT:
            pv = _dot(p.to(TILE_DTYPE), vf.to(TILE_DTYPE), TILE_DTYPE)
        else:
            pv = tl.sum(p[:, :, None] * vf[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = (pid * REP + r) * N_SPLITS + split
    tl.store(m_ptr + out, m_i, mask=rm)
    tl.store(l_ptr + out, l_i, mask=rm)
    tl.store(acc_ptr + out[:, None] * D + d[None, :], acc, mask=rm[:, None])


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """The kernel takes any strides but a contiguous last dim of the codes and RoPE tables."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _param(x: torch.Tensor | None) -> torch.Tensor | None:
    return x if x is None or x.dtype in (torch.float16, torch.float32) else x.float()


def _read_args(r: PackedRead, zero_like: torch.Tensor):
    """(tensors, code strides, scale strides, zero strides, constexprs) of a read for _decode_kernel."""
    codes, scale, zero = _row_major(r.codes), _param(r.scale), _param(r.zero)
    if r.word:
        scale = r.scale.view(torch.int32)  # split in the kernel
    bytes_ = r.packing == "bytes"
    cs = codes.stride()[:4] if r.packing == "planes" else (0, *codes.stride()[:3])
    zs = (0, 0, 0, 0) if zero is None else zero.stride()
    lut = r.lut.to(device=codes.device, dtype=torch.float32).contiguous()
    tensors = (codes, lut, scale, zero_like if zero is None else zero)
    const = dict(BITS=r.bits, BYTES=bytes_, AFFINE=r.offset is not None, ZERO=zero is not None, TG=r.token_group,
                 CG=r.channel_group, WORD=r.word, DENSE=r.dense, WIDE=r.wide)
    return tensors, cs, scale.stride(), zs, const, float(r.offset or 0.0)


# The decode launch's shape: tokens per tile, the programs it aims for over batch x KV heads x splits (at most
# max_splits splits), Triton's warps and pipeline stages (None: Triton's defaults). A module setting, not an argument:
# every backend keeps one signature (contract.py); benchmarks/decode_kernel_sweep.py varies it on a GPU. 64-token
# tiles: 1.12-1.17x the 32-token tiles' speed at 8K-128K tokens on an H200, the best of 12 launch shapes there
# (benchmarks/results/2026-12-04-h200/); none moved the kernel past ~6% of the card's bandwidth.
DECODE_TUNING = {"block_t": 64, "programs": 1024, "max_splits": 128, "num_warps": None, "num_stages": None}


def decode_attention(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor, v_tail: torch.Tensor, *,
                     scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    return decode_attention_in_splits(q, k, v, k_tail, v_tail, scaling=scaling, n_splits=None, mask=mask)


def decode_attention_in_splits(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor,
                               v_tail: torch.Tensor, *, scaling: float, n_splits: int | None,
                               mask: torch.Tensor | None = None) -> torch.Tensor:
    """decode_attention cutting the tokens into `n_splits` slices (None: enough to fill the GPU). Reads any
    layout in place (token slices are strided views, not copies); batch rows of different lengths are the mask.
    Head dims that are not a power of two, reads whose K and V differ in length, and values with RoPE tables (RoPE
    is the keys') go to the reference."""
    b, hq, d = q.shape
    hkv, t, tt = k_tail.shape[1], k.tokens, k_tail.shape[2]
    if not _tileable(d) or hq % hkv or v.tokens != t or k.head_dim != d or v.head_dim != d or v.rope is not None:
        return reference.decode_attention(q, k, v, k_tail, v_tail, scaling=scaling, mask=mask)
    rep = hq // hkv
    # enough programs to fill the GPU at batch 1 (splits), few enough that merging them stays cheap
    n_splits = n_splits or max(1, min(DECODE_TUNING["max_splits"], triton.cdiv(t, 512),
                                      triton.cdiv(DECODE_TUNING["programs"], b * hkv)))
    block_t = DECODE_TUNING["block_t"]
    # tl.dot needs every tile side >= 16: pad the query heads of a KV head to 16 rows (masked), small head dims
    # fall back to broadcast sums
    use_dot = d >= 16
    rep_p2 = max(16, triton.next_power_of_2(rep)) if use_dot else triton.next_power_of_2(rep)
    # a power-of-two number of blocks per split: few distinct compilations as the context grows
    blocks = triton.next_power_of_2(triton.cdiv(triton.cdiv(max(t, 1), n_splits), block_t))
    per_split = blocks * block_t
    m = torch.full((b * hq, n_splits), -float("inf"), device=q.device, dtype=torch.float32)
    lsum = torch.zeros((b * hq, n_splits), device=q.device, dtype=torch.float32)
    acc = torch.zeros((b * hq, n_splits, d), device=q.device, dtype=torch.float32)
    if mask is not None:
        mask = mask.to(device=q.device, dtype=torch.bool).contiguous()
    if t > 0:
        tile_dtype = _TILE_DTYPES.get(q.dtype, tl.float32)
        qk = q if q.dtype in _TILE_DTYPES else q.float()
        (kc, klut, ks, kz), kcs, kss, kzs, kk, k_off = _read_args(k, acc)
        (vc, vlut, vs, vz), vcs, vss, vzs, vk, v_off = _read_args(v, acc)
        rope, cos, sin, rs = 0, acc, acc, (0, 0)
        if k.rope is not None:
            cos, sin = (_row_major(x.to(device=q.device, dtype=torch.float32)) for x in k.rope)
            if cos.stride() != sin.stride():
                cos, sin = cos.contiguous(), sin.contiguous()
            # a table shared by the batch ([1, T, R/2]) broadcasts: batch stride 0, as torch broadcasts it
            rope, rs = 2 * cos.shape[-1], (0 if cos.shape[0] == 1 else cos.stride(0), cos.stride(1))
        mk = acc if mask is None else mask.view(torch.uint8)
        _decode_kernel[(b * hkv, n_splits)](
            qk.contiguous(), kc, klut, ks, kz, vc, vlut, vs, vz, cos, sin, mk, m, lsum, acc,
            hkv, t, per_split, scaling, k_off, v_off,
            *kcs, *kss, *kzs, *vcs, *vss, *vzs, *rs, 0 if mask is None else mk.stride(0),
            D=d, BITS_K=kk["BITS"], BITS_V=vk["BITS"], K_BYTES=kk["BYTES"], V_BYTES=vk["BYTES"],
            K_AFFINE=kk["AFFINE"], V_AFFINE=vk["AFFINE"], K_ZERO=kk["ZERO"], V_ZERO=vk["ZERO"], K_TG=kk["TG"],
            K_CG=kk["CG"], V_TG=vk["TG"], V_CG=vk["CG"], K_WORD=kk["WORD"], V_WORD=vk["WORD"],
            K_DENSE=kk["DENSE"], V_DENSE=vk["DENSE"], K_WIDE=kk["WIDE"], V_WIDE=vk["WIDE"], ROPE=rope, HAS_MASK=mask is not None,
            BLOCK_T=block_t, N_SPLITS=n_splits, N_BLOCKS=blocks, REP=rep, REP_P2=rep_p2, USE_DOT=use_dot,
            TILE_DTYPE=tile_dtype, **{k: DECODE_TUNING[k] for k in ("num_warps", "num_stages")
                                      if DECODE_TUNING[k] is not None})
    # the full-precision tail is one more split, done densely
    qf = q.float().reshape(b, hkv, rep, d)
    if tt:
        s = torch.matmul(qf, k_tail.float().transpose(-1, -2)) * scaling  # [B, Hkv, rep, Tt]
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, t:], -float("inf"))
        mt = s.amax(-1)
        pt = torch.exp(s - torch.where(torch.isfinite(mt), mt, torch.zeros_like(mt))[..., None])
        m = torch.cat([m, mt.reshape(b * hq, 1)], 1)
        lsum = torch.cat([lsum, pt.sum(-1).reshape(b * hq, 1)], 1)
        acc = torch.cat([acc, torch.matmul(pt, v_tail.float()).reshape(b * hq, 1, d)], 1)
    mx = m.amax(-1, keepdim=True)
    w = torch.exp(m - mx)
    w = torch.where(torch.isfinite(m), w, torch.zeros_like(w))
    out = (acc * w[..., None]).sum(1) / (lsum * w).sum(-1, keepdim=True)
    return out.reshape(b, hq, d)
