#!/usr/bin/env bash
# As run: bash <this folder>/scripts/screen.sh, in the folder holding the profile PS and plans/ (../README.md).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/results/2026-12-05-gemma-c128-t32/scripts/screen_each.py $H 1024 8 plans/gemma3-270m-3bits.json plans/gemma3-270m-4bits.json plans/gemma3-270m-5bits.json plans/gemma3-270m-6bits.json
