#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each (default 10s): ./scripts/fuzz.sh 1m
#
# Go 1.26's fuzz coordinator can fail a duration-bounded run with a bare
# "context deadline exceeded" at the -fuzztime boundary when the machine is
# loaded (golang/go#75804, fixed in Go 1.27): no input failed, none was
# written. A run that fails that way, and only that way, is run again with
# a count budget (-fuzztime Nx, which has no deadline to race) of the
# executions the first run reached (at least 100: the count is read from a
# progress line, which a short run may print early or not at all; slow
# targets such as FuzzSmuggling, a gateway and two servers per input, reach
# a few hundred in seconds, and a fixed large budget would hold CI for an
# hour). Any other failure, and any failure that wrote a reproducer, fails
# at once.
#
# The gateway's smuggling targets (FuzzSmuggling, FuzzLeaseSmuggling) send
# each input over real connections to a gateway and to Go's server, whose
# goroutines also run the instrumented code: the coverage of one input
# varies from run to run, so the coordinator takes input after input for
# new coverage and minimizes each for -fuzzminimizetime (60 s by default).
# They would run their seeds, then stall there: about 45 inputs in 20 s.
# They run with -fuzzminimizetime 1x (no minimization: an input that fails
# is written as it was): about 130 inputs a second.
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-10s}"
noisy_coverage=" FuzzSmuggling FuzzLeaseSmuggling "

# minimize_flags are a target's -fuzzminimizetime, if not Go's default.
minimize_flags() {
  if [[ $noisy_coverage == *" $1 "* ]]; then
    echo "-test.fuzzminimizetime 1x"
  fi
}

# fuzz_packages runs every target of the packages given, one after another,
# from one instrumented test binary per package (go test -c -fuzz): go test
# -fuzz would link a binary for each target (38 links for 9 packages, the
# gateway's alone a few seconds each), not run its fuzzing any better. The
# binary runs in the package's directory, as go test runs it (the seed
# corpus is read from testdata/fuzz there, a failing input written there),
# with go test's own cache directory for what it finds.
fuzz_packages() {
  local out bin dir cache pkg target execs
  out=$(mktemp)
  bin=$(mktemp)
  trap 'rm -f "$out" "$bin"' RETURN
  for pkg in "$@"; do
    go test -c -fuzz . -o "$bin" "$pkg"
    dir=$(go list -f '{{.Dir}}' "$pkg")
    cache="$(go env GOCACHE)/fuzz/$(go list -f '{{.ImportPath}}' "$pkg")"
    for target in $(cd "$dir" && "$bin" -test.list '^Fuzz' | grep '^Fuzz'); do
      echo "fuzz $pkg $target for $budget"
      # shellcheck disable=SC2046 # the flags are words, or none
      if (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "$budget" \
        -test.fuzzcachedir "$cache" -test.timeout 10m $(minimize_flags "$target")) 2>&1 | tee "$out"; then
        continue
      fi
      if ! grep -qx '    context deadline exceeded' "$out" || grep -q 'Failing input written to' "$out"; then
        return 1
      fi
      execs=$(grep -o 'execs: [0-9]*' "$out" | tail -1 | tr -dc 0-9 || true)
      [ "${execs:-0}" -ge 100 ] || execs=100
      echo "fuzz $pkg $target: the Go 1.26 fuzztime race (golang/go#75804), no failing input; again for ${execs}x"
      # shellcheck disable=SC2046
      (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "${execs}x" \
        -test.fuzzcachedir "$cache" -test.timeout 10m $(minimize_flags "$target")) || return 1
    done
  done
}

# Two lanes side by side, the gateway's targets in one and every other
# package's in the other (about as long): each package pays its
# instrumented build, and each target its seed corpus before it fuzzes,
# one core's work, so two lanes on two cores take about half the time of
# one. Each lane's
# output is printed whole once both have ended.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
lanes=("./gateway ./gateway/internal/wire" "./tokens ./gateway/internal/framing ./gateway/internal/engine ./cmd/fencegw ./auth ./storage/bolt ./storage/feed")
pids=()
for i in "${!lanes[@]}"; do
  # shellcheck disable=SC2086 # a lane is a list of packages
  fuzz_packages ${lanes[$i]} >"$logs/$i" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!lanes[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  cat "$logs/$i"
  if [ "$status" -ne 0 ]; then
    echo "fuzz: the lane of ${lanes[$i]} failed (above)" >&2
    failed=1
  fi
done
exit "$failed"
