#!/usr/bin/env bash
# As run: bash <this folder>/scripts/merge6.sh, beside PSH and PSH1 (profile.sh PSH 0; profile.sh PSH1 1; without
# them, the committed copies of their cells, ../profile.csv and ../profile-seed1.csv): the six windows' cells
# (profile-6-windows.csv, committed as ../profile-6-windows.csv;
# ../../2026-12-06-gemma-9-windows/scripts/merge_profiles.py, weighted 3 : 3), then a plannable profile PSH6
# (../../2026-12-06-gemma-6-windows/diagnosis/profile_from_csv.py; its TINY profile, 20 s, gives the model's layers)
# and its plans in six/ (../../2026-12-05-gemma-c128-t32/scripts/plans.sh; only the judged 4- and 6-bit plans are
# kept).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); RESULTS=$HERE/../..
A=PSH/profile.csv; [ -f "$A" ] || A=$HERE/../profile.csv
B=PSH1/profile.csv; [ -f "$B" ] || B=$HERE/../profile-seed1.csv
python "$RESULTS/2026-12-06-gemma-9-windows/scripts/merge_profiles.py" "$A" 3 "$B" 3 \
    profile-6-windows.csv
[ -d TINY ] || OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 128 --windows 1 --k-schemes int8_c32 \
    --v-schemes int8_t32 --out TINY --quiet
python "$RESULTS/2026-12-06-gemma-6-windows/diagnosis/profile_from_csv.py" TINY profile-6-windows.csv PSH6 --windows 6
mkdir -p six && cd six && bash "$RESULTS/2026-12-05-gemma-c128-t32/scripts/plans.sh" ../PSH6
