#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024-6.sh, beside PSH6 and six/plans/ (merge6.sh): the six-window HTML
# profile's 4- and 6-bit plans beside the best uniform setting known at each budget, 8 x 1024 tokens of IDLE's
# help.html (seed 12345, the README table's windows).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSH6 --plan 4=six/plans/gemma3-270m-4bits.json \
  --plan 6=six/plans/gemma3-270m-6bits.json --uniforms 4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --windows 8 --out html8-six.csv
