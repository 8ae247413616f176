"""Docker kernel containers never outlive their owner: labels, the sweep and the watchdog.

Every kernel container is labelled with ``sunroom.kernel=1`` and its owner's host name, pid and
start time. :func:`sweep_stale` removes this host's labelled containers whose owner is gone (a
crashed host), once per process on the first launch; the watchdog (:func:`_start_watchdog`)
removes a live process's containers the moment it dies, ``kill -9`` included; it is the module
:mod:`.docker_watchdog`, run on the host (it needs the Docker SDK, so it is not kernel code).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import psutil

from sunroom.sandbox.backend import SAFE_PATH

if TYPE_CHECKING:
    import docker

LABEL_KERNEL: Final = "sunroom.kernel"
LABEL_OWNER_PID: Final = "sunroom.owner_pid"
LABEL_OWNER_STARTED: Final = "sunroom.owner_started"
LABEL_HOST: Final = "sunroom.host"


_sweep_lock = threading.Lock()
_swept = False


def _hostname() -> str:
    return socket.gethostname()


def _started(pid: int) -> str:
    """A process's start time as recorded in labels (tells a live owner from a reused pid)."""
    return f"{psutil.Process(pid).create_time():.2f}"


def _owner_alive(labels: Mapping[str, str]) -> bool:
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
        return _started(pid) == labels.get(LABEL_OWNER_STARTED)
    except (ValueError, psutil.Error):
        return False


def sweep_stale(client: docker.DockerClient) -> list[str]:
    """Remove this host's sunroom kernel containers whose owner process is gone.

    A container is stale when it carries ``sunroom.kernel=1`` and this host's name, and the
    process named by ``sunroom.owner_pid`` is not running with the recorded start time (a host
    that crashed or was killed). Containers of other hosts sharing the daemon are left alone.
    Returns the ids removed. Errors removing one container are ignored (it is retried at the
    next sweep); an unreachable daemon raises the SDK's error.
    """
    import docker  # the backend checked it is installed

    errors = docker.errors
    removed: list[str] = []
    found = client.api.containers(
        all=True, filters={"label": [f"{LABEL_KERNEL}=1", f"{LABEL_HOST}={_hostname()}"]}
    )
    for row in found:
        if _owner_alive(row.get("Labels") or {}):
            continue
        with contextlib.suppress(errors.APIError):
            client.api.remove_container(row["Id"], force=True, v=True)
            removed.append(row["Id"])
    return removed


WATCHDOG: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docker_watchdog.py")
"""The watchdog module (:mod:`.docker_watchdog`), run by path on the host, one per process."""

_watchdog_for: int | None = None
_watchdog_fd: int | None = None


def _start_watchdog() -> None:
    """Start (once per process) the helper that removes this process's containers at its death.

    A host that dies while a kernel is busy in a long cell would otherwise leave the container
    running until the next sweep: nothing in a container learns of its owner's death by itself.
    The helper (:mod:`.docker_watchdog`, run on the host as ``python -I <its file>``) is a
    separate session blocked on a pipe whose write end only this process holds (close-on-exec,
    so kernels and subprocesses do not inherit it); at EOF it force-removes the containers
    labelled with this process's pid, start time and hostname, then exits. It uses the
    ``DOCKER_*`` environment, like ``docker.from_env``.
    """
    global _watchdog_for, _watchdog_fd
    me = os.getpid()
    if _watchdog_for == me:
        return
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k.startswith("DOCKER_")}
    env["PATH"] = SAFE_PATH
    labels = [LABEL_OWNER_PID, str(me), LABEL_OWNER_STARTED, _started(me), LABEL_HOST, _hostname()]
    try:
        os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", WATCHDOG, *labels],
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
            setsid=True,
        )
    finally:
        os.close(read_end)
    if _watchdog_fd is not None:  # a forked child: the parent's pipe belongs to the parent
        with contextlib.suppress(OSError):
            os.close(_watchdog_fd)
    _watchdog_for, _watchdog_fd = me, write_end


def sweep_once(client: docker.DockerClient) -> None:
    """Sweep stale containers once per process, and make sure this process has a watchdog."""
    global _swept
    with _sweep_lock:
        if not _swept:
            sweep_stale(client)
            _swept = True
        _start_watchdog()
