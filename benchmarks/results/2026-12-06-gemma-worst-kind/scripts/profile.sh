#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh [OUT] (default PW), in a folder holding kinds/ of nine windows
# (../../2026-12-06-gemma-6-windows/scripts/kind_windows6.py a:1000 b:3000 c:5000: the nine windows of
# ../../2026-12-06-gemma-9-windows, three per kind). The cells the 4- and 6-bit plans and uniform settings of that
# folder chose (234 of its 558: 6 key and 7 value layouts), now with each cell's KL on each window (windows.csv).
set -euo pipefail
OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 9 --text kinds --seed 0 --kl sampled \
    --k-schemes int4_c128,int5_c128,int6_c128,int8_c64,int5_c64_r32_s4,int6_c64_r32_s4 \
    --v-schemes int3_t32_r32_s4,int4_t32_r32_s4,int5_t32_r32_s4,int4_t128_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4 \
    --out "${1:-PW}"
