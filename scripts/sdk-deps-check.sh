#!/usr/bin/env bash
# Checks that the Go SDK is light for the workers that import it: a fresh
# module that imports only github.com/fencegw/fencegw/client (this checkout,
# through a replace directive) must, after `go mod tidy`, require nothing
# but the oapi-codegen runtime and its two small dependencies, and its
# binary must not carry the server's packages or the embedded spec.
# client/deps_test.go checks `go list -deps ./client`; this checks what a
# worker's own go.mod and binary get.
#
#   bash scripts/sdk-deps-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/go.mod" <<EOM
module example.com/worker

go 1.26.0

require github.com/fencegw/fencegw v0.0.0

replace github.com/fencegw/fencegw => $root
EOM
cat >"$tmp/main.go" <<'EOM'
package main

import (
	"fmt"

	"github.com/fencegw/fencegw/client"
)

func main() {
	c, err := client.New("http://127.0.0.1:8080")
	fmt.Println(c != nil, err)
}
EOM
(cd "$tmp" && GOFLAGS=-mod=mod timeout 300 go mod tidy)
allowed='^(github\.com/fencegw/fencegw|github\.com/oapi-codegen/runtime|github\.com/google/uuid|github\.com/apapsch/go-jsonmerge/v2)$'
required=$(cd "$tmp" && go list -m all | wc -l)
# The worker's own requirements: the edges out of its module in the graph.
selected=$(cd "$tmp" && go mod graph | awk '$1 == "example.com/worker" { sub(/@.*/, "", $2); if ($2 != "go" && $2 != "toolchain") print $2 }' | sort -u)
extra=$(printf '%s\n' "$selected" | grep -Ev "$allowed" || true)
if [ -n "$extra" ]; then
  echo "sdk-deps-check: a worker importing client/ must require these in its go.mod:" >&2
  echo "$extra" >&2
  exit 1
fi
(cd "$tmp" && go build -o worker .)
if go version -m "$tmp/worker" | grep -E 'go-chi|kin-openapi|pgx|go-redis|bbolt|prometheus|chromedp'; then
  echo "sdk-deps-check: the worker's binary links the modules above" >&2
  exit 1
fi
if grep -q 'operationId: acquireLease' "$tmp/worker"; then
  echo "sdk-deps-check: the worker's binary carries the embedded OpenAPI document" >&2
  exit 1
fi
echo "sdk-deps-check: a worker's go.mod requires only: $(printf '%s ' $selected)"
echo "sdk-deps-check: PASS ($(wc -c <"$tmp/worker") bytes, $((required - 1)) modules in its graph)"
