#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install sunroom with its test and provider extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3 python3.12 python3.13; do
    if command -v "$cand" >/dev/null 2>&1 \
      && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: need Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >.venv/pip.log 2>&1 || { cat .venv/pip.log; exit 1; }
.venv/bin/python -m pip install -q -e '.[dev,providers]' >>.venv/pip.log 2>&1 \
  || { cat .venv/pip.log >&2; echo "setup: pip install failed" >&2; exit 1; }
# precompile: isolated kernels mount the package read-only and cannot write .pyc files
.venv/bin/python -m compileall -q sunroom >/dev/null
.venv/bin/python -c 'import sunroom, msgpack, pydantic, psutil, pytest' \
  || { echo "setup: installation failed" >&2; exit 1; }
