#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans.sh [PROFILE], in the folder holding the profile PS (or PROFILE). The budgets of ../../2026-12-05-gemma-plain-keys:
# what int<b>_c64_r32_s4 / int<b-1>_t64_r32_s4 holds at 1024 tokens, rounded down (4.076 / 4.992 / 5.909 / 6.825 bits
# for 3 / 4 / 5 / 6), priced at 1024 tokens, r = 0, chosen by prediction alone (--select-measured 0).
set -euo pipefail
PS=${1:-PS}
mkdir -p plans
declare -A AT=([3]=4.076 [4]=4.992 [5]=5.909 [6]=6.825)
for b in 3 4 5 6; do
  sensprof plan "$PS" --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 \
      --out plans/gemma3-270m-${b}bits.json > plans/plan-${b}bits.log 2>&1
done
# plans-at4096/: the same at 4096 tokens (--context-len 4096), the uniform setting's bits held there rounded down:
# 3.579 / 4.534 / 5.489 / 6.444.
mkdir -p plans-at4096
declare -A AT4096=([3]=3.579 [4]=4.534 [5]=5.489 [6]=6.444)
for b in 3 4 5 6; do
  sensprof plan "$PS" --avg-bits ${AT4096[$b]} --context-len 4096 --select-measured 0 \
      --out plans-at4096/gemma3-270m-${b}bits.json > plans-at4096/plan-${b}bits.log 2>&1
done
# plans-r1/: the 1024-token budgets at --robust 1 (each cell's damage plus one standard deviation over the profile's
# three windows, one kind of text each).
mkdir -p plans-r1
for b in 3 4 5 6; do
  sensprof plan "$PS" --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 --robust 1 \
      --out plans-r1/gemma3-270m-${b}bits.json > plans-r1/plan-${b}bits.log 2>&1
done
