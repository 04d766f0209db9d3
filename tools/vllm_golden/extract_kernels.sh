#!/usr/bin/env bash
# Extract from a vLLM wheel only the pure-Python files that tools/vllm_golden/on_gpu.py needs to run vLLM's own
# KV-cache write/read Triton kernels without the vllm package (no install, no compiled extension).
#
#   tools/vllm_golden/extract_kernels.sh /tmp/vw/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl .vllm_kernels
#
# DEST gets vllm/... with the files below (about 400 KB) and MANIFEST.txt (wheel name, sha256 of every file).
#  imported as-is through on_gpu.py's shim package:
#    v1/attention/ops/{triton_reshape_and_cache_flash,int4_per_token_head,triton_attention_helpers,
#                      triton_unified_attention,triton_turboquant_store,triton_turboquant_decode,
#                      triton_decode_attention}.py
#    model_executor/layers/quantization/turboquant/{__init__,centroids,config}.py, utils/math_utils.py
#  read by on_gpu.py, which copies single definitions out of them (the rest of each file imports the engine):
#    v1/kv_cache_interface.py            KVQuantMode, get_kv_quant_mode, is_quantized_kv_cache
#    config/cache.py                     get_kv_cache_dtype_handler
#    model_executor/layers/quantization/utils/quant_utils.py   get_fp8_min_max
#    v1/attention/backends/turboquant_attn.py                  _build_hadamard_cached
#    triton_utils/__init__.py, platforms/interface.py           reference for the hand-written stubs only
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 WHEEL DEST" >&2
    exit 2
fi
WHEEL=$1
DEST=$2
[ -f "$WHEEL" ] || { echo "no such wheel: $WHEEL" >&2; exit 1; }
PY=${PYTHON:-python3}
"$PY" - "$WHEEL" "$DEST" <<'PYEOF'
import hashlib
import os
import sys
import zipfile

FILES = [
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
    "vllm/v1/attention/ops/int4_per_token_head.py",
    "vllm/v1/attention/ops/triton_attention_helpers.py",
    "vllm/v1/attention/ops/triton_unified_attention.py",
    "vllm/v1/attention/ops/triton_turboquant_store.py",
    "vllm/v1/attention/ops/triton_turboquant_decode.py",
    "vllm/v1/attention/ops/triton_decode_attention.py",
    "vllm/model_executor/layers/quantization/turboquant/__init__.py",
    "vllm/model_executor/layers/quantization/turboquant/centroids.py",
    "vllm/model_executor/layers/quantization/turboquant/config.py",
    "vllm/utils/math_utils.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/config/cache.py",
    "vllm/model_executor/layers/quantization/utils/quant_utils.py",
    "vllm/v1/attention/backends/turboquant_attn.py",
    "vllm/triton_utils/__init__.py",
    "vllm/platforms/interface.py",
]
wheel, dest = sys.argv[1], sys.argv[2]
lines = [f"wheel {os.path.basename(wheel)}"]
total = 0
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    missing = [f for f in FILES if f not in names]
    if missing:
        sys.exit(f"not in the wheel: {missing}")
    for f in FILES:
        data = z.read(f)
        out = os.path.join(dest, f)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as fh:
            fh.write(data)
        total += len(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {f}")
with open(os.path.join(dest, "MANIFEST.txt"), "w") as fh:
    fh.write("\n".join(lines) + "\n")
print(f"extracted {len(FILES)} files ({total} bytes) from {os.path.basename(wheel)} into {dest}")
PYEOF
