#!/usr/bin/env bash
# As run (2026-12-06, sixteenth session), in a scratch folder, from the repository root's checkout at 77a3e1e.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
NINE=$REPO/benchmarks/results/2026-12-06-gemma-9-windows/plans/gemma3-270m-4bits.json
export OMP_NUM_THREADS=2
# 91 whole-model measurements on 3 x 1024 tokens of the mixture (2,040 s), then the integer program
python "$HERE/around_uniform.py" "$REPO/profiles/gemma3-270m" "$NINE" --uniform int5_c128/int3_t32_r32_s4 \
  --k int4_c128,int6_c128 --v int2_t32_r32_s4,int4_t128_r32_s4,int4_t64_r32_s4 --windows 3 --out b4
# judged on the 8 HTML windows of ../2026-12-06-gemma-9-windows (166 s)
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
python "$REPO/benchmarks/plans_by_kind.py" "$REPO/profiles/gemma3-270m" --plan 4=b4/plan-1.json \
  --uniforms 4=int5_c128/int3_t32_r32_s4 --kinds "" --text html=$H --windows 8 --out b4/html8.csv
# both plans on the 3 windows the cells were measured on
python "$HERE/on_profile_windows.py" b4/plan-1.json "$NINE"
