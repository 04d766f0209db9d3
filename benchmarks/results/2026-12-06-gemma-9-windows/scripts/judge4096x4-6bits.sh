#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096x4-6bits.sh, beside PS9 and plans-at4096/ (after judge4096.sh): the
# 6-bit plan and its uniform setting on 4 windows of 4096 tokens of IDLE's help.html (seed 12345: the 2 windows of
# judge4096.sh and 2 more), for a lead that 2 windows leave at 2 standard errors.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PS9 --plan 6=plans-at4096/gemma3-270m-6bits.json \
  --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --seq-len 4096 --windows 4 --out html4096x4-6bits.csv
