#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024.sh, beside PSH (profile.sh) and plans/
# (../../2026-12-05-gemma-c128-t32/scripts/plans.sh PSH): the plans made on the other HTML page beside the best uniform
# setting known at each budget, 8 x 1024 tokens of IDLE's help.html (seed 12345, the README table's windows).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSH --plan 3=plans/gemma3-270m-3bits.json \
  --plan 4=plans/gemma3-270m-4bits.json --plan 5=plans/gemma3-270m-5bits.json --plan 6=plans/gemma3-270m-6bits.json \
  --uniforms 3=int4_c128/int2_t32_r32_s4,4=int5_c128/int3_t32_r32_s4,5=int6_c64/int4_t64_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --windows 8 --out html8.csv
