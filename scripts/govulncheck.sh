#!/usr/bin/env bash
# Runs govulncheck (pinned) over the module.
#
#   bash scripts/govulncheck.sh
#
# govulncheck needs the Go vulnerability database. vuln.go.dev is used when
# it answers; otherwise (CI reaches only package registries) the database is
# built offline from the golang.org/x/vulndb module, fetched through the Go
# module proxy like any module: its data/osv/*.json are the database's
# entries, and its own cmd/indexdb writes the index govulncheck reads. That
# copy is as fresh as VULNDB_VERSION below: bump it (the newest pseudo-version
# on the proxy) to see newer reports.
#
# Exits non-zero when the code calls a known-vulnerable function (govulncheck
# exit code 3), or on any error.
set -euo pipefail
cd "$(dirname "$0")/.."

GOVULNCHECK_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018

db=https://vuln.go.dev
if ! curl -fsS --max-time 5 -o /dev/null "$db/index/db.json" 2>/dev/null; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/fencegw/vulndb-$VULNDB_VERSION"
  if [ ! -f "$cache/index/db.json" ]; then
    echo "govulncheck: $db unreachable; building the database from golang.org/x/vulndb@$VULNDB_VERSION" >&2
    src=$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src/data/osv" ] || { echo "govulncheck: no data/osv in $src" >&2; exit 1; }
    rm -rf "$cache.tmp"
    # indexdb is run outside this module so its dependencies stay out of go.mod.
    (cd "$(mktemp -d)" && GOFLAGS=-mod=mod go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" \
      -vulns "$src/data/osv" -out "$cache.tmp")
    mv "$cache.tmp" "$cache"
  fi
  db="file://$cache"
fi
echo "govulncheck $GOVULNCHECK_VERSION, database $db" >&2
# Installed, not `go run`: go run turns govulncheck's exit code 3
# ("vulnerable code is called") into 1, and callers tell the two apart.
bin=$(mktemp -d)
GOBIN="$bin" go install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"
exec "$bin/govulncheck" -db "$db" ./...
