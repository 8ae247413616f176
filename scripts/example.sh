#!/usr/bin/env bash
# Set everything up, then run the quickstart: a kernel with a typed host function that keeps
# state across cells and recovers from a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart.py
