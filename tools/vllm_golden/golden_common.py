"""What the golden scripts share with on_gpu.py: the inputs they feed vLLM's kernels and the int4 read-back.

Kept apart from the scripts because those import vLLM (and hide the GPU) when imported; this module needs torch
alone. Changing anything here changes the fixtures: re-run the golden scripts."""

import math

import torch

# per_token_head.py: tokens, heads, the cache's block size, head dims (96: not a power of two, the RHT runs on
# 32-wide blocks)
PTH_T, PTH_H, PTH_BLOCK = 5, 2, 16
PTH_DIMS = (64, 96, 128, 256)
# turboquant.py: tokens, KV heads, query heads per KV head, block size
TQ_PRESETS = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
TQ_DIMS = (64, 128, 256)
TQ_T, TQ_H, TQ_GQA, TQ_BS = 6, 2, 2, 16


def per_token_head_inputs(d: int, seed: int, t: int = PTH_T, h: int = PTH_H, dtype=torch.bfloat16):
    """K, V [t, h, d]: three x20 outlier key channels, and (t >= 5) the scale floor, a tiny head and a constant
    head."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(t, h, d, generator=g)
    k[..., torch.randperm(d, generator=g)[:3]] *= 20.0  # three outlier channels
    v = torch.randn(t, h, d, generator=g)
    if t >= 5:
        k[1, 0] = 0.0  # scale floor 1e-6
        v[2, 1] = 0.0
        k[3, 1] *= 1e-7  # tiny head: floor again
        v[4, 0] = 0.25  # constant head: max == min
    return k.to(dtype), v.to(dtype)


def turboquant_inputs(d: int, seed: int):
    """K, V [TQ_T, TQ_H, d] and one decode query [1, TQ_H * TQ_GQA, d], fp16."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(TQ_T, TQ_H, d, generator=g)
    k[..., torch.randperm(d, generator=g)[:3]] *= 20.0  # three outlier channels
    v = torch.randn(TQ_T, TQ_H, d, generator=g)
    k[1, 0] = 0.0  # zero key: norm 0 -> x_hat 0 -> every coordinate in the middle bucket
    v[2, 1] = 0.0  # constant value: scale clamps to 1e-8
    v[3, 0] *= 1e-3
    q = torch.randn(1, TQ_H * TQ_GQA, d, generator=g)
    return k.half(), v.half(), q.half()


def int4_readback(packed, scale_zp, single_rht):
    """int4_per_token_head's read kernel, (code - zp) * (scale & ~0xF), rotated back with vLLM's `single_rht` (passed
    in: it lives in vLLM) and divided by the rotation's block."""
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1).float()
    bits = scale_zp.view(torch.int32)
    deq = (codes - (bits & 0xF).float()[..., None]) * (bits & -16).view(torch.float32)[..., None]
    d = deq.shape[-1]
    return single_rht(deq, inverse=True) / (d & -d)


def turboquant_full_dequant(kernel, cache, block_table, centroids, cfg, d: int):
    """vLLM's `_tq_full_dequant_kv` (passed in: it lives in vLLM) over the first block's TQ_T tokens, launched as
    turboquant.py always has: (K, V) [1, TQ_H, TQ_BS, d] fp16 on the cache's device, in the rotated basis."""
    kd = torch.zeros(1, TQ_H, TQ_BS, d, dtype=torch.float16, device=cache.device)
    vd = torch.zeros(1, TQ_H, TQ_BS, d, dtype=torch.float16, device=cache.device)
    kernel[(TQ_T, TQ_H)](
        cache, block_table, centroids, kd, vd,
        kd.stride(0), kd.stride(1), kd.stride(2), vd.stride(0), vd.stride(1), vd.stride(2),
        cache.stride(0), cache.stride(1), cache.stride(2), block_table.stride(0),
        HEAD_DIM=d, BLOCK_SIZE=TQ_BS, NUM_KV_HEADS=TQ_H, MSE_BYTES=math.ceil(d * cfg.key_mse_bits / 8),
        KPS=cfg.key_packed_size, VQB=cfg.value_quant_bits,
        VAL_DATA_BYTES=math.ceil(d * cfg.value_quant_bits / 8), MSE_BITS=cfg.key_mse_bits,
        KEY_FP8=int(cfg.key_fp8), BLOCK_D=1 << (d - 1).bit_length(),
        NORM_CORRECTION=int(cfg.norm_correction), FP8_E4B15=0,
    )
    return kd, vd
