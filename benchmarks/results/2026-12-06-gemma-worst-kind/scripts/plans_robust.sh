#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans_robust.sh [PROFILE] (default PW), beside it: robust_plans.py's plans at
# the 4- and 6-bit budgets (4.992 / 6.825 bits held at 1024 tokens), each cell its median over the nine windows
# (plans-median/) or its mean without its worst window (plans-trim1/).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); PS=${1:-PW}
declare -A AT=([4]=4.992 [6]=6.825)
for s in median trim1; do
  mkdir -p plans-$s
  for b in 4 6; do
    python "$HERE/robust_plans.py" "$PS" ${AT[$b]} 1024 $s plans-$s/gemma3-270m-${b}bits.json > plans-$s/plan-${b}bits.log
  done
done
