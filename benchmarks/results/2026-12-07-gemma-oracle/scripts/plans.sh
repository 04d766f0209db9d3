#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans.sh (beside PSO, after profile.sh): the README table's 4 / 5 / 6-bit budgets
# (../../2026-12-05-gemma-c128-t32/scripts/plans.sh: 4.992 / 5.909 / 6.825 bits held at 1024 tokens), priced at
# 1024 tokens, chosen by prediction alone, from
#   oracle/  PSO, the judged windows' own cells;
#   mix/     the nine-window mixture profile (../../2026-12-06-gemma-9-windows, merge.sh) cut to PSO's 20 schemes
#            (same_menu.py): the same plan space, profiled on the built-in mixture.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); R=$HERE/../..
mkdir -p mixwork oracle mix
(cd mixwork && bash "$R/2026-12-06-gemma-9-windows/scripts/merge.sh" > merge.log 2>&1 &&
  python "$HERE/same_menu.py" profile.csv ../PSO profile-oracle-menu.csv &&
  python "$R/2026-12-06-gemma-6-windows/diagnosis/profile_from_csv.py" TINY profile-oracle-menu.csv PS9M --windows 9)
declare -A AT=([4]=4.992 [5]=5.909 [6]=6.825)
for b in 4 5 6; do
  sensprof plan PSO --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 \
    --out oracle/gemma3-270m-${b}bits.json > oracle/plan-${b}bits.log 2>&1
  sensprof plan mixwork/PS9M --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 \
    --out mix/gemma3-270m-${b}bits.json > mix/plan-${b}bits.log 2>&1
done
