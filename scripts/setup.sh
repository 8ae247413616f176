#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install sunroom with its test and provider extras.
set -euo pipefail
cd "$(dirname "$0")/.."
# As root, every kernel runs as its own unprivileged uid and must be able to read the interpreter
# (and this checkout): prefer an interpreter other users can reach (not one under /root).
root=0; [ "$(id -u)" = 0 ] && root=1
usable() {
  command -v "$1" >/dev/null 2>&1 \
    && "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    && { [ "$root" = 0 ] || "$1" scripts/reachable.py >/dev/null; }
}
if [ -x .venv/bin/python ] && [ "$root" = 1 ] && ! .venv/bin/python scripts/reachable.py >/dev/null; then
  echo "setup: recreating .venv: $(.venv/bin/python scripts/reachable.py) (kernels run as unprivileged uids)"
  rm -rf .venv
fi
PY="${PYTHON:-}"
if [ -z "$PY" ] && [ ! -x .venv/bin/python ]; then
  for cand in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11 python3 /usr/bin/python3 \
      python3.12 python3.13; do
    if usable "$cand"; then PY="$cand"; break; fi
  done
  [ -n "$PY" ] || { echo "setup: need Python >= 3.11 with venv$([ "$root" = 1 ] && echo ", \
installed where other users can read it (sunroom runs kernels as unprivileged uids when root)") \
(set PYTHON=/path/to/python3.11)" >&2; exit 1; }
fi
if [ "$root" = 1 ] && ! why=$("${PY:-.venv/bin/python}" scripts/reachable.py "$PWD"); then
  echo "setup: warning: $why; kernels (which run as unprivileged uids when sunroom runs as root)" \
    "cannot read this checkout: move it elsewhere (e.g. /opt or /srv) or make its parents o+x" >&2
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" -c 'import sys; print(sys.executable)')"
  "$PY" -m venv .venv
fi
# Skip pip when nothing it depends on changed since the last successful install.
stamp="$(cat pyproject.toml; .venv/bin/python -VV)"
stamp="$(printf '%s' "$stamp" | sha256sum | cut -d' ' -f1)"
if [ "$(cat .venv/.sunroom-stamp 2>/dev/null)" != "$stamp" ] \
    || ! .venv/bin/python -c 'import sunroom, msgpack, pydantic, psutil, pytest' 2>/dev/null; then
  echo "setup: installing sunroom and its dependencies into .venv (log: .venv/pip.log)"
  (
    .venv/bin/python -m pip install -q --upgrade pip \
      && .venv/bin/python -m pip install -q -e '.[dev,providers]'
  ) >.venv/pip.log 2>&1 &
  pip_pid=$!
  waited=0
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 10)) = 0 ]; then echo "setup: still installing (${waited} s)"; fi
  done
  wait "$pip_pid" || { cat .venv/pip.log >&2; echo "setup: pip install failed" >&2; exit 1; }
  .venv/bin/python -c 'import sunroom, msgpack, pydantic, psutil, pytest' \
    || { echo "setup: installation failed" >&2; exit 1; }
  echo "$stamp" >.venv/.sunroom-stamp
fi
# the bash Jupyter kernel (dev extra) registers its kernelspec inside .venv, where sunroom finds it
if .venv/bin/python -c 'import bash_kernel' 2>/dev/null \
    && [ ! -f .venv/share/jupyter/kernels/bash/kernel.json ]; then
  .venv/bin/python -m bash_kernel.install --sys-prefix >/dev/null
fi
# the kernels' compiled watcher and launcher (sunroom/prelude/watch.c, launch.c; docs/design.md,
# "The watcher", "The launcher"): where no C compiler exists yet, kernels watch in Python and
# start through setpriv, and scripts/system-setup.sh builds them later
.venv/bin/sunroom build-helpers || true
# precompile: isolated kernels mount the package read-only and cannot write .pyc files
.venv/bin/python -m compileall -q sunroom >/dev/null
