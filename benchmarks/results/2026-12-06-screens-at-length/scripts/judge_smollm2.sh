#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge_smollm2.sh, beside screen_smollm2.sh's output: the 3-5-bit plans against
# the screen's first picks, 2 x 4096 tokens of IDLE's help.html (seed 12345, the README table's windows). PSmin is any
# profile of the model (plans_by_kind.py reads only its meta to load the model):
#   sensprof profile --model smollm2-135m --schemes int8_c32 --seq-len 64 --windows 1 --out PSmin
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
P=$HERE/../../2026-12-06-smollm2-3-windows/plans-at4096/smollm2-135m
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSmin --plan 3=$P-3bits-r0.json --plan 4=$P-4bits-r0.json \
  --plan 5=$P-5bits-r0.json \
  --uniforms 3=int3_c128_r32_s4/int2_t64_r32_s4,4=int4_c128_r32_s4/int3_t64_r32_s4,5=int5_c128_r32_s4/int4_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-smollm2.csv > html4096x2-smollm2.log
