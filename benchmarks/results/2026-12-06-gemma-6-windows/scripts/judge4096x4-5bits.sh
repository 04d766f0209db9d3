#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096x4-5bits.sh [PROFILE], in the folder holding PS6 (or PROFILE) and
# plans-at4096/: the 5-bit plan planned at 4096 tokens' memory beside the best uniform setting known there
# (../../2026-12-05-gemma-c128-t32/README.md), 4 x 4096 tokens of IDLE's help.html (seed 12345).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py "${1:-PS6}" --plan 5=plans-at4096/gemma3-270m-5bits.json \
  --uniforms 5=int5_c128/int5_t128_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 4 --out html4096x4-5bits.csv
