#!/usr/bin/env bash
# Checks the TypeScript SDK (sdk/typescript, @fencegw/client) and its Node
# example against a real gateway:
#
#   bash scripts/sdk-typescript-check.sh
#
#  1. npm ci in sdk/typescript (pinned lock file, npm registry only);
#  2. the committed generated types (src/openapi.ts) equal a fresh
#     `npm run generate` (openapi-typescript from api/openapi.yaml);
#  3. tsc compiles src/ to dist/ (dist/ is built here, never committed),
#     and a TypeScript consumer (test/types) type-checks against it;
#  4. node --test runs the conformance tests (sdk/CONFORMANCE.md ids in
#     their names) against the fencegw binary built here;
#  5. examples/node-inventory-worker replays the inventory story through
#     that gateway in front of its inventory service, and must exit 0.
#
# Every step is bounded in time; anything started here is stopped again
# (scripts/lib/gateway.sh). Nothing is skipped: a missing node or npm fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
sdk=sdk/typescript
ex=examples/node-inventory-worker

name=sdk-typescript-check
# shellcheck source=scripts/lib/gateway.sh
. scripts/lib/gateway.sh

command -v node >/dev/null || die "node is not installed"
command -v npm >/dev/null || die "npm is not installed"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || die "node $(node --version): the SDK needs node 18 or later"
say "node $(node --version), npm $(npm --version)"

for lock in "$sdk/package-lock.json" "$ex/package-lock.json"; do
  if grep -Eo '"resolved": *"[^"]*"' "$lock" | grep -Ev '"(https://registry\.npmjs\.org/|\.\./\.\./sdk/typescript")'; then
    die "$lock resolves packages outside https://registry.npmjs.org/ (above)"
  fi
done

say "npm ci in $sdk"
(cd "$sdk" && timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci failed in $sdk"

say "generated types are fresh ($sdk: npm run generate)"
(cd "$sdk" && timeout 120 npm run -s generate >/dev/null) || die "npm run generate failed in $sdk"
if [ -n "$(git status --porcelain -- "$sdk/src/openapi.ts")" ]; then
  git --no-pager diff --stat -- "$sdk/src/openapi.ts" >&2 || true
  die "$sdk/src/openapi.ts is stale or uncommitted: run 'npm run generate' in $sdk and commit it"
fi

say "tsc ($sdk)"
(cd "$sdk" && timeout 300 npm run -s build) || die "$sdk does not compile"
say "a TypeScript consumer type-checks against dist/*.d.ts ($sdk/test/types)"
(cd "$sdk" && timeout 300 npm run -s typecheck:consumer) || die "$sdk/test/types/consumer.ts does not type-check against the package's declarations"

build_gateway

say "node --test ($sdk, against $tmp/fencegw)"
(cd "$sdk" && FENCEGW_BIN="$tmp/fencegw" timeout --kill-after=5 300 node --test --test-timeout=120000 test/) ||
  die "the TypeScript SDK's tests failed"

say "npm ci in $ex"
(cd "$ex" && timeout 120 npm ci --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci failed in $ex"
start_upstream node "$ex/inventory.mjs"
start_gateway --shutdown-delay 0 --upstream "inventory=$upstream_url"
say "running $ex/demo.mjs"
rc=0
(cd "$ex" && FENCEGW_URL=$gateway_url INVENTORY_URL=$upstream_url timeout --kill-after=5 120 node demo.mjs) || rc=$?
[ "$rc" -eq 0 ] || die "the inventory story of $ex failed (exit $rc)"
cd "$root"
say "PASS"
