#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096x4-5bits.sh, beside PS9 and plans-at4096/: the 5-bit plan planned at
# 4096 tokens' memory (a tie on 2 windows) beside the same uniform setting on 4 windows of 4096 tokens of IDLE's
# help.html (seed 12345: the 2 windows of judge4096-35.sh and 2 more): the six-window folder's script on this profile.
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-06-gemma-6-windows/scripts/judge4096x4-5bits.sh" PS9
