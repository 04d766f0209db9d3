#!/usr/bin/env bash
# As run (paths made relative), in an empty folder: where the 3-window profile's plans lose their predicted lead.
# The plans and profile.csv are ../../2026-12-05-gemma-c128-t32's; PSg is a tiny profile whose meta plans_by_kind reads.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd); R=$REPO/benchmarks/results/2026-12-05-gemma-c128-t32
export OMP_NUM_THREADS=2
sensprof profile --model gemma3-270m --seq-len 128 --windows 1 --k-schemes int8_c32 --v-schemes int8_t32 --out PSg
U="3=int4_c128/int2_t32_r32_s4,4=int5_c128/int3_t32_r32_s4,5=int6_c64/int4_t64_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4"
P=""; for b in 3 4 5 6; do P="$P --plan $b=$R/plans/gemma3-270m-${b}bits.json"; done
# kinds1024.csv: unseen windows of the profile's own kinds (2 x 1024 tokens each, seed 12345); 353 s
python $REPO/benchmarks/plans_by_kind.py PSg $P --uniforms "$U" --kinds prose,code,records --windows 2 --out kinds1024.csv
# own.csv: the profile's own three windows (kind_windows.py of ../../2026-12-05-gemma-kinds-profile, in kw/); 90 s
mkdir -p kw && (cd kw && python $REPO/benchmarks/results/2026-12-05-gemma-kinds-profile/scripts/kind_windows.py)
python $REPO/benchmarks/plans_by_kind.py PSg --plan 4=$R/plans/gemma3-270m-4bits.json --plan 6=$R/plans/gemma3-270m-6bits.json \
  --uniforms "4=int5_c128/int3_t32_r32_s4,6=int6_c64_r32_s4/int5_t64_r32_s4" --kinds "" \
  --text prose=kw/prose.txt --text code=kw/code.txt --text records=kw/records.txt --windows 1 --seq-len 1024 --out own.csv
# plans-median/, plans-mean/: the same budgets planned from the cells fitted across bit widths; kinds1024-smooth.csv (557 s)
for how in median mean; do
  (cd $HERE && python profile_from_csv.py "$OLDPWD/PSg" $R/profile.csv "$OLDPWD/PX-$how" --fit $how)
  mkdir -p plans-$how; i=3
  for bits in 4.076 4.992 5.909 6.825; do
    sensprof plan PX-$how --avg-bits $bits --context-len 1024 --select-measured 0 --out plans-$how/$i.json; i=$((i + 1))
  done
done
P=""; for how in median mean; do for b in 3 4 5 6; do P="$P --plan $b=plans-$how/$b.json"; done; done
python $REPO/benchmarks/plans_by_kind.py PSg $P --uniforms "$U" --kinds prose,code,records --windows 2 --out kinds1024-smooth.csv
