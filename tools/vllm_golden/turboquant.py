"""Golden fixtures for vLLM 0.33's TurboQuant KV dtypes (turboquant_k8v4, turboquant_4bit_nc,
turboquant_k3v4_nc, turboquant_3bit_nc).

Runs vLLM's OWN Triton kernels on CPU under the Triton interpreter:
  - store:   v1/attention/ops/triton_turboquant_store.py::triton_turboquant_store
  - dequant: v1/attention/ops/triton_turboquant_decode.py::_tq_full_dequant_kv (continuation-prefill read)
  - decode:  v1/attention/ops/triton_turboquant_decode.py::triton_turboquant_decode_attention
with vLLM's own centroids (quantization/turboquant/centroids.py::get_centroids), presets
(quantization/turboquant/config.py::TurboQuantConfig) and Hadamard (backends/turboquant_attn.py::
_build_hadamard_cached, exec'd from the source file because importing the backend module pulls in
the whole engine).

Caveat recorded in the fixture: the Triton *interpreter's* fp32->fp8e4nv cast is not the GPU's
(it truncates subnormals, rounds ties away and does not carry a mantissa overflow into the exponent),
so the fp8 key bytes of turboquant_k8v4 in the fixture are NOT golden; tests check those against a
bit-level re-derivation of cvt.rn.satfinite instead.

Run (any venv with ``pip install --no-deps vllm==0.33.0`` plus torch, triton and the small
pure-Python deps vllm.config imports; on the sensprof dev box ``. /work/vllm_venv/bin/activate``),
from the repo root:

    CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 python tools/vllm_golden/turboquant.py

(CUDA_VISIBLE_DEVICES set but empty keeps vllm.triton_utils from swapping Triton for a placeholder
on a GPU-less box.)  Writes tests/data/vllm/turboquant.pt.
"""

import ast
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

import vllm.v1.attention as _va  # noqa: E402
from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids  # noqa: E402
from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # noqa: E402
from vllm.v1.attention.ops.triton_turboquant_decode import (  # noqa: E402
    _tq_full_dequant_kv,
    triton_turboquant_decode_attention,
)
from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "vllm", "turboquant.pt")
from golden_common import TQ_BS as BS  # noqa: E402
from golden_common import TQ_DIMS as DIMS  # noqa: E402
from golden_common import TQ_GQA as GQA  # noqa: E402
from golden_common import TQ_H as H  # noqa: E402
from golden_common import TQ_PRESETS as PRESETS  # noqa: E402
from golden_common import TQ_T as T  # noqa: E402
from golden_common import turboquant_full_dequant  # noqa: E402
from golden_common import turboquant_inputs as inputs  # noqa: E402


def _hadamard_fn():
    src_path = os.path.join(os.path.dirname(_va.__file__), "backends", "turboquant_attn.py")
    tree = ast.parse(open(src_path).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_build_hadamard_cached")
    fn.decorator_list = []
    ns = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), src_path, "exec"), ns)
    return lambda d: ns["_build_hadamard_cached"](d, "cpu")


def main():
    hadamard = _hadamard_fn()
    out = {"T": T, "H": H, "GQA": GQA, "fp8_key_bytes_from_interpreter_not_golden": True, "cases": []}
    cent = {}
    for i, d in enumerate(DIMS):
        k, v, q = inputs(d, 2000 + i)
        Hm = hadamard(d)
        base = {"d": d, "k": k, "v": v, "q": q}
        out["cases"].append(base)
        for p in PRESETS:
            cfg = TurboQuantConfig.from_cache_dtype(p, d)
            c = get_centroids(d, cfg.centroid_bits).float()
            cent[(d, cfg.centroid_bits)] = c.clone()
            cs, _ = c.sort()
            mid = (cs[:-1] + cs[1:]) / 2
            cache = torch.zeros(1, BS, H, cfg.slot_size_aligned, dtype=torch.uint8)
            slots = torch.arange(T, dtype=torch.int32)
            triton_turboquant_store(
                k, v, cache, slots, Hm, mid,
                mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                value_quant_bits=cfg.value_quant_bits, key_fp8=cfg.key_fp8,
            )
            bt = torch.zeros(1, 1, dtype=torch.int32)
            kd, vd = turboquant_full_dequant(_tq_full_dequant_kv, cache, bt, c, cfg, d)
            o = triton_turboquant_decode_attention(
                q, cache, bt, torch.tensor([T], dtype=torch.int32), Hm, c, 1.0 / math.sqrt(d),
                mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                value_quant_bits=cfg.value_quant_bits, key_fp8=cfg.key_fp8,
                norm_correction=cfg.norm_correction, PiT=Hm, max_num_kv_splits=4,
            )
            base[p] = {
                "slot": cache[0, :T].clone(),  # [T, H, slot_size_aligned] uint8, as vLLM stores it
                "k_deq": kd[0, :, :T].clone(),  # [H, T, d] fp16, rotated basis (before @ Pi_half)
                "v_deq": vd[0, :, :T].clone(),
                "decode_out": o.clone(),  # [1, H*GQA, d] fp16
                "sizes": (cfg.key_packed_size, cfg.value_packed_size, cfg.slot_size, cfg.slot_size_aligned),
            }
            print(f"{p} d={d}: slot {tuple(cache[0, :T].shape)} sizes {base[p]['sizes']}")
    out["centroids"] = cent
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    torch.save(out, OUT)
    print("wrote", os.path.normpath(OUT), os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
