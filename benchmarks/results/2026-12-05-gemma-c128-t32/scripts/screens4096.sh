#!/usr/bin/env bash
# As run: bash <this folder>/scripts/screens4096.sh, in the folder holding plans-at4096/: validate's screen for
# `--seq-len 4096` (one window of screen_length(1024, 4096) = 1024 tokens of the HTML) beside each 4096-token plan,
# SmolLM2's (../../2026-12-05-smollm2-plain-keys/plans-at4096) and Gemma's (this folder's).
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
H=$(python -c "import idlelib,os; print(os.path.join(os.path.dirname(idlelib.__file__),'help.html'))")
S=$REPO/benchmarks/results/2026-12-05-smollm2-plain-keys/plans-at4096
OMP_NUM_THREADS=2 python $REPO/benchmarks/results/2026-12-05-gemma-c128-t32/scripts/screen_each.py $H 1024 6 \
    $S/smollm2-135m-3bits-r0.json $S/smollm2-135m-4bits-r0.json $S/smollm2-135m-5bits-r0.json $S/smollm2-135m-6bits-r0.json > screen-smollm2-4096.txt 2>&1
OMP_NUM_THREADS=2 python $REPO/benchmarks/results/2026-12-05-gemma-c128-t32/scripts/screen_each.py $H 1024 6 \
    plans-at4096/gemma3-270m-3bits.json plans-at4096/gemma3-270m-4bits.json plans-at4096/gemma3-270m-5bits.json plans-at4096/gemma3-270m-6bits.json > screen-gemma-4096.txt 2>&1
