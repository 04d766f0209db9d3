#!/usr/bin/env bash
# As run, after run.sh's 3-bit plan: the same for 4, 5 and 6 bits (plan made for 1024 tokens, judged there).
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
for B in 4 5 6; do
  /usr/bin/time -f "%e s" sensprof plan P-default --avg-bits $B --context-len 1024 --out plans/cl1024-${B}bits.json
  /usr/bin/time -f "%e s" sensprof validate plans/cl1024-${B}bits.json --text "$H" --seq-len 1024 --windows 8 \
      --out cl1024-${B}bits.validation.csv
done
