#!/usr/bin/env bash
# As run, from this folder: the README table's Gemma 3 270M plans priced at 4096 tokens, 2 x 4096 tokens of help.html,
# against the uniform settings that table's 4096 column names and their twins with keys before RoPE.
R=../2026-12-06-gemma-9-windows/plans-at4096
OMP_NUM_THREADS=2 python scripts/judge.py \
  --plan 3=$R/gemma3-270m-3bits.json --plan 4=$R/gemma3-270m-4bits.json \
  --plan 5=$R/gemma3-270m-5bits.json --plan 6=$R/gemma3-270m-6bits.json \
  --uniforms 3=int3_c128/int3_t64_r32_s4 --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --uniforms 5=int5_c128/int5_t128_r32_s4 --uniforms 6=int6_c128/int6_t128_r32_s4 \
  --seq-len 4096 --windows 2 --out gemma-html2-4096.csv
