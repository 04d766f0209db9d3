#!/usr/bin/env bash
# As run, from this folder: validate's screen for the best uniform settings of the 4- and 6-bit Gemma plans (keys
# before RoPE among them), then the top 3 of each beside the plans with keys before RoPE on the 8 judged windows.
R=../2026-12-06-gemma-9-windows/plans
OMP_NUM_THREADS=2 python scripts/screen_best.py --plan 4=$R/gemma3-270m-4bits.json --plan 6=$R/gemma3-270m-6bits.json \
  --seq-len 1024 --windows 8 --top 3 --out gemma-best46-1024.csv
