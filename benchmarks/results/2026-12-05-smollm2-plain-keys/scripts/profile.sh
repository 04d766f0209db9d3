#!/usr/bin/env bash
# As run: bash profile.sh [WINDOWS OUT] (default 1 PSs; the keys and values are exactly what `--menus long` names
# since this folder's change): 630 cells, 730 s at 2 threads, one 1024-token window of the built-in mixture,
# --kl sampled.
set -euo pipefail
WINDOWS=${1:-1}; OUT=${2:-PSs}
OMP_NUM_THREADS=2 sensprof profile --model smollm2-135m --seq-len 1024 --windows "$WINDOWS" --kl sampled \
    --k-schemes int2_c64_r32_s4,int3_c64_r32_s4,int4_c64_r32_s4,int5_c64_r32_s4,int6_c64_r32_s4,int8_c64_r32_s4,int2_c32_r32_s4,int3_c32_r32_s4,int3_c64,int4_c64,int5_c64,int6_c64,int8_c64,int3_c128,int4_c128 \
    --v-schemes int2_t64_r32_s4,int3_t64_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4,int8_t64_r32_s4 --out "$OUT"
