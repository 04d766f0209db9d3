#!/usr/bin/env bash
# Every GPU check and benchmark of sensprof in one run, for a machine with an NVIDIA GPU that is lent briefly:
#   1. the tests marked gpu (the runtime and its compiled Triton kernels on CUDA, profile -> plan -> validate ->
#      generate on CUDA);
#   2. vLLM 0.33's own Triton cache writers compiled for the GPU against the fixtures sensprof's emulations are
#      tested with (tools/vllm_golden/on_gpu.py; vLLM itself is not installed: its kernel files are carried in
#      .vllm_kernels, made by tools/vllm_golden/extract_kernels.sh);
#   3. benchmarks/runtime_cuda.py (packed decode attention vs SDPA, end-to-end decode tokens/s);
#   4. benchmarks/decode_kernel_sweep.py (the decode kernel's launch shapes).
# Each step has its own time limit and the next runs whatever the last did. Results go to $OUT (default
# /tmp/sensprof-gpu), at most 8 files as the lending tool returns them: env.txt (versions, each step's exit and
# seconds), steps.log (every step's output), vllm-kernels-gpu.json, the runtime benchmark's json and md, and
# decode-kernel-sweep.json.
#
#   bash benchmarks/gpu_checks.sh            # from the repository root
# A package the machine lacks (PuLP, for `sensprof plan`) is installed from wheels in .whl/ when there are any.
set -uo pipefail
OUT="${OUT:-/tmp/sensprof-gpu}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sensprof-site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/sensprof-site"
fi
step() {  # step NAME SECONDS COMMAND...: run with a limit, append its output to $OUT/steps.log, say how it ended
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS log; log="$(mktemp)"
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/env.txt"
  { echo "===== $name (exit $rc)"; cat "$log"; } >>"$OUT/steps.log"
  tail -n 4 "$log"; rm -f "$log"
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step pytest-gpu "${PYTEST_S:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --durations=10 \
  tests/runtime tests/test_cuda_pipeline.py
step vllm-kernels-gpu "${VLLM_S:-90}" "$PY" tools/vllm_golden/on_gpu.py --kernels .vllm_kernels \
  --out "$OUT/vllm-kernels-gpu.json"
step runtime-cuda "${BENCH_S:-170}" "$PY" benchmarks/runtime_cuda.py --out "$OUT"
step decode-kernel-sweep "${SWEEP_S:-120}" "$PY" benchmarks/decode_kernel_sweep.py --out "$OUT/decode-kernel-sweep.json" \
  --budget-s 90
