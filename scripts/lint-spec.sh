#!/usr/bin/env bash
# Lints api/openapi.yaml with the pinned @redocly/cli (tools/spec/) under the
# rules in redocly.yaml (Redocly's `recommended` ruleset plus stricter rules).
# Exits non-zero on any lint error; warnings are printed but do not fail.
#
#   bash scripts/lint-spec.sh
set -euo pipefail
cd "$(dirname "$0")/.."

lock=tools/spec/package-lock.json
# The linter comes from the npm registry only: refuse a lock file that
# resolves anything elsewhere (a fork, a tarball URL, a git dependency).
if grep -Eo '"resolved": *"[^"]*"' "$lock" | grep -Ev '"https://registry\.npmjs\.org/' ; then
  echo "lint-spec: $lock resolves packages outside https://registry.npmjs.org/ (above)" >&2
  exit 1
fi

npm ci --prefix tools/spec --no-audit --no-fund --loglevel=error >/dev/null
redocly=tools/spec/node_modules/.bin/redocly
echo "lint-spec: @redocly/cli $("$redocly" --version 2>/dev/null), config redocly.yaml"
# The CLI's telemetry is off: CI reaches no network but package registries.
REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  "$redocly" lint --config redocly.yaml --format=stylish api/openapi.yaml
