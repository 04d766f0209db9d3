#!/usr/bin/env bash
# As run, from a work folder outside the repository (/tmp/work), on the AMD machine: the default profile a new user gets,
# then the 3-bit plan made for the length it is judged at (--context-len 1024: its budget is bits held at 1024 tokens,
# where sinks and recent tokens count) beside the plan made for the default length (4096), each judged by
# `sensprof validate` on 8 x 1024 tokens of IDLE's help.html against every uniform setting sensprof stores in no more
# memory at the plan's own context length. The 4096 half of the loop was stopped while planning, to give its time
# to run456.sh (4-6 bits at 1024); plans of the default length from the same command's profile on the Intel machine
# (its cells equal these to a median ratio of 1.0000) were judged in
# ../2026-12-07-default-profile-pre-rope.
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
/usr/bin/time -v sensprof profile --model smollm2-135m --out P-default
for CL in 1024 4096; do
  /usr/bin/time -f "%e s" sensprof plan P-default --avg-bits 3 --context-len $CL --out plans/cl$CL-3bits.json
  /usr/bin/time -f "%e s" sensprof validate plans/cl$CL-3bits.json --text "$H" --seq-len 1024 --windows 8 \
      --out cl$CL-3bits.validation.csv
done
