#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge_gemma_56bits.sh, in the folder of screen_gemma_56.sh (fifteenth session):
# Gemma's 5- and 6-bit 4096-token plans against the 4096 screen's three picks for each budget and the best setting
# known there (5 bits: the screen's first pick itself; 6 bits: `int6_c64_r32_s4 / int5_t64_r32_s4`, 6.444 bits held,
# above the budget), 2 x 4096 tokens of IDLE's help.html (seed 12345, the README table's windows). PGmin is any
# profile of the model:  sensprof profile --model gemma3-270m --schemes int8_c32 --seq-len 64 --windows 1 --out PGmin
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
R=$HERE/../../2026-12-06-gemma-9-windows/plans-at4096
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PGmin --plan 5=$R/gemma3-270m-5bits.json \
  --plan 6=$R/gemma3-270m-6bits.json \
  --uniforms 5=int5_c128/int5_t128_r32_s4+int6_c128/int4_t128_r32_s4+int5_c64/int4_t32_r32_s4,6=int6_c32/int5_t64_r32_s4+int6_c64/int5_t32_r32_s4+int6_c128/int6_t128_r32_s4+int6_c64_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-gemma-56bits.csv > html4096x2-gemma-56bits.log
