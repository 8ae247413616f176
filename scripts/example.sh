#!/usr/bin/env bash
# The main job. Sets everything up (venv, bubblewrap + libseccomp for the default sandbox), then:
#   - with SUNROOM_MODEL set (and SUNROOM_BASE_URL for a local server): runs an example agent
#     session live in the terminal;
#   - otherwise: starts the HTTP/SSE service on 127.0.0.1:8765 and prints its token.
# `bash scripts/example.sh quickstart` runs the kernel quickstart (no model, no service).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SUNROOM_SETUP_DOCKER=0 bash scripts/system-setup.sh
if [ "${1:-}" = quickstart ]; then
  shift
  exec .venv/bin/python examples/quickstart.py "$@"
elif [ -n "${SUNROOM_MODEL:-}" ]; then
  exec .venv/bin/sunroom run "What is the 20th Fibonacci number? Compute it in Python." "$@"
else
  exec .venv/bin/sunroom serve "$@"
fi
