#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh, in a folder holding kinds/ (kind_windows6.py: two windows per kind).
# The 558-cell menu of ../../2026-12-05-gemma-c128-t32, on six windows (two per kind) where it had three (one
# per kind, the same as this profile's first of each kind).
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-05-gemma-c128-t32/scripts/profile.sh" 6 PS6
