#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge.sh (after plans.sh): judge_windows.py on the README table's 8 windows.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); P9=$HERE/../../2026-12-06-gemma-9-windows/plans
OMP_NUM_THREADS=2 python "$HERE/judge_windows.py" PSO judged.csv \
  4=oracle/gemma3-270m-4bits.json 5=oracle/gemma3-270m-5bits.json 6=oracle/gemma3-270m-6bits.json \
  4=mix/gemma3-270m-4bits.json 5=mix/gemma3-270m-5bits.json 6=mix/gemma3-270m-6bits.json \
  4=$P9/gemma3-270m-4bits.json 6=$P9/gemma3-270m-6bits.json \
  --uniforms 4=int5_c128/int3_t32_r32_s4,5=int6_c64/int4_t64_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4
# after select.sh (BUDGETS=4): the plan chosen on the page's other windows, beside the same uniform setting
[ -f selected/gemma3-270m-4bits.json ] && OMP_NUM_THREADS=2 python "$HERE/judge_windows.py" PSO judged-selected.csv \
  4=selected/gemma3-270m-4bits.json --uniforms 4=int5_c128/int3_t32_r32_s4
