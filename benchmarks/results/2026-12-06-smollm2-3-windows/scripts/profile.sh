#!/usr/bin/env bash
# As run: bash <this folder>/scripts/profile.sh: the 630-cell menu of ../../2026-12-05-smollm2-plain-keys on three
# 1024-token windows of the built-in mixture (seed 0: the first is that profile's one window) where it had one.
set -euo pipefail
bash "$(dirname "$0")/../../2026-12-05-smollm2-plain-keys/scripts/profile.sh" 3 PSs3
