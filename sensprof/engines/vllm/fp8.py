"""vLLM 0.33 plain fp8 KV cache (``fp8`` = ``fp8_e4m3``, ``fp8_e5m2``) and the fp8 query some backends use.

Write (Triton path, ``v1/attention/ops/triton_reshape_and_cache_flash.py``, ``reshape_and_cache_kernel_flash``):
``x / k_scale`` in fp32 (a true division, not a multiply by the inverse), then the store's implicit cast to fp8,
which Triton lowers on sm89+ to ``cvt.rn.satfinite`` (round to nearest even, saturate to the largest finite).
The CUDA ``reshape_and_cache_flash`` op (FlashAttention / FlashInfer backends) is not in the wheel; by vLLM's
csrc it is the same saturating cast of ``x / scale``. ``k_scale`` / ``v_scale`` default to 1.0 unless the
checkpoint carries scales (``model_executor/layers/quantization/kv_cache.py``). So the write is exactly a
saturating cast of x / scale, read back as code * scale.

One divergence: the Triton writer and ``TritonAttentionImpl`` view every fp8 cache as
``current_platform.fp8_dtype()`` (``kv_cache_torch_dtype`` in ``triton_reshape_and_cache_flash``; ``.view(self.
fp8_dtype)`` in ``triton_attn.py``), so on the Triton backend ``fp8_e5m2`` is stored and read as e4m3fn
(e4m3fnuz, max 240, on MI300). FlashInfer (``flashinfer.py``) and the csrc op keep real e5m2.

Query (``model_executor/layers/attention/attention.py``, ``Attention.__init__`` / ``forward``): when the backend
sets ``supports_quant_query_input`` and the cache dtype is ``fp8``/``fp8_e4m3`` (not ``*_per_token_head``), the
query goes through ``QuantFP8(static=True)`` with ``q_scale`` (default 1.0, per tensor, or per KV head when the
checkpoint has one per head): ``(q * (1 / q_scale)).clamp(+-448).to(e4m3fn)`` (``input_quant_fp8.py``,
``forward_native``), and attention multiplies the descale back. ``fp8_e5m2`` never gets an fp8 query (the
``forward`` assert only admits fp8 / fp8_e4m3).
"""

from __future__ import annotations

from typing import Callable

import torch

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def saturating_cast(x: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """fp32 -> fp8 with round to nearest even and saturation to +-max finite (PTX ``cvt.rn.satfinite``)."""
    dt = FORMATS[fmt]
    fmax = torch.finfo(dt).max
    return x.float().clamp(-fmax, fmax).to(dt)


def quantize_fp8(x: torch.Tensor, scale: float | torch.Tensor = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    """The fp8 cache vLLM stores for x: saturating cast of x / scale (fp32 division)."""
    return saturating_cast(x.float() / torch.as_tensor(scale, dtype=torch.float32), fmt)


def fp8_kv(x: torch.Tensor, scale: float | torch.Tensor = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    """What attention reads back from a plain fp8 cache, float32: code * scale."""
    return quantize_fp8(x, scale, fmt).float() * torch.as_tensor(scale, dtype=torch.float32)


def quantize_query_fp8(q: torch.Tensor, q_scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """The float32 query attention effectively sees on fp8-query backends: e4m3fn(clamp(q / q_scale)) * q_scale.

    q is [batch, heads, tokens, head_dim]; q_scale is a scalar, or one value per KV head ([kv_heads]) which is
    spread over that head's query group (``GroupShape(-1, head_size * heads // kv_heads)``).
    """
    if not torch.is_tensor(q_scale) and q_scale == 1.0:  # the default scale: the cast alone (a decode step's query)
        return saturating_cast(q.float(), "e4m3").float()
    s = torch.as_tensor(q_scale, dtype=torch.float32, device=q.device)
    if s.numel() > 1:
        s = s.reshape(-1).repeat_interleave(q.shape[1] // s.numel()).reshape(1, -1, 1, 1)
    inv = s.reciprocal()
    return saturating_cast(q.float() * inv, "e4m3").float() * s


def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """``fp8`` / ``fp8_e4m3`` with the default k_scale = v_scale = 1.0: saturating e4m3fn cast, float32."""
    return fp8_kv(x, 1.0, "e4m3")


def fp8_e5m2(x: torch.Tensor) -> torch.Tensor:
    """``fp8_e5m2`` as FlashInfer stores it (scale 1.0): saturating e5m2 cast, float32. On the Triton backend
    vLLM stores e4m3fn bits instead (see the module docstring): use ``fp8_e4m3`` for that path."""
    return fp8_kv(x, 1.0, "e5m2")


EMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "vllm.fp8_e4m3": fp8_e4m3,
    "vllm.fp8_e5m2": fp8_e5m2,
    "vllm.query_fp8": quantize_query_fp8,
}
