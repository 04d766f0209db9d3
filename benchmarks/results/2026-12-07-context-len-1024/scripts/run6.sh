#!/usr/bin/env bash
# As run, after run456.sh was stopped while planning 6 bits: the same for 6 bits.
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
/usr/bin/time -f "%e s" sensprof plan P-default --avg-bits 6 --context-len 1024 --out plans/cl1024-6bits.json
/usr/bin/time -f "%e s" sensprof validate plans/cl1024-6bits.json --text "$H" --seq-len 1024 --windows 8 \
    --out cl1024-6bits.validation.csv
