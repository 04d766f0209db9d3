"""Golden fixtures for vLLM 0.33's ``ultraquant_4bit`` KV cache, from vLLM's own code.

Runs, on CPU, vLLM's Triton store kernel (``v1/attention/ops/ultraquant/triton_store.py``,
``ultraquant_store``) and full-dequant kernel (``triton_dequant.py``,
``ultraquant_full_dequant_kv``) under ``TRITON_INTERPRET=1``, plus the PyTorch reference
(``reference.py``: ``ultraquant_encode`` and ``reference_ultraquant_attention``), and writes
``tests/data/vllm/ultraquant.pt``.

How to run (from the repository root):

    python -m venv /tmp/vllm033 && . /tmp/vllm033/bin/activate
    pip install --no-deps vllm==0.33.0
    pip install torch triton numpy  # plus the pure-Python deps `import vllm` asks for
    TRITON_INTERPRET=1 python tools/vllm_golden/ultraquant.py

(On the machine this was written on, the venv is ``. /work/vllm_venv/bin/activate``.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import vllm.triton_utils as _vtu  # noqa: E402

# vLLM disables Triton when no GPU driver is active; the interpreter needs the real modules.
_vtu.triton, _vtu.tl = triton, tl

from vllm.v1.attention.ops.ultraquant import format as uq_format  # noqa: E402
from vllm.v1.attention.ops.ultraquant.reference import (  # noqa: E402
    reference_ultraquant_attention,
    ultraquant_encode,
)
from vllm.v1.attention.ops.ultraquant.triton_dequant import ultraquant_full_dequant_kv  # noqa: E402
from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm" / "ultraquant.pt"
TOKENS, KV_HEADS, Q_HEADS = 6, 2, 4


def make_kv(d: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian K/V [T, Hk, D] in bf16; keys get three x20 outlier channels."""
    k = torch.randn(TOKENS, KV_HEADS, d, generator=gen)
    k[..., [1, d // 3, d - 2]] *= 20.0
    v = torch.randn(TOKENS, KV_HEADS, d, generator=gen)
    # one all-zero value row and one tiny-magnitude key row exercise the zero sentinel / small exponents
    v[0, 0] = 0.0
    k[1, 1] *= 1e-4
    return k.bfloat16(), v.bfloat16()


def one_dim(d: int, gen: torch.Generator) -> dict:
    k, v = make_kv(d, gen)
    slot = uq_format.slot_size(d)
    block = 8
    cache = torch.zeros(1, block, KV_HEADS, slot, dtype=torch.uint8)
    ultraquant_store(k, v, cache, torch.arange(TOKENS, dtype=torch.int64))
    cache = cache[0, :TOKENS]  # [T, Hk, slot]
    ko, vo = uq_format.k_scales_offset(d), uq_format.v_codes_offset(d)
    vso = uq_format.v_scales_offset(d)
    k_out = torch.zeros(1, KV_HEADS, block, d, dtype=torch.bfloat16)
    v_out = torch.zeros_like(k_out)
    full = torch.zeros(1, block, KV_HEADS, slot, dtype=torch.uint8)
    full[0, :TOKENS] = cache
    ultraquant_full_dequant_kv(full, torch.zeros(1, 1, dtype=torch.int32), k_out, v_out, block)
    ref_k = ultraquant_encode(k, rotate=True)
    ref_v = ultraquant_encode(v, rotate=False)
    q = torch.randn(1, Q_HEADS, d, generator=gen).bfloat16()
    scale = d**-0.5
    attn = reference_ultraquant_attention(q, k.unsqueeze(0), v.unsqueeze(0), scale=scale)
    return {
        "key": k,  # [T, Hk, D] bf16 input to the store
        "value": v,
        "slot": cache.clone(),  # raw AoS bytes per (token, head)
        "k_codes": cache[..., :ko].clone(),
        "k_scales": cache[..., ko:vo].clone(),
        "v_codes": cache[..., vo:vso].clone(),
        "v_scales": cache[..., vso:].clone(),
        "k_deq_rot": k_out[0, :, :TOKENS].transpose(0, 1).clone(),  # triton dequant, rotated basis, bf16
        "v_deq": v_out[0, :, :TOKENS].transpose(0, 1).clone(),
        "ref_k_codes": ref_k.codes_packed,
        "ref_k_scales": ref_k.scale_bytes,
        "ref_v_codes": ref_v.codes_packed,
        "ref_v_scales": ref_v.scale_bytes,
        "query": q,  # [1, Hq, D]
        "sm_scale": scale,
        "ref_attn": attn,  # reference_ultraquant_attention output [1, Hq, D] bf16
        "slot_size": slot,
    }


def main() -> int:
    gen = torch.Generator().manual_seed(1033)
    data = {"dims": {d: one_dim(d, gen) for d in (64, 128, 256)}}
    data["constant_c"] = uq_format.get_constant_c()
    data["group_size"] = uq_format.get_group_size()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): head dims {list(data['dims'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
