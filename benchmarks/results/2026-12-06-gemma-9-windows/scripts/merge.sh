#!/usr/bin/env bash
# As run: bash <this folder>/scripts/merge.sh, beside PS3 (profile.sh; without it, the committed copy of its cells,
# ../profile-3-new-windows.csv): profile.csv of nine windows (the six of ../../2026-12-06-gemma-6-windows plus the
# three new ones), then a plannable profile folder PS9 from it
# (../../2026-12-06-gemma-6-windows/diagnosis/profile_from_csv.py; its TINY profile, 20 s, gives the model's layers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); SIX=$HERE/../../2026-12-06-gemma-6-windows
NEW=PS3/profile.csv; [ -f "$NEW" ] || NEW=$HERE/../profile-3-new-windows.csv
python "$HERE/merge_profiles.py" "$SIX/profile.csv" 6 "$NEW" 3 profile.csv
[ -d TINY ] || OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 128 --windows 1 --k-schemes int8_c32 \
    --v-schemes int8_t32 --out TINY --quiet
python "$SIX/diagnosis/profile_from_csv.py" TINY profile.csv PS9 --windows 9
