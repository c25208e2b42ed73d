# shellcheck shell=bash
# Sourced by the scripts that run a generated client against a freshly
# built gateway (ogen-client-check.sh, ts-client-check.sh), from the
# repository root, after setting `name` (the prefix of their messages).
# It gives them:
#
#   say MSG, die MSG        a line prefixed with $name; die fails the script
#   $tmp                    a temporary directory
#   logs                    files of $tmp whose tail is shown on a failure
#   wait_for FILE PATTERN SECONDS PID
#   build_gateway           go build ./cmd/fencegw into $tmp/fencegw
#   start_upstream CMD...   sets upstream_url
#   start_gateway ARGS...   sets gateway_url
#
# Everything started here is stopped again, and $tmp removed, whatever
# happens; every step is bounded in time.

say() { printf '%s: %s\n' "$name" "$*"; }
die() { say "FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
logs=()
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
    for f in "${logs[@]}"; do
      [ -s "$tmp/$f" ] && { echo "--- $f" >&2; tail -n 40 "$tmp/$f" >&2; }
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

build_gateway() {
  say "go build ./cmd/fencegw"
  timeout 600 go build -o "$tmp/fencegw" ./cmd/fencegw || die "go build failed"
}

# start_upstream CMD...: runs CMD, an upstream that prints "listening on
# URL", in the background, and sets upstream_url once it does.
start_upstream() {
  logs+=(upstream.log)
  "$@" >"$tmp/upstream.log" 2>&1 &
  pids+=($!)
  upstream_url=$(wait_for "$tmp/upstream.log" 's/^listening on \(http[^ ]*\).*/\1/p' 10 "${pids[-1]}") ||
    die "the upstream did not start"
  say "upstream at $upstream_url"
}

# start_gateway ARGS...: runs $tmp/fencegw serve on a free loopback port,
# with a temporary --data and ARGS, forwarding the upstream "statements" to
# $upstream_url, and sets gateway_url once it serves.
start_gateway() {
  logs+=(gateway.log)
  "$tmp/fencegw" serve --listen 127.0.0.1:0 --data "$tmp/data" "$@" --upstream "statements=$upstream_url" \
    >"$tmp/gateway.log" 2>&1 &
  pids+=($!)
  gateway_url=$(wait_for "$tmp/gateway.log" 's/.*serving on \(http[^ ]*\).*/\1/p' 30 "${pids[-1]}") ||
    die "the gateway did not start"
  say "gateway at $gateway_url"
}
