#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh [OUT SEED] (default PSH 0): the 558-cell menu of
# ../../2026-12-05-gemma-c128-t32 on three 1024-token windows of the Debian Python Policy (seed 0: its 1024-token
# slots 1, 12, 13; seed 1: 2, 4, 18), an HTML page Sphinx wrote, as IDLE's help.html is
# (/usr/share/doc/python3/python-policy.html on this machine's Debian image: it ships with Debian's python3 package,
# not with Python, so this is a diagnosis, not a default).
set -euo pipefail
POLICY=/usr/share/doc/python3/python-policy.html
[ -f "$POLICY" ] || { echo "profile.sh: $POLICY is not on this machine (Debian's python3 package ships it)" >&2; exit 2; }
cp "$POLICY" python-policy.html
OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 3 --text python-policy.html --seed "${2:-0}" --kl sampled \
    --k-schemes int2_c64_r32_s4,int3_c64_r32_s4,int4_c64_r32_s4,int5_c64_r32_s4,int6_c64_r32_s4,int8_c64_r32_s4,int3_c64,int4_c64,int5_c64,int6_c64,int8_c64,int3_c128,int4_c128,int5_c128,int6_c128 \
    --v-schemes int2_t64_r32_s4,int3_t64_r32_s4,int4_t64_r32_s4,int5_t64_r32_s4,int6_t64_r32_s4,int3_t128_r32_s4,int4_t128_r32_s4,int5_t128_r32_s4,int3_t64_s4,int4_t64_s4,int5_t64_s4,int6_t64_s4,int2_t32_r32_s4,int3_t32_r32_s4,int4_t32_r32_s4,int5_t32_r32_s4 \
    --out "${1:-PSH}"
