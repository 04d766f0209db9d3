#!/usr/bin/env bash
# As run: bash scripts/profile.sh (414 cells, 1,560 s), in a folder holding kinds/ (../../2026-12-05-gemma-kinds-profile/scripts/kind_windows.py).
set -euo pipefail
OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 3 --text kinds --kl sampled \
    --k-schemes int2_c64_r32_s4,int3_c64_r32_s4,int4_c64_r32_s4,int5_c64_r32_s4,int6_c64_r32_s4,int8_c64_r32_s4,int3_c64,int4_c64,int5_c64,int6_c64,int8_c64 \
    --v-schemes int2_t64_r32_s4,int3_t64_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4,int3_t128_r32_s4,int4_t128_r32_s4,int5_t128_r32_s4,int3_t64_s4,int4_t64_s4,int5_t64_s4,int6_t64_s4 --out PS
