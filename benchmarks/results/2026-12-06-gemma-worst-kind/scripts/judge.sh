#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge.sh [PROFILE BITS] (default PW "4 6"), beside plans.sh's folders: the three
# objectives' plans beside the best uniform setting known at each budget on the README table's 8 x 1024 tokens of
# IDLE's help.html (seed 12345), html8.csv; then on two unseen 1024-token windows of each of the profile's own kinds
# (the built-in mixture's prose, code and records, seed 12345), kinds1024.csv.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
PS=${1:-PW}; BITS=${2:-4 6}
declare -A U=([4]=int5_c128/int3_t32_r32_s4 [6]=int6_c64_r32_s4/int5_t64_r32_s4)
ARGS=(); UNI=()
for b in $BITS; do
  for o in mean window kind; do ARGS+=(--plan "$b=plans-$o/gemma3-270m-${b}bits.json"); done
  UNI+=("$b=${U[$b]}")
done
export OMP_NUM_THREADS=2
python $REPO/benchmarks/plans_by_kind.py "$PS" "${ARGS[@]}" --uniforms "$(IFS=,; echo "${UNI[*]}")" \
  --kinds "" --text html=$H --windows 8 --out html8.csv
python $REPO/benchmarks/plans_by_kind.py "$PS" "${ARGS[@]}" --uniforms "$(IFS=,; echo "${UNI[*]}")" \
  --kinds prose,code,records --windows 2 --out kinds1024.csv
