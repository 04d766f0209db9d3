#!/usr/bin/env bash
# As run: bash <this folder>/scripts/screen_gemma.sh BITS (3, then 4), in an empty folder: the same screen at 4096
# tokens for Gemma 3 270M's BITS-bit 4096-token plan of ../../2026-12-06-gemma-9-windows, its budget alone (3 bits:
# 29 schemes, 4 bits: 53; the four budgets together would screen 77).
set -euo pipefail
BITS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
R=$HERE/../../2026-12-06-gemma-9-windows/plans-at4096
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python "$HERE/screen_at.py" --seq-len 4096 --text "$H" --out screen-gemma-4096-${BITS}bits.csv \
  $R/gemma3-270m-${BITS}bits.json > screen-gemma-4096-${BITS}bits.log
