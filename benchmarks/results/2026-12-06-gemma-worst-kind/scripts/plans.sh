#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans.sh [PROFILE] (default PW), beside it: at the 4- and 6-bit budgets of the
# earlier folders (4.992 / 6.825 bits held at 1024 tokens, ../../2026-12-05-gemma-c128-t32/scripts/plans.sh), the
# planner's plan (the mean over the nine windows, `sensprof plan --select-measured 0`) in plans-mean/, and the plans
# for the worst window (plans-window/) and for the worst kind (plans-kind/, three windows each) of worst_plans.py.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); PS=${1:-PW}
declare -A AT=([4]=4.992 [6]=6.825)
mkdir -p plans-mean plans-window plans-kind
for b in 4 6; do
  sensprof plan "$PS" --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 \
      --out plans-mean/gemma3-270m-${b}bits.json > plans-mean/plan-${b}bits.log 2>&1
  for g in window kind; do
    python "$HERE/worst_plans.py" "$PS" ${AT[$b]} 1024 $g plans-$g/gemma3-270m-${b}bits.json > plans-$g/plan-${b}bits.log
  done
done
