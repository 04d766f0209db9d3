#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096.sh, beside PS9 and plans-at4096/: the plans planned at 4096 tokens'
# memory beside the best uniform setting known at each budget there (../../2026-12-06-gemma-6-windows's table row),
# 2 x 4096 tokens of IDLE's help.html (seed 12345, the same windows): 6 bits, the budget that missed 0.7x there.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
python $REPO/benchmarks/plans_by_kind.py PS9 --plan 6=plans-at4096/gemma3-270m-6bits.json \
  --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-6bits.csv
