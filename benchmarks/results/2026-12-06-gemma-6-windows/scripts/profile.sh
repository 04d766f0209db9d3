#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh, in a folder holding kinds/ (kind_windows6.py: two windows per kind).
# The 558-cell menu of ../../2026-12-05-gemma-c128-t32, on six windows (two per kind) where it had three (one
# per kind, the same as this profile's first of each kind).
set -euo pipefail
OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 6 --text kinds --kl sampled \
    --k-schemes int2_c64_r32_s4,int3_c64_r32_s4,int4_c64_r32_s4,int5_c64_r32_s4,int6_c64_r32_s4,int8_c64_r32_s4,int3_c64,int4_c64,int5_c64,int6_c64,int8_c64,int3_c128,int4_c128,int5_c128,int6_c128 \
    --v-schemes int2_t64_r32_s4,int3_t64_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4,int3_t128_r32_s4,int4_t128_r32_s4,int5_t128_r32_s4,int3_t64_s4,int4_t64_s4,int5_t64_s4,int6_t64_s4,int2_t32_r32_s4,int3_t32_r32_s4,int4_t32_r32_s4,int5_t32_r32_s4 --out PS6
