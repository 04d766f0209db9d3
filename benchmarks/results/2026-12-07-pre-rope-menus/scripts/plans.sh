#!/usr/bin/env bash
# As run, from this folder, beside PSs1pre: the README table's budgets (../../2026-12-05-smollm2-plain-keys/scripts/
# plans.sh: the bits the best uniform setting holds at 1024 and 4096 tokens), chosen by prediction alone.
set -euo pipefail
bash ../2026-12-05-smollm2-plain-keys/scripts/plans.sh PSs1pre
