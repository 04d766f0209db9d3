#!/usr/bin/env bash
# As run: bash <this folder>/scripts/kinds1024.sh, beside PS9 (merge.sh) and plans/: the 4- and 6-bit plans of nine
# and of six windows beside their uniform settings on 2 x 1024 tokens of each of the mixture's kinds (seed 12345, the
# windows of ../../2026-12-06-gemma-6-windows/diagnosis/kinds1024.csv): do they hold on the profile's own kinds?
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
S=$REPO/benchmarks/results/2026-12-06-gemma-6-windows
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py PS9 --plan 4=plans/gemma3-270m-4bits.json \
  --plan 6=plans/gemma3-270m-6bits.json --plan 4=$S/plans/gemma3-270m-4bits.json --plan 6=$S/plans/gemma3-270m-6bits.json \
  --uniforms "4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4" --kinds prose,code,records --windows 2 \
  --out kinds1024.csv
