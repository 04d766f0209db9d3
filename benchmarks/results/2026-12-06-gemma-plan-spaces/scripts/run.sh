#!/usr/bin/env bash
# As run (2026-12-06, seventeenth session), in a scratch folder: the nine-window profile PS9 and its profile.csv
# (../../2026-12-06-gemma-9-windows/scripts/merge.sh, 37 s), restricted plan spaces made from it, their plans at the
# nine-window folder's budgets (1024 tokens, chosen by prediction), judged as that folder judged its plans.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
NINE=$REPO/benchmarks/results/2026-12-06-gemma-9-windows; SIX=$REPO/benchmarks/results/2026-12-06-gemma-6-windows
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
export OMP_NUM_THREADS=2
bash "$NINE/scripts/merge.sh"                                   # PS9, profile.csv, TINY
mk() { python "$HERE/restrict.py" profile.csv "$1.csv" "${@:2}"; python "$SIX/diagnosis/profile_from_csv.py" TINY "$1.csv" "$1" --windows 9; }
mk PSKF4 --key-floor 4; mk PSKF5 --key-floor 5; mk PSKF6 --key-floor 6
mk PS-lay4 --layouts c128 t32_r32_s4; mk PS-lay6 --layouts c64_r32_s4 t64_r32_s4
mkdir -p plans
plan() { sensprof plan "$1" --avg-bits "$2" --context-len 1024 --select-measured 0 --out "plans/$3.json"; }
plan PSKF4 4.076 kf4-3bits; plan PSKF5 4.992 kf5-4bits; plan PSKF6 5.909 kf6-5bits; plan PSKF6 6.825 kf6-6bits
plan PS-lay4 4.992 lay4-4bits; plan PS-lay6 6.825 lay6-6bits
B="python $REPO/benchmarks/plans_by_kind.py PS9"
$B --plan 4=plans/kf5-4bits.json --plan 6=plans/kf6-6bits.json \
   --uniforms 4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-kf.csv
cp "$NINE/plans/gemma3-270m-6bits.json" plans/free-6bits.json
$B --plan 6=plans/kf6-6bits.json --plan 6=plans/free-6bits.json --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" \
   --text policy=/usr/share/doc/python3/python-policy.html --windows 8 --out policy8-6.csv
$B --plan 6=plans/kf6-6bits.json --uniforms 6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds prose,code,records --windows 2 \
   --out kinds1024-kf6.csv
$B --plan 3=plans/kf4-3bits.json --plan 5=plans/kf6-5bits.json --uniforms 3=int4_c128/int2_t32_r32_s4,5=int6_c64/int4_t64_r32_s4 \
   --kinds "" --text html=$H --windows 8 --out html8-kf35.csv
$B --plan 4=plans/lay4-4bits.json --plan 6=plans/lay6-6bits.json \
   --uniforms 4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4 --kinds "" --text html=$H --windows 8 --out html8-lay.csv
