#!/usr/bin/env bash
# As run, from a work folder outside the repository (/tmp/gl3), on the AMD machine: Gemma 3 270M's default profile
# since the long-context route became the default for models whose sliding windows the short profile never passes
# (`sensprof profile --model gemma3-270m`, no flags: one 1024-token window of the built-in mixture, --menus long with
# its plain 2-4-bit values, --kl sampled), then plans made for 1024 tokens, each judged by `sensprof validate` on
# 8 x 1024 tokens of IDLE's help.html against every uniform setting sensprof stores within the budget at that length
# (as ../2026-12-07-gemma-long-menu-1024 judged the same route before the plain values joined its menu).
set -euo pipefail
H=$(python -c "import idlelib, os; print(os.path.join(os.path.dirname(idlelib.__file__), 'help.html'))")
[ -f P-default/meta.json ] && [ -z "${REPROFILE:-}" ] || /usr/bin/time -v sensprof profile --model gemma3-270m --out P-default
for B in ${BITS:-3}; do
  /usr/bin/time -f "%e s" sensprof plan P-default --avg-bits $B --context-len 1024 --out plans/gemma-default-${B}bits.json
  /usr/bin/time -f "%e s" sensprof validate plans/gemma-default-${B}bits.json --text "$H" --seq-len 1024 --windows 8 \
      --out gemma-default-${B}bits.validation.csv
done
