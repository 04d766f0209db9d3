#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge.sh [OUT], beside PS9 (../../2026-12-06-gemma-9-windows/scripts/merge.sh)
# and plans/ (sparse_plans.py PS9 plans): the 4- and 6-bit plans anchored to the best uniform setting (M = 4, 8, 16
# changed choices) and the free nine-window plans beside that uniform setting on 2 x 1024 tokens of each of the
# mixture's kinds (seed 12345: windows the profile did not read; the nine-window folder's kinds1024.csv windows).
# The rule, fixed before it ran: the M with the lowest mean KL over these six windows, plan over uniform, is judged
# on HTML next; the free plans won at both budgets, so no HTML run followed (their HTML figures are the nine-window
# folder's).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
NINE=$REPO/benchmarks/results/2026-12-06-gemma-9-windows/plans
PLANS=""
for b in 4 6; do
  PLANS="$PLANS --plan $b=$NINE/gemma3-270m-${b}bits.json"
  for m in 4 8 16; do PLANS="$PLANS --plan $b=plans/gemma3-270m-${b}bits-m$m.json"; done
done
python $REPO/benchmarks/plans_by_kind.py PS9 $PLANS --uniforms "4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4" \
    --kinds prose,code,records --windows 2 --out "${1:-kinds1024.csv}"
