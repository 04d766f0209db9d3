#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024.sh, in the folder holding the profile PS6 and plans/ (../README.md):
# the plans beside the uniform settings of ../../2026-12-05-gemma-c128-t32's table, 8 x 1024 tokens of IDLE's help.html
# (seed 12345, the same windows); the budgets that missed 0.7x there first (html8-46.csv), then the others (html8-35.csv).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
python $REPO/benchmarks/plans_by_kind.py PS6 --plan 4=plans/gemma3-270m-4bits.json --plan 6=plans/gemma3-270m-6bits.json \
  --uniforms 4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-46.csv
python $REPO/benchmarks/plans_by_kind.py PS6 --plan 3=plans/gemma3-270m-3bits.json --plan 5=plans/gemma3-270m-5bits.json \
  --uniforms 3=int4_c128/int2_t32_r32_s4,5=int6_c64/int4_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-35.csv
