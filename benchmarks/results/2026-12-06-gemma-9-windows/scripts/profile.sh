#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh, in a folder holding kinds/ (a third window per kind, tokens
# 5000-6022, disjoint from the six of ../../2026-12-06-gemma-6-windows: its scripts/kind_windows6.py c:5000). The
# same 558-cell menu on these three windows (PS3); merge.sh then joins it with the six-window profile.csv into nine
# windows (PS9).
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-05-gemma-c128-t32/scripts/profile.sh" 3 PS3
