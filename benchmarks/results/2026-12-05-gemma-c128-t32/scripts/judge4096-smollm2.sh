#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-smollm2.sh, in the folder holding a profile folder PSm of SmolLM2
# (`plans_by_kind` reads only its meta: ../../2026-12-05-gemma-plain-keys/README.md names the command): SmolLM2's
# 4096-token plans beside the uniform setting validate's 4096 screen ranks first at each budget, 2 windows of 4096 tokens.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
S=$REPO/benchmarks/results/2026-12-05-smollm2-plain-keys/plans-at4096
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PSm --plan 3=$S/smollm2-135m-3bits-r0.json --plan 4=$S/smollm2-135m-4bits-r0.json \
  --plan 5=$S/smollm2-135m-5bits-r0.json --plan 6=$S/smollm2-135m-6bits-r0.json \
  --uniforms 3=int3_c128_r32_s4/int2_t64_r32_s4,4=int4_c128_r32_s4/int3_t64_r32_s4,5=int5_c128_r32_s4/int4_t64_r32_s4,6=int6_c128_r32_s4/int5_t64_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-smollm2.csv
