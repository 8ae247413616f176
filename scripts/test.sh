#!/usr/bin/env bash
# Set everything up, then run the whole test suite (the command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/system-setup.sh
# the real embedding model the tests use (fetched once, cached under .venv)
bash scripts/test-models.sh
# the real wheels the packages tests install into kernels (downloaded once, never installed)
bash scripts/test-wheels.sh
# Gates before any test: lint, formatting and strict types (package and tests); any finding fails.
echo "test.sh: ruff check, ruff format --check, mypy --strict (sunroom, tests)"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy --no-error-summary sunroom tests
set +e
.venv/bin/python -m pytest -q "$@"
code=$?
set -e
# pytest exits 5 when no test was collected: that is a failure here, never a pass
if [ "$code" -eq 5 ]; then echo "test.sh: no tests were collected" >&2; exit 1; fi
exit "$code"
