#!/usr/bin/env bash
# Short fault-injection torture for CI (issue 6): about a minute per storage
# mode against the normal build, then each deliberately broken build, which
# the checker must catch. Fails if a mode fails or is void, or if a broken
# build passes.
#
#   scripts/torture-ci.sh                     all modes (needs PostgreSQL and Redis: scripts/test-services.sh)
#   MODES=embedded scripts/torture-ci.sh      embedded only
#   DURATION=30s BREAK_DURATION=20s scripts/torture-ci.sh
#
# Writes a JSON report per run to $OUT (default: a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
BREAK_DURATION=${BREAK_DURATION:-30s}
MODES=${MODES:-"embedded postgres redis"}
BREAKS=${BREAKS:-"highest_seen not_durable unlock_on_timeout float_tokens no_owner skip_route_check forget_idempotency"}
# Broken builds whose failpoint lives in the PostgreSQL modes, run there with
# the fault that reaches it.
PG_BREAKS=${PG_BREAKS:-"no_replica_drain"}
OUT=${OUT:-$(mktemp -d /tmp/fencegw-torture-ci.XXXXXX)}
mkdir -p "$OUT/bin"

echo "== build"
go build -o "$OUT/bin/fencegw-torture" ./cmd/fencegw-torture
go build -o "$OUT/bin/fencegw" ./cmd/fencegw
for b in $BREAKS $PG_BREAKS; do
	go build -tags "fencegw_break_$b" -o "$OUT/bin/fencegw-break-$b" ./cmd/fencegw
done

failed=()
for m in $MODES; do
	echo "== $m mode, $DURATION"
	if ! "$OUT/bin/fencegw-torture" --quiet --mode "$m" --duration "$DURATION" \
		--gateway-bin "$OUT/bin/fencegw" --json "$OUT/$m.json" --dir "$OUT/run-$m"; then
		failed+=("$m")
	fi
done

# Broken builds run in embedded mode: every failpoint lives on its path
# (tokens, gateway, storage/bolt); no_owner is caught by the thieves (foreign-lease),
# skip_route_check by the route thieves (foreign-route), forget_idempotency by
# the keyed retries (idempotency-key-once).
for b in $BREAKS; do
	echo "== broken build fencegw_break_$b, $BREAK_DURATION (must be caught)"
	if ! "$OUT/bin/fencegw-torture" --quiet --mode embedded --duration "$BREAK_DURATION" --expect-violations \
		--gateway-bin "$OUT/bin/fencegw-break-$b" --json "$OUT/break-$b.json" --dir "$OUT/run-break-$b"; then
		failed+=("break_$b (not caught)")
	fi
done

# A replica killed while the upstream holds its write: the next grant must
# drain (issue 10). Only in the PostgreSQL modes, where replicas share fences.
if [[ " $MODES " == *" postgres "* ]]; then
	for b in $PG_BREAKS; do
		echo "== broken build fencegw_break_$b, postgres mode, $BREAK_DURATION (must be caught)"
		if ! "$OUT/bin/fencegw-torture" --quiet --mode postgres --duration "$BREAK_DURATION" --expect-violations \
			--faults kill-in-write,pause-worker \
			--gateway-bin "$OUT/bin/fencegw-break-$b" --json "$OUT/break-$b.json" --dir "$OUT/run-break-$b"; then
			failed+=("break_$b (not caught)")
		fi
	done
fi

# Open finding (docs/reliability.md): a write in flight while PostgreSQL
# restarts loses its shared lock, and its drain period if it times out
# during the outage, so a new grant can return before it lands. The default
# 300ms forward timeout is shorter than a restart here, so the runs above do
# not reach it; this one does (fixed: PostgreSQL grants now drain after a
# server restart; .ci/run turns it on). PG_OUTAGE_IN_WRITE=1 to run it.
if [[ ${PG_OUTAGE_IN_WRITE:-0} == 1 ]]; then
	echo "== postgres mode, writes in flight across a PostgreSQL restart, $DURATION"
	if ! "$OUT/bin/fencegw-torture" --quiet --mode postgres --duration "$DURATION" \
		--forward-timeout 5s --drain-period 6s --faults restart-postgres-in-write,pause-worker \
		--gateway-bin "$OUT/bin/fencegw" --json "$OUT/postgres-outage-in-write.json" --dir "$OUT/run-postgres-outage-in-write"; then
		failed+=("postgres-outage-in-write")
	fi
fi

echo "reports in $OUT"
if ((${#failed[@]})); then
	echo "FAILED: ${failed[*]}"
	exit 1
fi
echo "torture: all modes passed, all broken builds caught"
