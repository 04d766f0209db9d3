#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096.sh, beside PSs3 and plans-at4096/: the plans planned at 4096 tokens'
# memory beside the best uniform setting known at each budget there (the README table's SmolLM2 row), 2 x 4096 tokens
# of IDLE's help.html (seed 12345, the same windows): 4 bits, the budget that missed 0.5x there.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
P=plans-at4096/smollm2-135m
python $REPO/benchmarks/plans_by_kind.py PSs3 --plan 4=$P-4bits-r0.json --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-4bits.csv
