#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge_gemma_6bits_x4.sh, beside PGmin (after judge_gemma_56bits.sh): Gemma's
# 6-bit 4096-token plan against the 4096 screen's pick that measured lowest, `int6_c128 / int6_t128_r32_s4`, on 4
# windows of 4096 tokens of IDLE's help.html (seed 12345: the 2 windows above and 2 more, as
# ../../2026-12-06-gemma-9-windows/scripts/judge4096x4-6bits.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
R=$HERE/../../2026-12-06-gemma-9-windows/plans-at4096
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PGmin --plan 6=$R/gemma3-270m-6bits.json \
  --uniforms 6=int6_c128/int6_t128_r32_s4 --kinds "" --text html=$H --seq-len 4096 --windows 4 \
  --out html4096x4-gemma-6bits.csv > html4096x4-gemma-6bits.log
