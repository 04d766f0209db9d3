#!/usr/bin/env bash
# As run, from a work folder outside the repository (/tmp/glwork), on the AMD machine: the quickstart's long-context
# route on Gemma 3 270M with today's long menu (keys also before RoPE), one 1024-token window of the built-in mixture
# (past the 512-token sliding window of 15 of its 18 layers), then plans made for 1024 tokens, each judged by
# `sensprof validate` on 8 x 1024 tokens of IDLE's help.html against every uniform setting sensprof stores within the
# budget at that length (as ../../2026-12-07-gemma-context-len-1024 judged the default profile's plans).
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
[ -f P-long/meta.json ] && [ -z "${REPROFILE:-}" ] || \
  /usr/bin/time -v sensprof profile --model gemma3-270m --seq-len 1024 --windows 1 --menus long --kl sampled --out P-long
for B in ${BITS:-4 6 3 5}; do
  /usr/bin/time -f "%e s" sensprof plan P-long --avg-bits $B --context-len 1024 --out plans/gemma-long-${B}bits.json
  /usr/bin/time -f "%e s" sensprof validate plans/gemma-long-${B}bits.json --text "$H" --seq-len 1024 --windows 8 \
      --out gemma-long-${B}bits.validation.csv
done
