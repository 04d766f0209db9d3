#!/usr/bin/env bash
# As run: bash <this folder>/scripts/select.sh (after plans.sh): the user's-own-text path. The nine-window mixture
# profile (mixwork/PS9, the README table's 558-cell menu), each budget's plan chosen by measurement on 4 x 1024
# tokens of help.html's other windows (other_windows.py: the slots the table does not judge on), among the
# selection's candidates (the plan, robust 1, objective dnll, keys weighted by what the text says, each with sinks
# and recent tokens, and every uniform setting within the budget, screened).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f html-other.txt ] || OMP_NUM_THREADS=2 python "$HERE/other_windows.py" html-other.txt
mkdir -p selected
declare -A AT=([4]=4.992 [5]=5.909 [6]=6.825)
for b in ${BUDGETS:-4}; do  # as run: 4 only (6 was not run)
  OMP_NUM_THREADS=2 sensprof plan mixwork/PS9 --avg-bits ${AT[$b]} --context-len 1024 --select-measured 4 \
    --select-seq-len 1024 --select-text html-other.txt \
    --out selected/gemma3-270m-${b}bits.json > selected/plan-${b}bits.log 2>&1
done
