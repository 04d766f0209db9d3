#!/usr/bin/env bash
# As run, from this folder, after run.sh: the selected plans beside the best uniform settings of the README table's
# default-profile row and their twins before RoPE, on the table's 8 x 1024 tokens of IDLE's help.html (seed 12345;
# run.sh's plan_quality.py judges on the page's windows of seed 1). "3.0" is the 3-bit plan again, against the
# plain-key setting that row's 3-bit figure also named.
OMP_NUM_THREADS=2 python ../2026-12-07-pre-rope-menus/scripts/judge.py \
  --plan selected@3=plans/selected-3bits.json --plan selected@4=plans/selected-4bits.json \
  --plan selected@5=plans/selected-5bits.json --plan selected@6=plans/selected-6bits.json \
  --plan selected@3.0=plans/selected-3bits.json \
  --uniforms 3=int3_c64_r32_s4/int2_t64_r32_s4 --uniforms 3.0=int3_c128/int3_t64_r32_s4 \
  --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 --uniforms 5=int5_c64_r32_s4/int4_t64_r32_s4 \
  --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --seq-len 1024 --windows 8 --out smollm2-html8-1024.csv
