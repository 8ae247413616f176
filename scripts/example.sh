#!/usr/bin/env bash
# Set everything up, then run the quickstart (default backend bwrap): a kernel with a typed host function that keeps
# state across cells and recovers from a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SUNROOM_SETUP_DOCKER=0 bash scripts/system-setup.sh   # bubblewrap + libseccomp for the default backend
exec .venv/bin/python examples/quickstart.py "$@"
