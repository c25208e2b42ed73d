#!/usr/bin/env bash
# The partition fault (docs/reliability.md): one replica runs in a network
# namespace of its own and the nemesis drops, silently, its traffic to
# PostgreSQL for seconds in the middle of writes. Needs root, ip(8) and
# iptables(8). Runs against a private PostgreSQL cluster on port 5441 that
# listens on the host's end of the veth (10.231.0.0/16, this machine only)
# and drops dead peers within seconds; never the machine's shared cluster.
# Then the broken build fencegw_break_no_send_check, which must be caught.
#
#   sudo scripts/torture-partition.sh
#   DURATION=30s BREAK_DURATION=30s PG_PORT=5441 sudo -E scripts/torture-partition.sh
set -euo pipefail
cd "$(dirname "$0")/.."

[[ $(id -u) == 0 ]] || { echo "torture-partition: run as root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null && command -v iptables >/dev/null ||
	{ echo "torture-partition: needs ip(8) and iptables(8)" >&2; exit 2; }
DURATION=${DURATION:-30s}
BREAK_DURATION=${BREAK_DURATION:-60s}
PG_PORT=${PG_PORT:-5441}
PG_VERSION=${PG_VERSION:-$(ls /etc/postgresql | head -1)}
CLUSTER=fgwpart$PG_PORT
OUT=${OUT:-$(mktemp -d /tmp/fencegw-torture-partition.XXXXXX)}
mkdir -p "$OUT/bin"

cleanup() { pg_dropcluster --stop "$PG_VERSION" "$CLUSTER" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
pg_createcluster -q "$PG_VERSION" "$CLUSTER" -p "$PG_PORT" -- --auth=trust >/dev/null
conf=/etc/postgresql/$PG_VERSION/$CLUSTER
cat >>"$conf/postgresql.conf" <<CONF
listen_addresses = '*'
tcp_keepalives_idle = 1
tcp_keepalives_interval = 1
tcp_keepalives_count = 2
tcp_user_timeout = 2000
CONF
echo "host all all 10.231.0.0/16 trust" >>"$conf/pg_hba.conf"
pg_ctlcluster "$PG_VERSION" "$CLUSTER" start
URL="postgres://postgres@127.0.0.1:$PG_PORT/fencegw_torture?sslmode=disable"

go build -o "$OUT/bin/fencegw-torture" ./cmd/fencegw-torture
go build -o "$OUT/bin/fencegw" ./cmd/fencegw
go build -tags fencegw_break_no_send_check -o "$OUT/bin/fencegw-break-no_send_check" ./cmd/fencegw
common=(--quiet --history --mode postgres --postgres "$URL" --pg-cluster "$CLUSTER" --faults partition,slow-body)
failed=()
echo "== postgres mode, partition, $DURATION"
SECONDS=0
"$OUT/bin/fencegw-torture" "${common[@]}" --duration "$DURATION" --gateway-bin "$OUT/bin/fencegw" \
	--json "$OUT/partition.json" --dir "$OUT/run-partition" || failed+=(partition)
echo "   ($SECONDS s)"
echo "== broken build fencegw_break_no_send_check, partition, $BREAK_DURATION (must be caught)"
SECONDS=0
"$OUT/bin/fencegw-torture" "${common[@]}" --duration "$BREAK_DURATION" --expect-violations \
	--gateway-bin "$OUT/bin/fencegw-break-no_send_check" --json "$OUT/break-no_send_check.json" \
	--dir "$OUT/run-break-no_send_check" || failed+=("break_no_send_check (not caught)")
echo "   ($SECONDS s)"
echo "reports in $OUT"
if ((${#failed[@]})); then
	echo "FAILED: ${failed[*]}"
	exit 1
fi
echo "torture partition: passed, broken build caught"
