#!/usr/bin/env bash
# As run: bash plans.sh, in the folder holding P5k (the 3-5-bit profile of ../README.md).
# Plans at --robust r = 0, 1, 2, 3 for 3, 4 and 5 bits, chosen by prediction alone; judge.py then measures each
# distinct plan on the held-out HTML.
set -euo pipefail
for r in 0 1 2 3; do
  mkdir -p plans-r$r
  for b in 3 4 5; do
    sensprof plan P5k --avg-bits $b --select-measured 0 --robust $r --out plans-r$r/gemma3-270m-selected-${b}bits.json \
        > plans-r$r/plan-${b}.log 2>&1
  done
done
