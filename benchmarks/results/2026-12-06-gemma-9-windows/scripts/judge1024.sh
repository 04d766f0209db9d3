#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024.sh, beside PS9 and plans/, plans-r1/: the plans beside the uniform
# settings of ../../2026-12-06-gemma-6-windows's table row, 8 x 1024 tokens of IDLE's help.html (seed 12345, the same
# windows); the --robust 1 plans at the budgets that missed 0.7x there beside them.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
python $REPO/benchmarks/plans_by_kind.py PS9 --plan 4=plans/gemma3-270m-4bits.json --plan 6=plans/gemma3-270m-6bits.json \
  --plan 4=plans-r1/gemma3-270m-4bits.json --plan 6=plans-r1/gemma3-270m-6bits.json \
  --uniforms 4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-46.csv
python $REPO/benchmarks/plans_by_kind.py PS9 --plan 3=plans/gemma3-270m-3bits.json --plan 5=plans/gemma3-270m-5bits.json \
  --uniforms 3=int4_c128/int2_t32_r32_s4,5=int6_c64/int4_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-35.csv
