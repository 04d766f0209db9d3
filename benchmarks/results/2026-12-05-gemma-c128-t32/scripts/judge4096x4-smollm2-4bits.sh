#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096x4-smollm2-4bits.sh, in the folder holding PSm (judge4096-smollm2.sh):
# SmolLM2's 4-bit plan at 4096 tokens beside int4_c64_r32_s4 / int3_t64_r32_s4 on 4 windows of 4096 tokens (the first 2
# are the 2 windows above).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
S=$REPO/benchmarks/results/2026-12-05-smollm2-plain-keys/plans-at4096
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSm --plan 4=$S/smollm2-135m-4bits-r0.json \
  --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 --kinds "" --text html=$H --seq-len 4096 --windows 4 --out html4096x4-smollm2-4bits.csv
