#!/usr/bin/env bash
# Checks that a Go client generated from api/openapi.yaml by ogen (the
# common Go alternative to oapi-codegen), at its default options, works
# against a real gateway:
#
#   tools/ogen-check   the worker (main.go) and its own go.mod, which pins
#                      ogen v1.24.0 as a tool: ogen is never a dependency
#                      of fencegw's module, and the generated package is
#                      not committed
#
# In a temporary copy of tools/ogen-check, `go tool ogen --target oas
# --package oas --clean api/openapi.yaml` generates the client (ogen must
# find every operation's default response, so that its errors are one
# type); the worker is built and replays the stale-write incident through a
# freshly built fencegw, with --auth-file, on a free port, in front of the
# worker's own upstream mode, and must exit 0. Its security source offers
# the key both as a bearer token and as HTTP Basic, as a client that also
# reads the dashboard does: the spec must let it send Basic only where the
# gateway takes it.
#
#   bash scripts/ogen-client-check.sh
#   OGEN_CHECK_TIDY=1 bash scripts/ogen-client-check.sh   # also rewrites
#       tools/ogen-check/go.mod and go.sum, tidied against the generated code
#
# Everything started here is stopped again, whatever happens; every step
# is bounded in time (scripts/lib/gateway.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

name=ogen-client-check
# shellcheck source=scripts/lib/gateway.sh
. scripts/lib/gateway.sh
logs+=(ogen.log)

mod=$tmp/ogen-check
mkdir -p "$mod"
cp tools/ogen-check/go.mod tools/ogen-check/go.sum tools/ogen-check/main.go "$mod/"
# The copy is a module of its own, outside any workspace; its go.mod and
# go.sum are complete for the generated code (OGEN_CHECK_TIDY=1 rewrites
# them), so nothing is resolved at build time.
export GOWORK=off

say "ogen $(grep -Eo 'github.com/ogen-go/ogen v[^ ]+' "$mod/go.mod" | head -n 1 | cut -d' ' -f2): generating the client (default options)"
(cd "$mod" && timeout 900 go tool ogen --target oas --package oas --clean "$root/api/openapi.yaml") >"$tmp/ogen.log" 2>&1 ||
  die "ogen failed on api/openapi.yaml"
if grep -q 'Convenient errors are not available' "$tmp/ogen.log"; then
  grep 'Convenient errors' "$tmp/ogen.log" >&2
  die "ogen found operations without the shared default response (api/openapi.yaml)"
fi
grep -q 'Generating convenient error response' "$tmp/ogen.log" || die "ogen generated no shared error type"

if [ "${OGEN_CHECK_TIDY:-}" = 1 ]; then
  (cd "$mod" && timeout 600 go mod tidy) || die "go mod tidy failed"
  cp "$mod/go.mod" "$mod/go.sum" tools/ogen-check/
  say "tools/ogen-check/go.mod and go.sum tidied"
fi

say "go build (the worker and its generated client)"
(cd "$mod" && timeout 900 go vet . && timeout 900 go build -o "$tmp/ogen-worker" .) || die "the worker does not build against its generated client"

build_gateway

"$tmp/fencegw" gen-key >"$tmp/key.txt"
key=$(sed -n 's/^key: *//p' "$tmp/key.txt")
hash=$(sed -n 's/^sha256: *//p' "$tmp/key.txt")
[ -n "$key" ] && [ -n "$hash" ] || die "gen-key gave no key"
cat >"$tmp/auth.yaml" <<EOF
keys:
  - name: ogen-worker
    sha256: $hash
    role: worker
EOF

start_upstream "$tmp/ogen-worker" upstream
start_gateway --auth-file "$tmp/auth.yaml"

rc=0
FENCEGW_URL=$gateway_url FENCEGW_UPSTREAM=statements UPSTREAM_URL=$upstream_url FENCEGW_KEY=$key \
  timeout --kill-after=5 120 "$tmp/ogen-worker" worker || rc=$?
[ "$rc" -eq 0 ] || die "the ogen worker exited $rc"
say "PASS"
