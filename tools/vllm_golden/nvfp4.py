"""Golden fixtures for vLLM 0.33's ``nvfp4`` KV cache, from vLLM's own NVFP4 PyTorch reference.

vLLM 0.33 writes an NVFP4 KV cache with code that is not in the wheel's Python/Triton
source: ``torch.ops._C_cache_ops.reshape_and_cache_flash`` (CUDA, SM100 trtllm-gen path)
or FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` (SM80/90/120),
see ``v1/attention/backends/flashinfer.py`` ``do_kv_cache_update``. The closest thing vLLM
ships that runs on CPU is its generic NVFP4 reference
``model_executor/layers/quantization/utils/nvfp4_emulation_utils.py``: ``ref_nvfp4_quant``
(block 16, E4M3 block scale = global_scale * amax / 6, E2M1 round-to-nearest-even). This
script runs it with ``global_scale = 1 / k_scale`` (vLLM's k_scale is the dequant multiplier
applied in ``bmm1_scale``) and writes ``tests/data/vllm/nvfp4.pt``. ``nvfp4_4over6`` has no
CPU-runnable vLLM code at all, so it gets no fixture here.

How to run (from the repository root):

    python -m venv /tmp/vllm033 && . /tmp/vllm033/bin/activate
    pip install --no-deps vllm==0.33.0
    pip install torch triton numpy  # plus the pure-Python deps `import vllm` asks for
    python tools/vllm_golden/nvfp4.py

(On the machine this was written on, the venv is ``. /work/vllm_venv/bin/activate``.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
    ref_nvfp4_quant,
    ref_nvfp4_quant_dequant,
)

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm" / "nvfp4.pt"
TOKENS, KV_HEADS = 6, 2


def make_kv(d: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian K/V [T, Hk, D] in bf16; keys get three x20 outlier channels."""
    k = torch.randn(TOKENS, KV_HEADS, d, generator=gen)
    k[..., [1, d // 3, d - 2]] *= 20.0
    v = torch.randn(TOKENS, KV_HEADS, d, generator=gen)
    v[0, 0] = 0.0  # all-zero row
    k[1, 1] *= 1e-3  # tiny row: block scales fall into E4M3 subnormals / zero
    return k.bfloat16(), v.bfloat16()


def run(x: torch.Tensor, kv_scale: float) -> dict:
    d = x.shape[-1]
    flat = x.reshape(-1, d)
    gs = torch.tensor(1.0 / kv_scale, dtype=torch.float32)
    vals, scale = ref_nvfp4_quant(flat.float(), gs, 16)
    deq = ref_nvfp4_quant_dequant(flat.float(), gs, 16)
    return {
        "fp4_values": vals.reshape(*x.shape),  # E2M1 values (float32), sign kept (-0.0 possible)
        "block_scales": scale.reshape(*x.shape[:-1], d // 16).to(torch.float8_e4m3fn),
        "deq": deq.reshape(*x.shape),  # values * block_scale / global_scale
    }


def main() -> int:
    gen = torch.Generator().manual_seed(4033)
    dims = {}
    for d in (64, 128, 256):
        k, v = make_kv(d, gen)
        dims[d] = {"key": k, "value": v, "cases": {s: {"K": run(k, s), "V": run(v, s)} for s in (1.0, 0.0625)}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"dims": dims, "block": 16}, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): head dims {list(dims)}, kv scales (1.0, 0.0625)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
