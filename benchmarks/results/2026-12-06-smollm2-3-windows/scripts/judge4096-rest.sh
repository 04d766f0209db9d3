#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-rest.sh, beside PSs3 and plans-at4096/ (after judge4096.sh): the 3-, 5-
# and 6-bit plans beside the best uniform setting known at each budget, 2 x 4096 tokens of IDLE's help.html; then the
# 4-bit plan on 4 windows (seed 12345: the 2 windows above and 2 more), as the one-window profile's was.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
P=plans-at4096/smollm2-135m
python $REPO/benchmarks/plans_by_kind.py PSs3 --plan 3=$P-3bits-r0.json --plan 5=$P-5bits-r0.json --plan 6=$P-6bits-r0.json \
  --uniforms 3=int3_c64_r32_s4/int2_t64_r32_s4,5=int5_c64_r32_s4/int4_t64_r32_s4,6=int6_c128_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-356.csv
python $REPO/benchmarks/plans_by_kind.py PSs3 --plan 4=$P-4bits-r0.json --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 4 --out html4096x4-4bits.csv
