#!/usr/bin/env bash
# Set everything up, then run the test suite (the command CI runs). docs/testing.md has the lanes.
#   bash scripts/test.sh            every test: a parallel pass (pytest-xdist), then the serial tests
#   bash scripts/test.sh --fast     the fast lane only: tests that start no kernel (-m "not kernel"),
#                                   on 2 workers (most of them want a core)
#   bash scripts/test.sh --smoke    the smoke suite only (-m smoke, no gates): the built wheel in
#                                   fresh venvs outside the checkout, the README's front door
#   bash scripts/test.sh ARGS...    pytest ARGS in one pass, not in parallel (e.g. a test file)
# SUNROOM_TEST_WORKERS sets the parallel pass's workers (default 3; 0 runs it in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
smoke=0
if [ "${1:-}" = --fast ]; then fast=1; shift; fi
if [ "${1:-}" = --smoke ]; then smoke=1; shift; fi
bash scripts/setup.sh
bash scripts/system-setup.sh
# the real embedding model the tests use (fetched once, cached under .venv)
bash scripts/test-models.sh
# the real wheels the packages tests install into kernels (downloaded once, never installed)
bash scripts/test-wheels.sh
if [ "$smoke" = 1 ]; then
  echo "test.sh: the smoke suite (-m smoke): the wheel in fresh venvs outside the checkout"
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m smoke "$@"
fi
# Gates before any test: lint, formatting and strict types (package and tests); any finding fails.
echo "test.sh: ruff check, ruff format --check, mypy --strict (sunroom, tests)"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy --no-error-summary sunroom tests

# pytest exits 5 when no test was collected: that is a failure here, never a pass.
# A background job of a non-interactive shell ignores SIGINT, and its children inherit that;
# the tests that send Ctrl-C need the default (otherwise one fails and one skips itself), so
# pytest starts with it restored.
run() {
  set +e
  .venv/bin/python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' .venv/bin/python -m pytest -q "$@"
  local code=$?
  set -e
  return "$code"
}
code=0
if [ "$fast" = 1 ]; then
  echo "test.sh: the fast lane (-m 'not kernel'), 2 workers"
  run -n 2 -m "not kernel" "$@" || code=$?
elif [ "$#" -gt 0 ]; then
  run "$@" || code=$?
else
  workers="${SUNROOM_TEST_WORKERS:-3}"
  echo "test.sh: every test but the serial ones, in parallel ($workers workers)"
  run -n "$workers" --dist load -m "not serial" || code=$?
  echo "test.sh: the serial tests, one at a time"
  serial=0
  run -m serial || serial=$?
  # the parallel pass's failure is reported first; a serial pass that collected nothing is no
  # failure when the parallel one ran tests
  if [ "$code" = 0 ] && [ "$serial" != 5 ]; then code=$serial; fi
fi
if [ "$code" -eq 5 ]; then echo "test.sh: no tests were collected" >&2; exit 1; fi
exit "$code"
