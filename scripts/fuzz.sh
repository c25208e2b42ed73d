#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each (default 10s): ./scripts/fuzz.sh 1m
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-10s}"
for pkg in ./tokens ./gateway ./cmd/fencegw ./auth ./storage/bolt ./storage/feed; do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz'); do
    echo "fuzz $pkg $target for $budget"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$budget" "$pkg"
  done
done
