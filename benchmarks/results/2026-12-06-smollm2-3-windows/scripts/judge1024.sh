#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024.sh, beside PSs3 and plans/: the plans beside the best uniform setting
# known at each budget (the README table's SmolLM2 row), 8 x 1024 tokens of IDLE's help.html (seed 12345, the same
# windows).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSs3 --plan 3=plans/smollm2-135m-3bits-r0.json \
  --plan 4=plans/smollm2-135m-4bits-r0.json --plan 5=plans/smollm2-135m-5bits-r0.json --plan 6=plans/smollm2-135m-6bits-r0.json \
  --uniforms 3=int4_c128/int2_t64_r32_s4,4=int4_c64_r32_s4/int3_t64_r32_s4,5=int5_c64_r32_s4/int4_t64_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --windows 8 --out html8.csv
