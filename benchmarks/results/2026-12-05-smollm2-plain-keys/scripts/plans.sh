#!/usr/bin/env bash
# As run: bash plans.sh [PROFILE] (default PSs), beside the profile: each budget is what the uniform setting
# int<b>_c64_r32_s4 / int<b-1>_t64_r32_s4 holds at the serving length (plan.held_avg_bits, rounded down), priced there
# (--context-len), chosen by prediction alone: at 1024 tokens 3.627 / 4.579 / 5.530 / 6.481 bits for 3 / 4 / 5 / 6
# (plans/), at 4096 tokens 3.156 / 4.144 / 5.132 / 6.120 (plans-at4096/). (--robust 2 gave the same plans at 1024:
# one window has no spread.)
set -euo pipefail
PS=${1:-PSs}
for spec in 1024:plans:3.627,4.579,5.530,6.481 4096:plans-at4096:3.156,4.144,5.132,6.120; do
  IFS=: read -r tokens dir budgets <<< "$spec"
  mkdir -p "$dir"
  b=3
  for bits in ${budgets//,/ }; do
    sensprof plan "$PS" --avg-bits "$bits" --context-len "$tokens" --select-measured 0 \
        --out "$dir/smollm2-135m-${b}bits-r0.json" > "$dir/plan-${b}bits-r0.log" 2>&1
    b=$((b + 1))
  done
done
