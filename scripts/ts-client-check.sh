#!/usr/bin/env bash
# Checks that clients generated from api/openapi.yaml by two stock npm
# generators, at their default options, work against a real gateway:
#
#   examples/ts-worker          openapi-typescript + openapi-fetch
#   examples/ts-heyapi-worker   @hey-api/openapi-ts (types, SDK, fetch client)
#
# Each replays the stale-write incident through a freshly built fencegw in
# front of a tiny node upstream (an acquire without wait_ms; the upstream
# must receive the exact path, query and Content-Type the worker sent) and
# must exit 0.
#
#   bash scripts/ts-client-check.sh
#
# Steps, per example: npm ci (pinned lock file, npm registry only); the
# committed generated code must equal a fresh `npm run generate`; tsc
# type-checks the worker. Then the gateway (go build, 127.0.0.1, free port,
# temp --data) and the upstream are started, both workers run, and
# everything started here is stopped again, whatever happens. Every step is
# bounded in time (scripts/lib/gateway.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ex=examples/ts-worker
examples=("examples/ts-worker:src/fencegw.d.ts" "examples/ts-heyapi-worker:src/client")

name=ts-client-check
# shellcheck source=scripts/lib/gateway.sh
. scripts/lib/gateway.sh

command -v node >/dev/null || die "node is not installed"
say "node $(node --version), npm $(npm --version)"

for entry in "${examples[@]}"; do
  dir=${entry%%:*} generated=${entry#*:}
  lock=$dir/package-lock.json
  if grep -Eo '"resolved": *"[^"]*"' "$lock" | grep -Ev '"https://registry\.npmjs\.org/'; then
    die "$lock resolves packages outside https://registry.npmjs.org/ (above)"
  fi
  say "npm ci in $dir"
  (cd "$dir" && timeout 600 npm ci --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci failed in $dir"

  say "generated client is fresh ($dir: npm run generate, default options)"
  (cd "$dir" && timeout 120 npm run -s generate >/dev/null) || die "npm run generate failed in $dir"
  if [ -n "$(git status --porcelain -- "$dir/$generated")" ]; then
    git --no-pager status --short -- "$dir/$generated" >&2 || true
    die "$dir/$generated is stale or uncommitted: run 'npm run generate' in $dir and commit it"
  fi

  say "tsc --noEmit ($dir)"
  (cd "$dir" && timeout 300 npm run -s typecheck) || die "$dir does not type-check against its generated client"
done

build_gateway

start_upstream node "$ex/upstream.mjs"
start_gateway --shutdown-delay 0

for entry in "${examples[@]}"; do
  dir=${entry%%:*}
  say "running the worker of $dir"
  rc=0
  (cd "$dir" && FENCEGW_URL=$gateway_url FENCEGW_UPSTREAM=statements UPSTREAM_URL=$upstream_url \
    timeout --kill-after=5 120 "$root/$dir/node_modules/.bin/tsx" src/worker.ts) || rc=$?
  [ "$rc" -eq 0 ] || die "the worker of $dir exited $rc"
done
say "PASS"
