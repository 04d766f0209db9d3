#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096.sh, beside PS9 and plans-at4096/: the 6-bit plan planned at 4096 tokens'
# memory, the budget that missed 0.7x with six windows, beside the same uniform setting, 2 x 4096 tokens of IDLE's
# help.html (seed 12345, the same windows): the six-window folder's script on this profile.
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-06-gemma-6-windows/scripts/judge4096-6bits.sh" PS9
