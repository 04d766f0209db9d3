"""vLLM 0.33 ``--kv-cache-dtype nvfp4`` / ``nvfp4_4over6``: E2M1 codes + E4M3 scales per 16.

Facts (paths relative to the ``vllm`` package):

* ``utils/torch_utils.py`` ``nvfp4_kv_cache_full_dim``: per token per KV head and per side
  (K, V) ``D/2`` bytes of packed E2M1 data + ``D/16`` bytes of float8_e4m3fn block scales;
  ``v1/attention/backends/flashinfer.py`` ``FlashInferBackend.customize_spec`` stores K and V
  as separate head slots of that size (no further padding); ``nvfp4_split_data_scale`` puts
  a page's data first and its scales after it.
* Global scale: static, ``layer._k_scale`` / ``layer._v_scale`` (1.0 unless the checkpoint
  carries KV scales; ``model_executor/layers/attention/attention.py``
  ``set_default_quant_scales``). It is handed to the cache writer and multiplied back in by
  attention (``bmm1_scale = sm_scale * q_scale * k_scale``, ``bmm2_scale = v_scale``), so the
  stored value is ``x / k_scale``.
* Block scale and codes follow vLLM's NVFP4 reference ``ref_nvfp4_quant``
  (``model_executor/layers/quantization/utils/nvfp4_emulation_utils.py``): ``s =
  e4m3(clamp(amax/6 * gs, 448))`` with ``gs = 1/k_scale``, codes ``= rne_e2m1(clamp(x /
  (s/gs), +-6))`` (``cast_to_fp4``: ties to even, e.g. 0.25->0, 0.75->1, 2.5->2, 5->4).
  The KV writer kernels themselves (CUDA ``_C_cache_ops.reshape_and_cache_flash`` on SM100,
  FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` on SM80/90/120)
  are not in the wheel's source; see the report.
* ``nvfp4_4over6`` (``config/cache.py`` ``CacheConfig.cache_dtype`` doc): same layout, each
  16-block picks the ``amax/6`` or ``amax/4`` block scale with the smaller squared
  reconstruction error; reads are identical (flashinfer.py sets ``kv_cache_dtype = "nvfp4"``).
  The tie rule is not in the Python source; here a tie keeps ``amax/6``.
* Query: on SM100 (trtllm-gen) the query is cast to FP8 E4M3 with the static ``q_scale``
  (``attention.py`` ``query_quant``, ``QuantFP8`` static per-tensor) and the attention
  output goes through an FP8 buffer; on SM80/90/120 (FlashInfer fa2/XQA) the query stays
  in the model dtype (``q_scale=1.0 if self.nvfp4_fa2``). Prefill reads the quantized cache
  too (paged prefill wrappers / ``trtllm_batch_context_with_kv_cache``).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...constants import FP8_E4M3_MAX as E4M3_MAX
from .nibbles import pack_nibbles, unpack_nibbles

BLOCK = 16
_E2M1_MAG = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def check_head_dim(d: int) -> None:
    """FlashInfer's head sizes (``get_supported_head_sizes``); 64 is refused on SM80/90/120."""
    if d not in (64, 128, 256, 512):
        raise ValueError(f"nvfp4 KV cache supports head_dim 64/128/256/512, got {d}")


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 magnitude index (0..7) for |v| <= 6, ties to even (``cast_to_fp4``)."""
    a = v.abs()
    idx = torch.zeros_like(a, dtype=torch.int64)
    # (lower bound, inclusive?) for each index 1..7, per cast_to_fp4's thresholds
    for i, (lo, inclusive) in enumerate(
        ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)), 1
    ):
        idx = torch.where(a >= lo if inclusive else a > lo, torch.full_like(idx, i), idx)
    return idx


def _block_scale(amax: torch.Tensor, divisor: float, gs: torch.Tensor) -> torch.Tensor:
    s = gs * (amax * (1.0 / divisor))
    return s.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _codes_for(g: torch.Tensor, scale: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    sf = scale.float()
    prod = sf * (1.0 / gs)
    inv = 1.0 / (prod + (prod == 0) * 1e8)  # vLLM's get_reciprocal: 0 -> ~0
    y = (g * inv.unsqueeze(-1)).clamp(-6.0, 6.0)
    return round_e2m1(y) | ((y < 0).to(torch.int64) << 3)


def _values(bits: torch.Tensor) -> torch.Tensor:
    mag = torch.tensor(_E2M1_MAG, dtype=torch.float32, device=bits.device)[bits & 7]
    return torch.where((bits & 8) != 0, -mag, mag)


def quantize_nvfp4(
    x: torch.Tensor, kv_scale: float = 1.0, four_over_six: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and block scales as the cache holds them.

    Returns ``(data uint8 [..., D/2], scales float8_e4m3fn [..., D/16])``; element 2i sits
    in the low nibble, a nibble is ``sign<<3 | magnitude index``.
    """
    d = x.shape[-1]
    if d % BLOCK:
        raise ValueError(f"nvfp4 needs head_dim % 16 == 0, got {d}")
    g = x.float().reshape(*x.shape[:-1], d // BLOCK, BLOCK)
    gs = torch.tensor(1.0 / kv_scale, dtype=torch.float32, device=x.device)
    amax = g.abs().amax(-1)
    scale = _block_scale(amax, 6.0, gs)
    bits = _codes_for(g, scale, gs)
    if four_over_six:
        s4 = _block_scale(amax, 4.0, gs)
        b4 = _codes_for(g, s4, gs)
        err6 = ((_values(bits) * (scale.float() / gs).unsqueeze(-1) - g) ** 2).sum(-1)
        err4 = ((_values(b4) * (s4.float() / gs).unsqueeze(-1) - g) ** 2).sum(-1)
        pick4 = err4 < err6
        bits = torch.where(pick4.unsqueeze(-1), b4, bits)
        scale = torch.where(pick4, s4.float(), scale.float()).to(torch.float8_e4m3fn)
    bits = bits.reshape(*x.shape[:-1], d)
    data = pack_nibbles(bits)
    return data, scale


def dequantize_nvfp4(data: torch.Tensor, scales: torch.Tensor, kv_scale: float = 1.0) -> torch.Tensor:
    """What attention reads: ``e2m1 * e4m3_block_scale * kv_scale`` in fp32."""
    bits = unpack_nibbles(data.to(torch.int64))
    vals = _values(bits).reshape(*data.shape[:-1], scales.shape[-1], BLOCK)
    return (vals * (scales.float() * kv_scale).unsqueeze(-1)).reshape(vals.shape[:-2] + (-1,))


def nvfp4(x: torch.Tensor, kv_scale: float = 1.0) -> torch.Tensor:
    """``nvfp4`` round trip (default k_scale/v_scale 1.0)."""
    return dequantize_nvfp4(*quantize_nvfp4(x, kv_scale), kv_scale)


def nvfp4_4over6(x: torch.Tensor, kv_scale: float = 1.0) -> torch.Tensor:
    """``nvfp4_4over6`` round trip: per block the better of amax/6 and amax/4 (SM100 only)."""
    return dequantize_nvfp4(*quantize_nvfp4(x, kv_scale, four_over_six=True), kv_scale)


def query_fp8_sm100(q: torch.Tensor, q_scale: float = 1.0) -> torch.Tensor:
    """SM100 trtllm-gen query: ``fp8_e4m3(clamp(q / q_scale, +-448)) * q_scale``.

    On SM80/90/120 the query is not quantized (identity).
    """
    y = (q.float() * (1.0 / q_scale)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y.float() * q_scale


EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.nvfp4": nvfp4,
    "vllm.nvfp4_4over6": nvfp4_4over6,
}

QUERY_TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # SM100 only; the SM80/90/120 FlashInfer path keeps the model-dtype query.
    "vllm.nvfp4": query_fp8_sm100,
    "vllm.nvfp4_4over6": query_fp8_sm100,
}


def bytes_per_token_head(head_dim: int) -> dict[str, int]:
    """Cache bytes per token per KV head (``nvfp4_kv_cache_full_dim``) for K and for V."""
    check_head_dim(head_dim)
    n = head_dim // 2 + head_dim // BLOCK
    return {"K": n, "V": n}
