#!/usr/bin/env bash
# Make the `docker` kernel backend usable on this machine, offline. Idempotent; CI runs it.
#
#   1. installs docker.io with apt if `dockerd` is missing;
#   2. starts dockerd in the background if no daemon answers (log: /tmp/dockerd.log), and waits
#      up to 60 s for `docker info` to work, failing loudly otherwise;
#   3. builds the offline kernel image (default tag sunroom-kernel:offline) with no registry:
#      `docker import` of a tiny rootfs holding only /etc/passwd and /etc/group (the kernel user
#      `sunroom`, uid/gid 1000, and `nobody`; no root entry), /etc/nsswitch.conf, the empty
#      mount points the backend binds into and the host's merged-/usr symlinks. It holds no
#      Python: at run time the backend bind-mounts the host's /usr, the interpreter prefix and
#      the kernel's code read-only (see docs/docker.md). Rebuilt only when its content changes
#      (label sunroom.rootfs).
#
# Environment: SUNROOM_OFFLINE_IMAGE overrides the tag; DOCKERD_FLAGS adds daemon flags.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${SUNROOM_OFFLINE_IMAGE:-sunroom-kernel:offline}"
LOG=/tmp/dockerd.log

say() { echo "docker-setup: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# -- 1. the engine ------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "dockerd is missing and installing it needs root (apt-get install docker.io)"
  say "installing docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq docker.io >/dev/null
fi
command -v docker >/dev/null 2>&1 || die "the docker CLI is missing (apt-get install docker.io)"

# -- 2. the daemon ------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "no Docker daemon answers and starting one needs root"
  say "starting dockerd (log: $LOG)"
  # Defaults work here (Debian 12, cgroup v1, ext4 root: overlay2, cgroupfs driver). A daemon
  # that cannot set up iptables or a bridge (some nested sandboxes) can be started with
  # DOCKERD_FLAGS="--iptables=false --bridge=none": kernels use --network none anyway.
  # shellcheck disable=SC2086
  setsid nohup dockerd ${DOCKERD_FLAGS:-} >"$LOG" 2>&1 </dev/null &
  ok=0
  for _ in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  if [ "$ok" -ne 1 ]; then
    say "dockerd did not answer within 60 s; last lines of $LOG:"
    tail -n 30 "$LOG" >&2 || true
    die "no Docker daemon"
  fi
fi
say "daemon: $(docker info --format '{{.ServerVersion}} storage={{.Driver}} cgroup={{.CgroupVersion}}')"

# -- 3. the offline kernel image ----------------------------------------------------------------
# the offline kernel image: one implementation, the package's (sunroom docker-image)
[ -x .venv/bin/sunroom ] || bash scripts/setup.sh
say "$(.venv/bin/sunroom docker-image --tag "$TAG")"
docker image inspect "$TAG" >/dev/null || die "image $TAG was not built"
say "ready: image $TAG"
