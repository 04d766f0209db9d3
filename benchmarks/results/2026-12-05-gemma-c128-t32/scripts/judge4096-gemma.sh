#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-gemma.sh, in the folder holding PS and plans-at4096/: Gemma's 4096-token
# plans beside the uniform setting validate's 4096 screen ranks first at each budget, 2 windows of 4096 tokens.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PS --plan 3=plans-at4096/gemma3-270m-3bits.json --plan 4=plans-at4096/gemma3-270m-4bits.json \
  --plan 5=plans-at4096/gemma3-270m-5bits.json --plan 6=plans-at4096/gemma3-270m-6bits.json \
  --uniforms 3=int3_c128/int3_t64_r32_s4,4=int4_c128/int4_t128_r32_s4,5=int5_c128/int5_t128_r32_s4,6=int6_c64_r32_s4/int5_t128_r32_s4 \
  --kinds "" --text html=$H --seq-len 4096 --windows 2 --out html4096x2-gemma.csv
