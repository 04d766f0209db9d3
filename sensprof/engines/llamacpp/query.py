"""llama.cpp's CPU attention with a quantized K cache: the query is quantized too.

ggml-cpu's flash attention (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk) converts
each query row to the K type's `vec_dot_type` (`q_to_vec_dot(pq, Q_q, DK)`) and scores it with the type's integer
dot product: q8_0 for q8_0, q4_0 and q5_0 keys, q8_1 for q4_1 and q5_1 (the same 8-bit codes and fp16 scale per
block of 32, plus the block's sum s = d * sum(codes) stored as fp16, which the key's min multiplies: that one fp16
rounding, relative 2^-11 of the min term, is the one part of the read not emulated here). So a q8_0 key cache costs
about twice a q8_0 key's own error.
Same-type f16 or f32 K and V take the tiled path instead, which keeps the query in float32 (no transform).

The x86 quantizer (ggml-cpu/arch/x86/quants.c, quantize_row_q8_0 / q8_1): per block of 32, amax over the block,
codes round(x * (127 / amax)) with round-half-to-even (_mm256_round_ps, _MM_ROUND_NEAREST), scale d = amax / 127
stored as fp16; the dot product reads d as stored.
"""

from __future__ import annotations

import torch

BLOCK = 32


def quantize_query_q8(q: torch.Tensor) -> torch.Tensor:
    """The float32 query llama.cpp's dot product sees: q8 blocks of 32 along head_dim, dequantized."""
    x = q.float()
    d = x.shape[-1]
    pad = (-d) % BLOCK
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], pad)], -1)
    g = x.reshape(*x.shape[:-1], -1, BLOCK)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    codes = torch.round(g * inv)  # half to even, as _mm256_round_ps
    scale = (amax / 127.0).half().float()
    return (codes * scale).reshape(*x.shape[:-1], -1)[..., :d]


QUERY_TRANSFORMS = {"llamacpp.q8": quantize_query_q8}
