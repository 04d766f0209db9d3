#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-6bits.sh [PROFILE] (default PS6), in the folder holding the profile and
# plans-at4096/: the 6-bit plan planned at 4096 tokens' memory (the budget that missed 0.7x at 4096 in
# ../../2026-12-05-gemma-c128-t32) beside the best uniform setting known there, 2 x 4096 tokens of IDLE's
# help.html (seed 12345, the same windows).
PS=${1:-PS6}
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py "$PS" --plan 6=plans-at4096/gemma3-270m-6bits.json \
  --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-6bits.csv
