#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge_gemma_4bits.sh: Gemma's 4-bit 4096-token plan against the 4096 screen's
# second pick (the one its 1024-token screen did not rank in its three) and the best setting known there, 2 x 4096
# tokens of IDLE's help.html (seed 12345, the README table's windows). PGmin is any profile of the model:
#   sensprof profile --model gemma3-270m --schemes int8_c32 --seq-len 64 --windows 1 --out PGmin
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
R=$HERE/../../2026-12-06-gemma-9-windows/plans-at4096
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PGmin --plan 4=$R/gemma3-270m-4bits.json \
  --uniforms 4=int4_c64/int3_t32_r32_s4+int4_c64_r32_s4/int3_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-gemma-4bits.csv > html4096x2-gemma-4bits.log
