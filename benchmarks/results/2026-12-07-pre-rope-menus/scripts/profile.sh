#!/usr/bin/env bash
# As run, from this folder: `--menus long` as of this folder's change (its 15 keys each also before RoPE: 36 schemes,
# 1,080 cells) on the one 1024-token window of the built-in mixture that ../../2026-12-05-smollm2-plain-keys profiled
# its 630 cells on (seed 0), into PSs1pre.
set -euo pipefail
OMP_NUM_THREADS=2 /usr/bin/time -v sensprof profile --model smollm2-135m --seq-len 1024 --windows 1 --menus long \
    --kl sampled --out PSs1pre
