#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans.sh, beside PSs3: the budgets of ../../2026-12-05-smollm2-plain-keys's plans
# (plans/ at 1024 tokens, plans-at4096/), r = 0, chosen by prediction alone.
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-05-smollm2-plain-keys/scripts/plans.sh" PSs3
