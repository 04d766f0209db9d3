#!/usr/bin/env bash
# As run: bash <this folder>/scripts/screen_smollm2.sh, in an empty folder: validate's uniform-baseline screen at 4096
# tokens (sensprof.validation.baselines, as `validate --seq-len 4096 --text help.html` now ranks them) for the four
# 4096-token plans of ../../2026-12-06-smollm2-3-windows, one screen shared by their budgets.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=$HERE/../../2026-12-06-smollm2-3-windows/plans-at4096/smollm2-135m
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python "$HERE/screen_at.py" --seq-len 4096 --text "$H" --out screen-smollm2-4096.csv \
  $P-3bits-r0.json $P-4bits-r0.json $P-5bits-r0.json $P-6bits-r0.json > screen-smollm2-4096.log
