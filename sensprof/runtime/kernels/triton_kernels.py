"""Triton versions of the reference kernels, same signatures (contract.py). Imported only when Triton is present.

pack_bitplanes and quantize_pack_* write bit-planes in one pass (a decode step's append is one launch, not
a handful of PyTorch ops). decode_attention reads the packed cache directly (no dequantized copy): each
program takes one (sequence, KV head) and one slice of the tokens (split-K), unpacks the bit-planes in
registers, dequantizes each tile to the query's dtype, computes q.K^T and p.V with tl.dot for all the KV head's
query heads at once (GQA) and keeps an online softmax; the slices and the full-precision tail are merged by
log-sum-exp.
Tiles span the head dim, which Triton allows in powers of two only: the writers hand other shapes to the
reference, and decode_attention declares it (NEEDS_POWER_OF_TWO_HEAD_DIM) so that the caller reads them densely.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .contract import PackedRead, kivi_keys, kivi_values

# the dense read path: PyTorch's own GPU kernels do these well
from .reference import dequantize_channels, dequantize_tokens, unpack_float  # noqa: F401

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
def _unpack_tile(codes_ptr, plane, b_off, h_off, t, tm, d, BITS: tl.constexpr, D: tl.constexpr):
    """Integer codes [BLOCK_T, D] of tokens t from bit-planes (strided: plane, batch, head; token stride D/8)."""
    byte_off = b_off + h_off + t[:, None] * (D // 8) + (d[None, :] // 8)
    bit = d[None, :] % 8
    c = tl.zeros([t.shape[0], D], dtype=tl.int32)
    for k in tl.static_range(BITS):
        byte = tl.load(codes_ptr + k * plane + byte_off, mask=tm[:, None], other=0).to(tl.int32)
        c += ((byte >> bit) & 1) << k
    return c


@triton.jit
def _dot(a, b, TILE_DTYPE: tl.constexpr):
    """a @ b accumulated in fp32; fp32 tiles in full precision (no TF32), 16-bit ones on the tensor cores."""
    if TILE_DTYPE == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b, out_dtype=tl.float32)


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, m_ptr, l_ptr, acc_ptr,
                   HKV, T, tokens_per_split, scaling,
                   KC_P, KC_B, KC_H, KS_B, KS_H, VC_P, VC_B, VC_H, VS_B, VS_H,
                   D: tl.constexpr, BITS_K: tl.constexpr, BITS_V: tl.constexpr, GK: tl.constexpr,
                   GV: tl.constexpr, BLOCK_T: tl.constexpr, N_SPLITS: tl.constexpr, N_BLOCKS: tl.constexpr,
                   REP: tl.constexpr, REP_P2: tl.constexpr, USE_DOT: tl.constexpr, TILE_DTYPE: tl.constexpr):
    """One program per (sequence, KV head, split): the KV head's REP query heads share each unpacked tile,
    so the packed cache is read once, not once per query head. With USE_DOT (every tile side >= 16, as
    tl.dot needs) q.K^T and p.V run on the tensor cores: tiles dequantized in registers to TILE_DTYPE (the
    query's fp16/bf16; fp32 in full IEEE precision), accumulated in fp32."""
    pid = tl.program_id(0)  # b * HKV + hkv
    split = tl.program_id(1)
    b = pid // HKV
    hkv = pid % HKV
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
        kc = _unpack_tile(kc_ptr, KC_P, b * KC_B, hkv * KC_H, t, tm, d, BITS_K, D)
        s_off = b * KS_B + hkv * KS_H + (t // GK)[:, None] * D + d[None, :]
        ks = tl.load(ks_ptr + s_off, mask=tm[:, None], other=0.0)
        kz = tl.load(kz_ptr + s_off, mask=tm[:, None], other=0.0)
        kf = kc.to(tl.float32) * ks.to(tl.float32) + kz.to(tl.float32)  # [BLOCK_T, D]
        if USE_DOT:
            s = _dot(q.to(TILE_DTYPE), tl.trans(kf.to(TILE_DTYPE)), TILE_DTYPE) * scaling  # [REP_P2, BLOCK_T]
        else:
            s = tl.sum(q[:, None, :] * kf[None, :, :], axis=2) * scaling
        s = tl.where(tm[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.where(m_new == -float("inf"), 1.0, tl.exp(m_i - m_new))  # a split may hold no token
        p = tl.exp(s - m_new[:, None])
        p = tl.where(tm[None, :], p, 0.0)
        vc = _unpack_tile(vc_ptr, VC_P, b * VC_B, hkv * VC_H, t, tm, d, BITS_V, D)
        v_off = b * VS_B + hkv * VS_H + t[:, None] * (D // GV) + d[None, :] // GV
        vs = tl.load(vs_ptr + v_off, mask=tm[:, None], other=0.0)
        vz = tl.load(vz_ptr + v_off, mask=tm[:, None], other=0.0)
        vf = vc.to(tl.float32) * vs.to(tl.float32) + vz.to(tl.float32)  # [BLOCK_T, D]
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


def _token_sliced(x: torch.Tensor, inner: int) -> torch.Tensor:
    """The kernel takes any batch/head strides but needs each token's row (and the plane) dense."""
    ok = x.stride(-1) == 1 and x.stride(-2) == inner
    return x if ok else x.contiguous()


def decode_attention(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor, v_tail: torch.Tensor, *,
                     scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is not None or not kivi_keys(k) or not kivi_values(v) or not _tileable(q.shape[-1]):
        return reference.decode_attention(q, k, v, k_tail, v_tail, scaling=scaling, mask=mask)
    return decode_attention_in_splits(q, k, v, k_tail, v_tail, scaling=scaling, n_splits=None)


def decode_attention_in_splits(q: torch.Tensor, k: PackedRead, v: PackedRead, k_tail: torch.Tensor,
                               v_tail: torch.Tensor, *, scaling: float, n_splits: int | None) -> torch.Tensor:
    """decode_attention cutting the tokens into `n_splits` slices (None: enough to fill the GPU).
    Reads views of the packed cache in place (slices along tokens are not copied)."""
    k_codes, k_scale, k_zero, bits_k, group_k = k.codes, k.scale, k.zero, k.bits, k.token_group
    v_codes, v_scale, v_zero, bits_v, group_v = v.codes, v.scale, v.zero, v.bits, v.channel_group
    b, hq, d = q.shape
    hkv, t = k_codes.shape[2], k_codes.shape[3]
    rep = hq // hkv
    # enough programs to fill the GPU at batch 1 (splits), few enough that merging them stays cheap
    n_splits = n_splits or max(1, min(128, triton.cdiv(t, 512), triton.cdiv(1024, b * hkv)))
    block_t = 32
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
    if t > 0:
        kc, vc = _token_sliced(k_codes, d // 8), _token_sliced(v_codes, d // 8)
        ks, kz = _token_sliced(k_scale, d), _token_sliced(k_zero, d)
        vs, vz = _token_sliced(v_scale, d // group_v), _token_sliced(v_zero, d // group_v)
        if ks.stride() != kz.stride():
            ks, kz = ks.contiguous(), kz.contiguous()
        if vs.stride() != vz.stride():
            vs, vz = vs.contiguous(), vz.contiguous()
        _decode_kernel[(b * hkv, n_splits)](
            q.contiguous(), kc, ks, kz, vc, vs, vz, m, lsum, acc, hkv, t, per_split, scaling,
            kc.stride(0), kc.stride(1), kc.stride(2), ks.stride(0), ks.stride(1),
            vc.stride(0), vc.stride(1), vc.stride(2), vs.stride(0), vs.stride(1),
            D=d, BITS_K=bits_k, BITS_V=bits_v, GK=group_k, GV=group_v, BLOCK_T=block_t, N_SPLITS=n_splits,
            N_BLOCKS=blocks, REP=rep, REP_P2=rep_p2, USE_DOT=use_dot, TILE_DTYPE=_TILE_DTYPES[q.dtype])
    # the full-precision tail is one more split, done densely
    qf = q.float().reshape(b, hkv, rep, d)
    if k_tail.shape[2]:
        s = torch.matmul(qf, k_tail.float().transpose(-1, -2)) * scaling  # [B, Hkv, rep, Tt]
        mt = s.amax(-1)
        pt = torch.exp(s - mt[..., None])
        m = torch.cat([m, mt.reshape(b * hq, 1)], 1)
        lsum = torch.cat([lsum, pt.sum(-1).reshape(b * hq, 1)], 1)
        acc = torch.cat([acc, torch.matmul(pt, v_tail.float()).reshape(b * hq, 1, d)], 1)
    mx = m.amax(-1, keepdim=True)
    w = torch.exp(m - mx)
    w = torch.where(torch.isfinite(m), w, torch.zeros_like(w))
    out = (acc * w[..., None]).sum(1) / (lsum * w).sum(-1, keepdim=True)
    return out.reshape(b, hq, d)
