#!/usr/bin/env bash
# As run, from a work folder outside the repository (/tmp/gwork), on the AMD machine: Gemma 3 270M's default profile
# (the menus a new user gets), then plans made for the length they are judged at (--context-len 1024), each judged by
# `sensprof validate` on 8 x 1024 tokens of IDLE's help.html against every uniform setting sensprof stores within
# the budget at that length.
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
/usr/bin/time -v sensprof profile --model gemma3-270m --out P-gemma
for B in ${BITS:-4 5 3 6}; do
  /usr/bin/time -f "%e s" sensprof plan P-gemma --avg-bits $B --context-len 1024 --out plans/gemma-cl1024-${B}bits.json
  /usr/bin/time -f "%e s" sensprof validate plans/gemma-cl1024-${B}bits.json --text "$H" --seq-len 1024 --windows 8 \
      --out gemma-cl1024-${B}bits.validation.csv
done
