#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh [WINDOWS OUT TEXT SEED] (default 3 PS kinds 0), in a folder holding
# kinds/ (../../2026-12-05-gemma-kinds-profile/scripts/kind_windows.py) or TEXT.
# The menu of ../../2026-12-05-gemma-plain-keys (414 cells) plus the layouts of the uniform settings validate's
# screen ranked first at 3-5 bits: plain 128-token key groups (int3-6_c128) and 32-channel values with sinks and
# residual window (int2-5_t32_r32_s4): 558 cells.
set -euo pipefail
WINDOWS=${1:-3}; OUT=${2:-PS}; TEXT=${3:-kinds}; SEED=${4:-0}
OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows "$WINDOWS" --text "$TEXT" --seed "$SEED" --kl sampled \
    --k-schemes int2_c64_r32_s4,int3_c64_r32_s4,int4_c64_r32_s4,int5_c64_r32_s4,int6_c64_r32_s4,int8_c64_r32_s4,int3_c64,int4_c64,int5_c64,int6_c64,int8_c64,int3_c128,int4_c128,int5_c128,int6_c128 \
    --v-schemes int2_t64_r32_s4,int3_t64_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4,int3_t128_r32_s4,int4_t128_r32_s4,int5_t128_r32_s4,int3_t64_s4,int4_t64_s4,int5_t64_s4,int6_t64_s4,int2_t32_r32_s4,int3_t32_r32_s4,int4_t32_r32_s4,int5_t32_r32_s4 --out "$OUT"
