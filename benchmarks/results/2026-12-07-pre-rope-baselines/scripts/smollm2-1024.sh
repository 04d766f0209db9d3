#!/usr/bin/env bash
# As run, from this folder: the README table's SmolLM2-135M plans (630-cell long menus on three windows) at 1024 tokens.
R=../2026-12-06-smollm2-3-windows/plans
OMP_NUM_THREADS=2 python scripts/judge.py \
  --plan 3=$R/smollm2-135m-3bits-r0.json --plan 4=$R/smollm2-135m-4bits-r0.json \
  --plan 5=$R/smollm2-135m-5bits-r0.json --plan 6=$R/smollm2-135m-6bits-r0.json \
  --uniforms 3=int4_c128/int2_t64_r32_s4 --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --uniforms 5=int5_c64_r32_s4/int4_t64_r32_s4 --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --seq-len 1024 --windows 8 --out smollm2-html8-1024.csv
