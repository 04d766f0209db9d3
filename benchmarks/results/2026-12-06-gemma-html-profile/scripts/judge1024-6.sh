#!/usr/bin/env bash
# As run: bash <this folder>/scripts/judge1024-6.sh, beside PSH6 and six/plans/ (merge6.sh): the six-window HTML
# profile's 4- and 6-bit plans beside the best uniform setting known at each budget, 8 x 1024 tokens of IDLE's
# help.html (seed 12345, the README table's windows): judge1024.sh on that profile.
set -euo pipefail
bash "$(dirname "$0")/judge1024.sh" PSH6 six/plans html8-six.csv "4 6"
