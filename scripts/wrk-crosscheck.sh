#!/usr/bin/env bash
# A cross-check of the write figures with a client that is not ours: wrk
# (Debian's package, in C) drives fenced writes through `fencegw serve`
# (the embedded store, as a user starts it), the fasthttp ceiling and nginx,
# each in its own process, one after another in rounds, against one small Go
# upstream. Server CPU per request is read from /proc (the process's user +
# system time over the run, nginx's master and workers summed), and printed
# split into the two as well. A lighter client than fencegw-load's Go
# clients, so each request costs the servers less and their fixed costs
# weigh more (docs/benchmarks.md).
#
#   scripts/wrk-crosscheck.sh                 # 10 s per setup, 3 rounds, 32 connections
#   DURATION=20s ROUNDS=5 CONNS=64 scripts/wrk-crosscheck.sh
#
# Needs wrk and nginx (apt-get install wrk nginx-light), Go, curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
BODY=${BODY:-256}
for c in wrk nginx curl python3; do
	command -v "$c" >/dev/null || { echo "wrk-crosscheck: needs $c" >&2; exit 2; }
done
W=$(mktemp -d /tmp/fencegw-wrk.XXXXXX)
pids=()
cleanup() {
	[[ -f $W/nginx/nginx.pid ]] && kill "$(cat "$W/nginx/nginx.pid")" 2>/dev/null
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT

# The upstream: reads the body, answers 200 with three bytes.
mkdir -p "$W/up"
cat >"$W/up/main.go" <<'GO'
package main

import (
	"io"
	"net/http"
	"os"
)

func main() {
	_ = http.ListenAndServe(os.Args[1], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	}))
}
GO
printf 'module up\ngo 1.26\n' >"$W/up/go.mod"
go build -C "$W/up" -o "$W/upstream" .
go build -o "$W/fencegw" ./cmd/fencegw
go build -C tools/fasthttp-ceiling -o "$W/fasthttp-ceiling" .

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=127.0.0.1:$(port)
GW=127.0.0.1:$(port)
FH=127.0.0.1:$(port)
NX=127.0.0.1:$(port)
"$W/upstream" "$UP" & pids+=($!)
"$W/fencegw" serve --listen "$GW" --data "$W/data" --upstream "up=http://$UP" >"$W/fencegw.log" 2>&1 & pids+=($!); gw_pid=$!
"$W/fasthttp-ceiling" -listen "$FH" -upstream "$UP" & pids+=($!); fh_pid=$!
mkdir -p "$W/nginx"
cat >"$W/nginx/nginx.conf" <<NGINX
daemon off; master_process on; worker_processes $(nproc); pid $W/nginx/nginx.pid; error_log $W/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $W/nginx/cb; proxy_temp_path $W/nginx/p; fastcgi_temp_path $W/nginx/f;
    uwsgi_temp_path $W/nginx/u; scgi_temp_path $W/nginx/s;
    upstream up { server $UP; keepalive 256; }
    server {
        listen $NX;
        location / {
            proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto \$scheme;
        }
    }
}
NGINX
nginx -p "$W/nginx" -e "$W/nginx/error.log" -c "$W/nginx/nginx.conf" & pids+=($!)
for a in "$UP" "$GW" "$FH" "$NX"; do
	for _ in $(seq 100); do curl -s -o /dev/null "http://$a/" && break; sleep 0.1; done
done

lease=$(curl -sf -X POST -H 'Content-Type: application/json' -d '{"resource":"wrk:1","holder":"wrk","ttl_ms":3600000}' "http://$GW/v1/leases" |
	python3 -c 'import sys, json; print(json.load(sys.stdin)["lease_id"])')
script() { # $1: the Fencing-Lease value ("" for none)
	printf 'wrk.method = "POST"\nwrk.body = string.rep("x", %d)\nwrk.headers["Content-Type"] = "application/octet-stream"\n' "$BODY"
	[[ -n $1 ]] && printf 'wrk.headers["Fencing-Lease"] = "%s"\n' "$1"
	return 0
}
script "$lease" >"$W/fenced.lua"
script "" >"$W/plain.lua"

ticks() { # user and system ticks of the given processes, summed
	local u=0 k=0 f
	for p in "$@"; do
		read -ra f < <(sed 's/.*) //' "/proc/$p/stat")
		u=$((u + f[11])) k=$((k + f[12]))
	done
	echo "$u $k"
}
hz=$(getconf CLK_TCK)
printf '%-9s %5s %10s %9s %9s %16s %8s %8s %8s\n' setup round req/s p50 p99 "server CPU µs" "user" "system" non-2xx
declare -A rate cpu usr sys
for r in $(seq "$ROUNDS"); do
	for s in fasthttp gateway nginx; do
		case $s in
		gateway) url=http://$GW/v1/proxy/up/w; procs=$gw_pid; lua=fenced.lua ;;
		fasthttp) url=http://$FH/w; procs=$fh_pid; lua=plain.lua ;;
		nginx) url=http://$NX/w; m=$(cat "$W/nginx/nginx.pid"); procs="$m $(pgrep -P "$m" | tr '\n' ' ')"; lua=plain.lua ;;
		esac
		# shellcheck disable=SC2086
		read -r u0 k0 < <(ticks $procs)
		out=$(wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$W/$lua" "$url")
		# shellcheck disable=SC2086
		read -r u1 k1 < <(ticks $procs)
		n=$(awk '/requests in/ {print $1}' <<<"$out")
		rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
		per() { python3 -c "print(round(($1) / $hz * 1e6 / $n, 1))"; }
		us=$(per "$u1 - $u0 + $k1 - $k0")
		printf '%-9s %5s %10s %9s %9s %16s %8s %8s %8s\n' "$s" "$r" "$rps" "$(awk '$1=="50%" {print $2}' <<<"$out")" \
			"$(awk '$1=="99%" {print $2}' <<<"$out")" "$us" "$(per "$u1 - $u0")" "$(per "$k1 - $k0")" \
			"$(awk '/Non-2xx/ {print $4}' <<<"$out" | grep . || echo 0)"
		rate[$s]="${rate[$s]:-} $rps"
		cpu[$s]="${cpu[$s]:-} $us"
		usr[$s]="${usr[$s]:-} $(per "$u1 - $u0")"
		sys[$s]="${sys[$s]:-} $(per "$k1 - $k0")"
	done
done
median() { python3 -c "import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
for s in fasthttp gateway nginx; do
	# shellcheck disable=SC2086
	printf '%s: server CPU per request (medians over the rounds) %s µs user, %s µs system\n' "$s" "$(median ${usr[$s]})" "$(median ${sys[$s]})"
done
for s in gateway nginx; do
	# shellcheck disable=SC2086
	printf '%s / fasthttp (medians over the rounds): throughput %.2f, server CPU per request %.2f\n' "$s" \
		"$(python3 -c "print($(median ${rate[$s]}) / $(median ${rate[fasthttp]}))")" \
		"$(python3 -c "print($(median ${cpu[$s]}) / $(median ${cpu[fasthttp]}))")"
done
# shellcheck disable=SC2086
printf 'gateway / nginx: throughput %.2f, server CPU per request %.2f\n' \
	"$(python3 -c "print($(median ${rate[gateway]}) / $(median ${rate[nginx]}))")" \
	"$(python3 -c "print($(median ${cpu[gateway]}) / $(median ${cpu[nginx]}))")"
