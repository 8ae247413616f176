#!/usr/bin/env bash
# Install the system packages the isolated backends need (bubblewrap, libseccomp), PostgreSQL's
# server binaries (the PostgreSQL store's tests start throwaway clusters of their own), Chromium
# (the web view's browser tests drive it through Playwright; no browser download) and, through
# scripts/docker-setup.sh, Docker with a running daemon and the offline kernel image.
# Needs root and apt-get; elsewhere it says what is missing and leaves the machine alone.
# SUNROOM_SETUP_DOCKER=0 skips Docker.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
ldconfig -p 2>/dev/null | grep -q 'libseccomp.so.2' || need+=(libseccomp2)
# the server binaries live in /usr/lib/postgresql/N/bin (Debian), not on PATH
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 \
  || need+=(postgresql)
[ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1 || need+=(chromium)
# a C compiler and libc's static archive: the kernels' compiled watcher and launcher (sunroom/prelude)
command -v cc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || compgen -G '/usr/lib/*/libc.a' >/dev/null \
  || need+=(libc6-dev)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null; }
  else
    echo "system-setup: missing ${need[*]}; install them (e.g. apt-get install ${need[*]})" >&2
  fi
fi
# the watcher and launcher, now that a compiler is here (scripts/setup.sh builds them too, where it can)
if [ -x .venv/bin/python ]; then
  .venv/bin/sunroom build-helpers \
    || echo "system-setup: kernels will watch in Python (about 2 MB more each) and start through setpriv" >&2
fi
if [ "${SUNROOM_SETUP_DOCKER:-1}" != 0 ] && [ -f scripts/docker-setup.sh ]; then
  bash scripts/docker-setup.sh
fi
