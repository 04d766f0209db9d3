#!/usr/bin/env bash
# As run, from this folder: the default profile a new user gets with today's menus (41 key and 19 value schemes, keys
# before RoPE among them), then ../../plan_quality.py as ../2026-12-05-default-profile-heldout ran it, judged on the
# README table's 8 x 1024 tokens of IDLE's help.html instead of 2.
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
/usr/bin/time -v sensprof profile --model smollm2-135m --out P-default
OMP_NUM_THREADS=2 /usr/bin/time -v python ../../plan_quality.py P-default --avg-bits 3,4,5,6 --select 2 \
    --lengths 1024 --windows 8 --uniform-top 1 --text "$H" --out smollm2-135m-1024.csv --plans-out plans
