#!/usr/bin/env bash
# Counts the user-space instructions each server executes per write, the
# gateway's process beside the fasthttp ceiling's, under the same load:
#
#   bash scripts/callgrind-servers.sh [seconds per setup, default 30]
#
# Both servers run under valgrind's callgrind (instructions, not seconds:
# the count does not move with what else the machine does), in front of
# one upstream (fencegw-load -serve net-http, which answers itself). The
# load tool drives each in turn with Go's client (8 writers, 200-byte
# POSTs, no warm-up); each server's counters are zeroed before its turn
# and dumped after it, and the count is divided by the writes that turn
# completed. The kernel's share (system calls, the network stack) is not
# in these counts: docs/benchmarks.md puts the two together.
#
# It needs valgrind and callgrind_control (Debian's valgrind) and writes
# the dumps to a temporary directory it names; callgrind_annotate reads
# them. Go's asynchronous preemption is off in both servers
# (GODEBUG=asyncpreemptoff=1): its signals end callgrind 3.19 with an
# assertion.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
  { echo "callgrind-servers: valgrind is not installed (Debian: apt-get install valgrind)" >&2; exit 1; }

out=$(mktemp -d /tmp/callgrind-servers.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

go build -o "$out/fencegw" ./cmd/fencegw
go build -o "$out/fencegw-load" ./cmd/fencegw-load
go build -C tools/fasthttp-ceiling -o "$out/fasthttp-ceiling" .

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(free_port) gw=$(free_port) fh=$(free_port)

"$out/fencegw-load" -serve net-http -serve-listen "127.0.0.1:$up" -serve-upstream http://127.0.0.1:1 >"$out/upstream.log" 2>&1 &
pids+=($!)
GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out/gateway.out" \
  "$out/fencegw" serve --listen "127.0.0.1:$gw" --data "$out/data" --upstream "svc=http://127.0.0.1:$up" \
  --log-level warn >"$out/gateway.log" 2>&1 &
gw_pid=$!
pids+=("$gw_pid")
GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out/fasthttp.out" \
  "$out/fasthttp-ceiling" -listen "127.0.0.1:$fh" -upstream "127.0.0.1:$up" >"$out/fasthttp.log" 2>&1 &
fh_pid=$!
pids+=("$fh_pid")

# Under valgrind a server takes seconds to start.
for _ in $(seq 120); do
  if curl -fs -o /dev/null "http://127.0.0.1:$gw/healthz" &&
    curl -fs -o /dev/null -X POST --data x "http://127.0.0.1:$fh/x"; then
    break
  fi
  sleep 1
done
curl -fs -o /dev/null "http://127.0.0.1:$gw/healthz" || { cat "$out/gateway.log" >&2; exit 1; }

# count SETUP PID LABEL: zero PID's counters, drive SETUP, dump, divide.
count() {
  local setup=$1 pid=$2 label=$3 requests before after
  before=$(ls "$out" | grep -c "^$label.out" || true)
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$out/fencegw-load" -gateway "http://127.0.0.1:$gw" -upstream-name svc \
    -bare "http://127.0.0.1:$fh/x" -direct "http://127.0.0.1:$up/x" \
    -setups "$setup" -duration "${seconds}s" -rounds 1 -warmup 0 -body-size 200 -concurrency 8 >"$out/$label.load" 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  for _ in $(seq 60); do
    after=$(ls "$out" | grep -c "^$label.out" || true)
    [ "$after" -gt "$before" ] && break
    sleep 1
  done
  sleep 2 # the dump is written in full
  requests=$(awk -v s="$setup" '$1 == s && $2 ~ /^[0-9]+$/ {print $2}' "$out/$label.load")
  local dump
  dump=$(ls -t "$out/$label.out".* | head -1)
  local instructions
  instructions=$(awk '/^summary:/ {print $2}' "$dump")
  [ -n "$requests" ] && [ "$requests" -gt 0 ] || { cat "$out/$label.load" >&2; exit 1; }
  printf '%-40s %9d writes  %12d instructions  %7d per write  (%s)\n' "$label" "$requests" "$instructions" \
    $((instructions / requests)) "$dump"
}

count gateway "$gw_pid" gateway
count bare-proxy "$fh_pid" fasthttp
