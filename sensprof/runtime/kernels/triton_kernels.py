"""Triton versions of the reference kernels, same signatures. Imported only when Triton is present.

decode_attention reads the packed cache directly (no dequantized copy): each program takes one
(sequence, query head) and one slice of the tokens (split-K), unpacks the bit-planes in registers,
and keeps an online softmax; the slices and the full-precision tail are merged by log-sum-exp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    if d % 8:
        raise ValueError(f"the packed dim must be a multiple of 8, got {d}")
    flat = codes.to(torch.uint8).reshape(-1, d).contiguous()
    n = flat.shape[0]
    out = torch.empty(bits, n, d // 8, dtype=torch.uint8, device=codes.device)
    block = 16
    _pack_kernel[(triton.cdiv(n, block),)](flat, out, n, D=d, BITS=bits, BLOCK_N=block)
    return out.reshape(bits, *codes.shape[:-1], d // 8)


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr, m_ptr, l_ptr, acc_ptr,
                   HQ, HKV, T, PLANE, tokens_per_split, scaling,
                   D: tl.constexpr, BITS_K: tl.constexpr, BITS_V: tl.constexpr, GK: tl.constexpr,
                   GV: tl.constexpr, BLOCK_T: tl.constexpr, N_SPLITS: tl.constexpr,
                   BLOCKS_PER_SPLIT: tl.constexpr):
    bh = tl.program_id(0)  # b * HQ + hq
    split = tl.program_id(1)
    b = bh // HQ
    hkv = (bh % HQ) // (HQ // HKV)
    seq = b * HKV + hkv  # index of this (sequence, kv head) in [B, HKV, ...]
    d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * D + d).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    start = split * tokens_per_split
    for i in tl.static_range(BLOCKS_PER_SPLIT):
        t = start + i * BLOCK_T + tl.arange(0, BLOCK_T)
        tm = t < tl.minimum(T, start + tokens_per_split)
        byte_off = (seq * T + t[:, None]) * (D // 8) + (d[None, :] // 8)
        bit = (d[None, :] % 8)
        kc = tl.zeros([BLOCK_T, D], dtype=tl.int32)
        for k in tl.static_range(BITS_K):
            byte = tl.load(kc_ptr + k * PLANE + byte_off, mask=tm[:, None], other=0).to(tl.int32)
            kc += ((byte >> bit) & 1) << k
        g = t // GK
        ks = tl.load(ks_ptr + (seq * (T // GK) + g[:, None]) * D + d[None, :], mask=tm[:, None], other=0.0)
        kz = tl.load(kz_ptr + (seq * (T // GK) + g[:, None]) * D + d[None, :], mask=tm[:, None], other=0.0)
        kf = kc.to(tl.float32) * ks.to(tl.float32) + kz.to(tl.float32)
        s = tl.sum(kf * q[None, :], axis=1) * scaling
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.where(m_new == -float("inf"), 1.0, tl.exp(m_i - m_new))  # a split may hold no token
        p = tl.exp(s - m_new)
        p = tl.where(tm, p, 0.0)
        vc = tl.zeros([BLOCK_T, D], dtype=tl.int32)
        for k in tl.static_range(BITS_V):
            byte = tl.load(vc_ptr + k * PLANE + byte_off, mask=tm[:, None], other=0).to(tl.int32)
            vc += ((byte >> bit) & 1) << k
        vg = d[None, :] // GV
        vs = tl.load(vs_ptr + (seq * T + t[:, None]) * (D // GV) + vg, mask=tm[:, None], other=0.0)
        vz = tl.load(vz_ptr + (seq * T + t[:, None]) * (D // GV) + vg, mask=tm[:, None], other=0.0)
        vf = vc.to(tl.float32) * vs.to(tl.float32) + vz.to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vf, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = bh * N_SPLITS + split
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)
    tl.store(acc_ptr + out * D + d, acc)


def decode_attention(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_tail, v_tail, *,
                     bits_k: int, bits_v: int, group_k: int, group_v: int, scaling: float,
                     n_splits: int | None = None) -> torch.Tensor:
    b, hq, d = q.shape
    hkv, t = k_codes.shape[2], k_codes.shape[3]
    n_splits = n_splits or max(1, min(64, t // 256))
    block_t = 32
    # a power-of-two number of blocks per split: few distinct compilations as the context grows
    blocks = triton.next_power_of_2(triton.cdiv(triton.cdiv(max(t, 1), n_splits), block_t))
    per_split = blocks * block_t
    m = torch.full((b * hq, n_splits), -float("inf"), device=q.device, dtype=torch.float32)
    lsum = torch.zeros((b * hq, n_splits), device=q.device, dtype=torch.float32)
    acc = torch.zeros((b * hq, n_splits, d), device=q.device, dtype=torch.float32)
    if t > 0:
        _decode_kernel[(b * hq, n_splits)](
            q.contiguous(), k_codes.contiguous(), k_scale.contiguous(), k_zero.contiguous(), v_codes.contiguous(),
            v_scale.contiguous(), v_zero.contiguous(), m, lsum, acc, hq, hkv, t, b * hkv * t * (d // 8), per_split,
            scaling,
            D=d, BITS_K=bits_k, BITS_V=bits_v, GK=group_k, GV=group_v, BLOCK_T=block_t, N_SPLITS=n_splits,
            BLOCKS_PER_SPLIT=blocks)
    # the full-precision tail is one more split, done densely
    rep = hq // hkv
    kt = k_tail.float().repeat_interleave(rep, dim=1).reshape(b * hq, -1, d)
    vt = v_tail.float().repeat_interleave(rep, dim=1).reshape(b * hq, -1, d)
    if kt.shape[1]:
        s = torch.einsum("nd,ntd->nt", q.float().reshape(b * hq, d), kt) * scaling
        mt = s.amax(-1)
        pt = torch.exp(s - mt[:, None])
        m = torch.cat([m, mt[:, None]], 1)
        lsum = torch.cat([lsum, pt.sum(-1, keepdim=True)], 1)
        acc = torch.cat([acc, torch.einsum("nt,ntd->nd", pt, vt)[:, None]], 1)
    mx = m.amax(-1, keepdim=True)
    w = torch.exp(m - mx)
    w = torch.where(torch.isfinite(m), w, torch.zeros_like(w))
    out = (acc * w[..., None]).sum(1) / (lsum * w).sum(-1, keepdim=True)
    return out.reshape(b, hq, d)
