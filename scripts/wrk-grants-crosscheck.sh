#!/usr/bin/env bash
# A cross-check of the grants figure with a client that is not ours: wrk
# (Debian's package, in C, a Lua script making each request's resource
# fresh) drives POST /v1/leases against `fencegw serve` (the embedded
# store, as a user starts it), then tools/etcd-locks takes as many lock
# acquisitions on etcd (a LeaseGrant and a put-if-absent each, etcd's Go
# client: etcd has no HTTP client as light as wrk), with as many
# connections or acquirers, for as long, one after the other in rounds.
# Server CPU per grant or acquisition is read from /proc (the process's
# user + system time over the run). Each grant is durable before it is
# answered, as each of etcd's acquisitions is (docs/benchmarks.md).
#
#   scripts/wrk-grants-crosscheck.sh             # 20 s each, 2 rounds, 64 connections
#   DURATION=10s ROUNDS=3 CONNS=64 scripts/wrk-grants-crosscheck.sh
#
# Needs wrk and etcd (apt-get install wrk etcd-server), Go, curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-64}
ETCD=${ETCD:-etcd}
for c in wrk "$ETCD" curl python3; do
	command -v "$c" >/dev/null || { echo "wrk-grants-crosscheck: needs $c" >&2; exit 2; }
done
W=$(mktemp -d /tmp/fencegw-wrk-grants.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT

go build -o "$W/fencegw" ./cmd/fencegw
go build -C tools/etcd-locks -o "$W/etcd-locks" .

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GW=127.0.0.1:$(port)
EC=127.0.0.1:$(port)
EP=http://127.0.0.1:$(port)
"$W/fencegw" serve --listen "$GW" --data "$W/data" >"$W/fencegw.log" 2>&1 & pids+=($!); gw_pid=$!
"$ETCD" --name x --data-dir "$W/etcd" --listen-client-urls "http://$EC" --advertise-client-urls "http://$EC" \
	--listen-peer-urls "$EP" --initial-advertise-peer-urls "$EP" --initial-cluster "x=$EP" --log-level warn \
	>"$W/etcd.log" 2>&1 & pids+=($!); etcd_pid=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://$GW/healthz" && break; sleep 0.1; done
for _ in $(seq 100); do curl -s -o /dev/null "http://$EC/health" && break; sleep 0.1; done

# Every request a fresh resource: the run's own prefix and a counter.
cat >"$W/grants.lua" <<'LUA'
local n = 0
local prefix = "wrk:" .. os.time() .. ":" .. math.random(1e9) .. ":"
local headers = {["Content-Type"] = "application/json"}
request = function()
	n = n + 1
	return wrk.format("POST", "/v1/leases", headers,
		'{"resource":"' .. prefix .. n .. '","holder":"wrk","ttl_ms":1000}')
end
LUA

ticks() { # user + system ticks of the process
	local f
	read -ra f < <(sed 's/.*) //' "/proc/$1/stat")
	echo $((f[11] + f[12]))
}
hz=$(getconf CLK_TCK)
secs=$(python3 -c "import sys; d=sys.argv[1]; print(float(d[:-1]) * {'s': 1, 'm': 60}[d[-1]])" "$DURATION")
wrk -t1 -c"$CONNS" -d1s -s "$W/grants.lua" "http://$GW" >/dev/null # warm-up
"$W/etcd-locks" -endpoint "$EC" -acquirers "$CONNS" -duration 1s -warmup 0s -prefix "warm/" >/dev/null

printf '%-7s %5s %10s %9s %9s %16s %8s\n' setup round per-sec p50 p99 "server CPU µs" failed
declare -A rate cpu
for r in $(seq "$ROUNDS"); do
	t0=$(ticks "$gw_pid")
	out=$(wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$W/grants.lua" "http://$GW")
	t1=$(ticks "$gw_pid")
	n=$(awk '/requests in/ {print $1}' <<<"$out")
	rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
	bad=$(awk '/Non-2xx/ {print $4}' <<<"$out" | grep . || echo 0)
	us=$(python3 -c "print(round(($t1 - $t0) / $hz * 1e6 / $n, 1))")
	printf '%-7s %5s %10s %9s %9s %16s %8s\n' fencegw "$r" "$rps" "$(awk '$1=="50%" {print $2}' <<<"$out")" \
		"$(awk '$1=="99%" {print $2}' <<<"$out")" "$us" "$bad"
	rate[fencegw]="${rate[fencegw]:-} $rps"
	cpu[fencegw]="${cpu[fencegw]:-} $us"

	t0=$(ticks "$etcd_pid")
	js=$("$W/etcd-locks" -endpoint "$EC" -acquirers "$CONNS" -duration "$DURATION" -warmup 0s -prefix "r$r/")
	t1=$(ticks "$etcd_pid")
	read -r n eps p50 p99 errs < <(python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["acquisitions"], round(r["per_second"], 1), round(r["p50_us"]), round(r["p99_us"]), r["errors"])' <<<"$js")
	us=$(python3 -c "print(round(($t1 - $t0) / $hz * 1e6 / max($n, 1), 1))")
	printf '%-7s %5s %10s %8sus %8sus %16s %8s\n' etcd "$r" "$eps" "$p50" "$p99" "$us" "$errs"
	rate[etcd]="${rate[etcd]:-} $eps"
	cpu[etcd]="${cpu[etcd]:-} $us"
done
median() { python3 -c "import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
# shellcheck disable=SC2086
printf 'fencegw grants / etcd acquisitions (medians over the rounds): %.2fx the rate, %.2fx the server CPU each (%s s a run)\n' \
	"$(python3 -c "print($(median ${rate[fencegw]}) / $(median ${rate[etcd]}))")" \
	"$(python3 -c "print($(median ${cpu[fencegw]}) / $(median ${cpu[etcd]}))")" "$secs"
