#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-35.sh, beside PS9 (merge.sh; or the plans alone: plans_by_kind reads only
# PS9's meta): the 3-5-bit plans planned at 4096 tokens' memory beside the best uniform setting known at each budget
# there (../../2026-12-06-gemma-6-windows's table row), 2 x 4096 tokens of IDLE's help.html (seed 12345).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
HERE=$(cd "$(dirname "$0")/.." && pwd)
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PS9 --plan 3=$HERE/plans-at4096/gemma3-270m-3bits.json \
  --plan 4=$HERE/plans-at4096/gemma3-270m-4bits.json --plan 5=$HERE/plans-at4096/gemma3-270m-5bits.json \
  --uniforms 3=int3_c128/int3_t64_r32_s4,4=int4_c64_r32_s4/int3_t64_r32_s4,5=int5_c128/int5_t128_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-35.csv
