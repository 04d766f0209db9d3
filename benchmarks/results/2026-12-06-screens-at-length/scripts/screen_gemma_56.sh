#!/usr/bin/env bash
# As run: bash <this folder>/scripts/screen_gemma_56.sh, in an empty folder (fifteenth session): the same screen at
# 4096 tokens for Gemma 3 270M's 5- and 6-bit 4096-token plans of ../../2026-12-06-gemma-9-windows, one screen shared
# by both budgets (screen_at.py ranks each plan's budget from it).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
R=$HERE/../../2026-12-06-gemma-9-windows/plans-at4096
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python "$HERE/screen_at.py" --seq-len 4096 --text "$H" --out screen-gemma-4096-56bits.csv \
  $R/gemma3-270m-5bits.json $R/gemma3-270m-6bits.json > screen-gemma-4096-56bits.log
