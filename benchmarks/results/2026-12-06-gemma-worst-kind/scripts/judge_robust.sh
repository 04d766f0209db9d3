#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge_robust.sh [PROFILE] (default PW), beside plans-median/ and plans-trim1/
# (robust_plans.py at 4.992 and 6.825 bits, 1024 tokens): those plans beside the best uniform setting known at each
# budget on the README table's 8 x 1024 tokens of IDLE's help.html (seed 12345), html8-robust.csv.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
PS=${1:-PW}
ARGS=()
for b in 4 6; do for s in median trim1; do ARGS+=(--plan "$b=plans-$s/gemma3-270m-${b}bits.json"); done; done
OMP_NUM_THREADS=2 python $REPO/benchmarks/plans_by_kind.py "$PS" "${ARGS[@]}" \
  --uniforms "4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4" --kinds "" --text html=$H --windows 8 \
  --out html8-robust.csv
