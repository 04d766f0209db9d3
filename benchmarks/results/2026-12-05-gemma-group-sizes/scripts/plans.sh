#!/usr/bin/env bash
# As run: bash scripts/plans.sh, in the folder holding the profile PG (../README.md).
# plans-at1024: each budget is the memory the best uniform setting holds at 1024 tokens (plan.held_avg_bits, rounded
# down to 4 digits: 4.076 / 4.992 / 5.909 bits for int3/int4/int5 keys), priced at 1024 tokens (--context-len 1024:
# sinks, residual windows and incomplete groups paid at 16 bits, each layer weighed by the tokens it holds), at
# --robust 0 and 2. plans-long: --avg-bits 3 / 4 / 5 as the earlier tables planned them (the long-context average
# per token slot), --robust 0. Every plan chosen by prediction alone (--select-measured 0).
set -euo pipefail
mkdir -p plans-at1024 plans-long plans-at4096
declare -A AT=([3]=4.076 [4]=4.992 [5]=5.909)
for b in 3 4 5; do
  for r in 0 2; do
    sensprof plan PG --avg-bits ${AT[$b]} --context-len 1024 --select-measured 0 --robust $r \
        --out plans-at1024/gemma3-270m-${b}bits-r$r.json > plans-at1024/plan-${b}bits-r$r.log 2>&1
  done
  sensprof plan PG --avg-bits $b --select-measured 0 --out plans-long/gemma3-270m-${b}bits-r0.json \
      > plans-long/plan-${b}bits-r0.log 2>&1
done
declare -A AT4096=([3]=3.579 [4]=4.534 [5]=5.489)
for b in 3 4 5; do
  sensprof plan PG --avg-bits ${AT4096[$b]} --context-len 4096 --select-measured 0 \
      --out plans-at4096/gemma3-270m-${b}bits-r0.json > plans-at4096/plan-${b}bits-r0.log 2>&1
done
