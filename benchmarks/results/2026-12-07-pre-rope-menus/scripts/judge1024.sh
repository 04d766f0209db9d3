#!/usr/bin/env bash
# As run, from this folder, after plans.sh: at each budget the plan made from PSs1pre (keys also before RoPE) and the
# one ../../2026-12-05-smollm2-plain-keys made from the same window and menu without them, each also with its keys
# moved before RoPE, beside the best uniform setting known and its twin before RoPE: 8 x 1024 tokens of IDLE's
# help.html (seed 12345, the README table's windows).
O=../2026-12-05-smollm2-plain-keys/plans
OMP_NUM_THREADS=2 python scripts/judge.py \
  --plan pre-menu@3=plans/smollm2-135m-3bits-r0.json --plan pre-menu@4=plans/smollm2-135m-4bits-r0.json \
  --plan pre-menu@5=plans/smollm2-135m-5bits-r0.json --plan pre-menu@6=plans/smollm2-135m-6bits-r0.json \
  --plan old-menu@3=$O/smollm2-135m-3bits-r0.json --plan old-menu@4=$O/smollm2-135m-4bits-r0.json \
  --plan old-menu@5=$O/smollm2-135m-5bits-r0.json --plan old-menu@6=$O/smollm2-135m-6bits-r0.json \
  --uniforms 3=int4_c128/int2_t64_r32_s4 --uniforms 4=int4_c64_r32_s4/int3_t64_r32_s4 \
  --uniforms 5=int5_c64_r32_s4/int4_t64_r32_s4 --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 \
  --seq-len 1024 --windows 8 --out smollm2-html8-1024.csv
