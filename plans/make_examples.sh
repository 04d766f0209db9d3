#!/usr/bin/env bash
# Regenerate the example plans for smollm2-135m: two budgets x two targets, each validated on windows the
# profile never saw, plus the report of the profile. Run from the repository root:
#     bash plans/make_examples.sh
# The profile (default settings, ~9 min on 2 CPU cores) is resumed or reused if profiles/smollm2-135m exists.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=profiles/smollm2-135m
sensprof profile --model smollm2-135m --out "$profile" --quiet
for target in sensprof vllm; do
  for bits in 5 8; do
    plan="plans/smollm2-135m-$target-${bits}bits.json"
    sensprof plan "$profile" --target "$target" --avg-bits "$bits" --out "$plan" > /dev/null
    sensprof validate "$plan" > "${plan%.json}.validation.txt"
    echo "== $plan"; cat "${plan%.json}.validation.txt"
  done
done
sensprof export plans/smollm2-135m-vllm-5bits.json --format vllm > plans/smollm2-135m-vllm-5bits.vllm.txt
sensprof report "$profile" --plan plans/smollm2-135m-sensprof-5bits.json --plan plans/smollm2-135m-vllm-5bits.json \
  --out plans/report > /dev/null
echo "wrote plans/*.json, their .validation.csv/.txt and plans/report/report.html"
