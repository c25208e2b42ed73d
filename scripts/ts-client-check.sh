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
# bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ex=examples/ts-worker
examples=("examples/ts-worker:src/fencegw.d.ts" "examples/ts-heyapi-worker:src/client")

say() { printf 'ts-client-check: %s\n' "$*"; }
die() { say "FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    # The gateway drains and exits on SIGTERM; make sure nothing lingers.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ]; then
    for f in "$tmp"/upstream.log "$tmp"/gateway.log; do
      [ -s "$f" ] && { echo "--- $(basename "$f")" >&2; tail -n 40 "$f" >&2; }
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_for FILE PATTERN SECONDS PID: prints the first match of the sed
# PATTERN (a substitution printing what it captures) once FILE has it.
wait_for() {
  local file=$1 pattern=$2 secs=$3 pid=$4 got
  for _ in $(seq $((secs * 10))); do
    got=$(sed -n "$pattern" "$file" 2>/dev/null | head -n 1)
    if [ -n "$got" ]; then printf '%s\n' "$got"; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

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

say "go build ./cmd/fencegw"
timeout 600 go build -o "$tmp/fencegw" ./cmd/fencegw || die "go build failed"

node "$ex/upstream.mjs" >"$tmp/upstream.log" 2>&1 &
pids+=($!)
upstream_url=$(wait_for "$tmp/upstream.log" 's/^listening on \(http[^ ]*\).*/\1/p' 10 "${pids[-1]}") ||
  die "the upstream did not start"
say "upstream at $upstream_url"

"$tmp/fencegw" serve --listen 127.0.0.1:0 --data "$tmp/data" --shutdown-delay 0 --upstream "statements=$upstream_url" \
  >"$tmp/gateway.log" 2>&1 &
pids+=($!)
gateway_url=$(wait_for "$tmp/gateway.log" 's/.*serving on \(http[^ ]*\).*/\1/p' 30 "${pids[-1]}") ||
  die "the gateway did not start"
say "gateway at $gateway_url"

for entry in "${examples[@]}"; do
  dir=${entry%%:*}
  say "running the worker of $dir"
  rc=0
  (cd "$dir" && FENCEGW_URL=$gateway_url FENCEGW_UPSTREAM=statements UPSTREAM_URL=$upstream_url \
    timeout --kill-after=5 120 "$root/$dir/node_modules/.bin/tsx" src/worker.ts) || rc=$?
  [ "$rc" -eq 0 ] || die "the worker of $dir exited $rc"
done
say "PASS"
