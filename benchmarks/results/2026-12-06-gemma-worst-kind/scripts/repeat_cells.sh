#!/usr/bin/env bash
# As run: bash <this folder>/scripts/repeat_cells.sh, beside kinds/ (profile.sh's): the cells whose KL moved most
# between two profiles of the same windows (layer 0 K int5_c128, layer 2 V int4_t32_r32_s4 and int3_t32_r32_s4) on
# the records windows that carry them (3a, 3b), alone: --kl sampled with seeds of the sampler as the profiles ran
# it and --kl exact, so whether the sampler or the quantized model moves them shows.
set -euo pipefail
for w in 3a 3b; do
  mkdir -p one-$w && cp kinds/$w-records.txt one-$w/
  for kl in sampled exact; do
    OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 1 --text one-$w --seed 0 \
        --kl $kl --layers 0,2 --k-schemes int5_c128 --v-schemes int4_t32_r32_s4,int3_t32_r32_s4 \
        --out R-$w-$kl --quiet > R-$w-$kl.log 2>&1
    echo "== $w $kl"; cat R-$w-$kl/profile.csv | cut -d, -f1,3,4,6
  done
done
# The same two windows profiled together, in both orders (each file a window of the concatenated text): the second
# window is its file shifted by one token (the "\n\n" the files are joined with) and short of its last.
mkdir -p two swap && cp kinds/3a-records.txt kinds/3b-records.txt two/
cp kinds/3b-records.txt swap/a.txt && cp kinds/3a-records.txt swap/b.txt
for d in two swap; do
  OMP_NUM_THREADS=2 sensprof profile --model gemma3-270m --seq-len 1024 --windows 2 --text $d --seed 0 --kl exact \
      --layers 0,2 --k-schemes int5_c128 --v-schemes int4_t32_r32_s4,int3_t32_r32_s4 --out R-$d --quiet > R-$d.log 2>&1
  echo "== $d"; cat R-$d/windows.csv
done
