#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-35.sh [PROFILE] (default PS6), in the folder holding the profile and
# plans-at4096/: the 3-5-bit plans planned at 4096 tokens' memory beside the best uniform setting known at each
# budget there (../../2026-12-05-gemma-c128-t32/README.md), 2 x 4096 tokens of IDLE's help.html (seed 12345, the same
# windows).
PS=${1:-PS6}
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py "$PS" --plan 3=plans-at4096/gemma3-270m-3bits.json \
  --plan 4=plans-at4096/gemma3-270m-4bits.json --plan 5=plans-at4096/gemma3-270m-5bits.json \
  --uniforms 3=int3_c128/int3_t64_r32_s4,4=int4_c64_r32_s4/int3_t64_r32_s4,5=int5_c128/int5_t128_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-35.csv
