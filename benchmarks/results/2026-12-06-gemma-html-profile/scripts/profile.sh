#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh [OUT SEED] (default PSH 0): the 558-cell menu of
# ../../2026-12-05-gemma-c128-t32 (its profile.sh) on three 1024-token windows of the Debian Python Policy (seed 0:
# its 1024-token slots 1, 12, 13; seed 1: 2, 4, 18), an HTML page Sphinx wrote, as IDLE's help.html is
# (/usr/share/doc/python3/python-policy.html on this machine's Debian image: it ships with Debian's python3 package,
# not with Python, so this is a diagnosis, not a default).
set -euo pipefail
POLICY=/usr/share/doc/python3/python-policy.html
[ -f "$POLICY" ] || { echo "profile.sh: $POLICY is not on this machine (Debian's python3 package ships it)" >&2; exit 2; }
cp "$POLICY" python-policy.html
bash "$(dirname "$0")/../../2026-12-05-gemma-c128-t32/scripts/profile.sh" 3 "${1:-PSH}" python-policy.html "${2:-0}"
