#!/usr/bin/env bash
# As run, from this folder: the README table's Gemma 3 270M plans (nine-window mixture profile) at 1024 tokens.
R=../2026-12-06-gemma-9-windows/plans
OMP_NUM_THREADS=2 python scripts/judge.py \
  --plan 3=$R/gemma3-270m-3bits.json --plan 4=$R/gemma3-270m-4bits.json \
  --plan 5=$R/gemma3-270m-5bits.json --plan 6=$R/gemma3-270m-6bits.json \
  --uniforms 3=int4_c128/int2_t32_r32_s4 --uniforms 4=int5_c128/int3_t32_r32_s4 \
  --uniforms 5=int6_c64/int4_t64_r32_s4 --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --seq-len 1024 --windows 8 --out gemma-html8-1024.csv
