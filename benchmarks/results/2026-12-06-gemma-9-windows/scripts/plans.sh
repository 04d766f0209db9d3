#!/usr/bin/env bash
# As run: bash <this folder>/scripts/plans.sh, beside PS9 (merge.sh): the budgets and options of
# ../../2026-12-05-gemma-c128-t32's plans (plans/ at 1024 tokens, plans-at4096/, plans-r1/ at --robust 1).
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-05-gemma-c128-t32/scripts/plans.sh" PS9
