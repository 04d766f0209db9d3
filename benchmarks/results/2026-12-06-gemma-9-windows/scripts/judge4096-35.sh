#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge4096-35.sh, beside PS9 and plans-at4096/: the 3-5-bit plans planned at 4096
# tokens' memory beside the best uniform setting known at each budget there, 2 x 4096 tokens of IDLE's help.html (seed
# 12345): the six-window folder's script on this profile. (As run the plans were named by their path in this folder,
# which html4096x2-35.csv's plan column shows.)
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-06-gemma-6-windows/scripts/judge4096-35.sh" PS9
