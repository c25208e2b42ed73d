#!/usr/bin/env bash
# Checks the Python SDK (sdk/python) against a real gateway:
#
#   bash scripts/sdk-python-check.sh
#
# 0. type-checks the SDK with mypy --strict (Debian's; under CI=true it and
#    python3-setuptools/python3-wheel are installed with apt-get if missing);
# 1. builds fencegw (go build) once, for all that follows;
# 2. runs the SDK's unittest suite (sdk/python/tests: the conformance list
#    of sdk/CONFORMANCE.md, C01-C14), which starts its own gateways from
#    that binary, its own upstream, and stops and SIGSTOPs them;
# 3. runs examples/py-worker/broken_lock.py (the stale-write incident on
#    the SDK) against a gateway in front of examples/py-worker/upstream.py;
# 4. builds the wheel offline (pip wheel --no-deps --no-build-isolation
#    --no-index: no package index is reachable) with an interpreter that has
#    setuptools and wheel ($PYTHON's, else Debian's /usr/bin/python3), and
#    imports it from a clean directory. Without one this step fails under
#    CI=true and is reported as not run otherwise.
#
# Python: python3 from PATH (3.9 or later), standard library only. Nothing
# is skipped under CI=true; the last line is unittest's summary and PASS.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

name=sdk-python-check
# shellcheck source=scripts/lib/gateway.sh
. scripts/lib/gateway.sh

py=${PYTHON:-python3}
command -v "$py" >/dev/null || die "$py is not installed"
"$py" -c 'import sys; assert sys.version_info >= (3, 9), sys.version' || die "the SDK needs Python 3.9 or later"
say "$("$py" --version)"

if [ "${CI:-}" = true ] && { ! command -v mypy >/dev/null || ! /usr/bin/python3 -c 'import setuptools, wheel' 2>/dev/null; }; then
  # Debian's mypy (type check) and setuptools+wheel (the offline wheel build).
  say "apt-get install mypy python3-setuptools python3-wheel"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mypy python3-setuptools python3-wheel >/dev/null
fi

say "mypy --strict (Python 3.9 rules): sdk/python/src"
if command -v mypy >/dev/null; then
  (cd sdk/python && mypy --strict --python-version 3.9 src/fencegw &&
    mypy --python-version 3.9 --ignore-missing-imports tests ../../examples/py-worker) || die "mypy found type errors"
elif [ "${CI:-}" = true ]; then
  die "mypy is not installed"
else
  say "mypy NOT run: not installed (CI=true installs Debian's)"
fi

build_gateway
export FENCEGW_BIN=$tmp/fencegw

say "unittest: sdk/python/tests (against $FENCEGW_BIN)"
logs+=(unittest.log)
rc=0
(cd sdk/python && PYTHONPATH=src:tests timeout --kill-after=10 600 "$py" -m unittest discover -s tests -v) \
  >"$tmp/unittest.log" 2>&1 || rc=$?
grep -E '^(test_|Ran |OK|FAILED)' "$tmp/unittest.log" | grep -v '^test_.* ok$' || true
say "conformance tests passed: $(grep -cE '^test_C[0-9]+.* ok$' "$tmp/unittest.log" || true) (sdk/CONFORMANCE.md)"
[ "$rc" -eq 0 ] || { tail -n 80 "$tmp/unittest.log" >&2; die "the SDK's tests failed"; }
summary=$(grep -E '^Ran [0-9]+ tests' "$tmp/unittest.log" | tail -n 1)

say "examples/py-worker/broken_lock.py"
start_upstream "$py" examples/py-worker/upstream.py
start_gateway --shutdown-delay 0
(cd examples/py-worker && PYTHONPATH=$root/sdk/python/src FENCEGW_URL=$gateway_url UPSTREAM_URL=$upstream_url \
  timeout --kill-after=5 120 "$py" broken_lock.py) || die "broken_lock.py failed"

say "wheel (offline: pip wheel --no-deps --no-build-isolation --no-index)"
# The build needs setuptools and wheel in the building interpreter: $py's,
# or else Debian's python3 (python3-setuptools, python3-wheel).
wheel_py=
for cand in "$py" /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import setuptools, wheel' 2>/dev/null; then wheel_py=$cand; break; fi
done
if [ -n "$wheel_py" ]; then
  cp -r sdk/python "$tmp/src"  # build/ and *.egg-info land there, not in the tree
  timeout 300 "$wheel_py" -m pip wheel --no-deps --no-build-isolation --no-index -q -w "$tmp/dist" "$tmp/src" ||
    die "the wheel did not build"
  whl=$(ls "$tmp"/dist/fencegw-*.whl)
  listing=$("$py" -m zipfile -l "$whl") || die "$whl is not a zip file"
  case $listing in *fencegw/py.typed*) ;; *) die "$whl lacks py.typed" ;; esac
  (cd "$tmp" && PYTHONPATH=$whl "$py" -c 'import fencegw; print("imported fencegw", fencegw.__version__, "from the wheel")') ||
    die "the wheel does not import"
  say "built $(basename "$whl") with $("$wheel_py" --version) (setuptools $("$wheel_py" -c 'import setuptools; print(setuptools.__version__)'))"
elif [ "${CI:-}" = true ]; then
  die "no python3 with setuptools and wheel: the wheel cannot be built offline (apt-get install python3-setuptools python3-wheel)"
else
  say "wheel NOT built: no python3 with setuptools and wheel (CI=true makes this fail)"
fi

say "$summary, OK; broken_lock.py passed"
say "PASS"
