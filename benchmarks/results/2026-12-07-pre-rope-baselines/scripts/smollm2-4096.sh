#!/usr/bin/env bash
# As run, from this folder: the README table's SmolLM2-135M plans priced at 4096 tokens, 2 x 4096 tokens of help.html,
# against the uniform settings that table's 4096 column names and their twins with keys before RoPE.
R=../2026-12-06-smollm2-3-windows/plans-at4096
OMP_NUM_THREADS=2 python scripts/judge.py \
  --plan 3=$R/smollm2-135m-3bits-r0.json --plan 4=$R/smollm2-135m-4bits-r0.json \
  --plan 5=$R/smollm2-135m-5bits-r0.json --plan 6=$R/smollm2-135m-6bits-r0.json \
  --uniforms 3=int3_c64_r32_s4/int2_t64_r32_s4 --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --uniforms 5=int5_c64_r32_s4/int4_t64_r32_s4 --uniforms 6=int6_c128_r32_s4/int5_t64_r32_s4 \
  --seq-len 4096 --windows 2 --out smollm2-html2-4096.csv
