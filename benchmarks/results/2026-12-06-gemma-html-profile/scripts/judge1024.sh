#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024.sh [PROFILE PLANS OUT BITS] (default PSH plans html8.csv "3 4 5 6"),
# beside PSH (profile.sh) and plans/ (../../2026-12-05-gemma-c128-t32/scripts/plans.sh PSH): the plans made on the
# other HTML page beside the best uniform setting known at each budget, 8 x 1024 tokens of IDLE's help.html (seed
# 12345, the README table's windows).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
PS=${1:-PSH}; PLANS=${2:-plans}; OUT=${3:-html8.csv}; BITS=${4:-3 4 5 6}
declare -A U=([3]=int4_c128/int2_t32_r32_s4 [4]=int5_c128/int3_t32_r32_s4 [5]=int6_c64/int4_t64_r32_s4
              [6]=int6_c64_r32_s4/int5_t64_r32_s4)
ARGS=(); UNI=()
for b in $BITS; do ARGS+=(--plan "$b=$PLANS/gemma3-270m-${b}bits.json"); UNI+=("$b=${U[$b]}"); done
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py "$PS" "${ARGS[@]}" --uniforms "$(IFS=,; echo "${UNI[*]}")" \
  --kinds "" --text html=$H --windows 8 --out "$OUT"
