"""The docker watchdog: removes its owner's kernel containers the moment the owner dies.

It runs **on the host**, not in a container: :func:`sunroom.sandbox.backends.docker_janitor.
_start_watchdog` spawns it once per host process as ``python -I <this file> LABEL VALUE ...``
in a session of its own, with the read end of a pipe as its stdin. Only the owner holds the
write end, so ``read`` returns at EOF when the owner exits, crashes or is killed (``kill -9``
included); the watchdog then force-removes every container labelled ``sunroom.kernel=1`` plus
the given owner labels (pid, start time, host name), and exits.

Run by path with ``-I`` (no script directory on ``sys.path``), it imports only the standard
library and the Docker SDK, never the rest of sunroom: it must stay small while it waits for
as long as its owner lives. It uses the ``DOCKER_*`` environment, like ``docker.from_env``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Final

LABEL_KERNEL: Final = "sunroom.kernel=1"


def labels_from(argv: Sequence[str]) -> list[str]:
    """The label filters for *argv* (``LABEL VALUE`` pairs): the kernel label first.

    Raises ValueError for an odd number of arguments or none (it would match every kernel).
    """
    if not argv or len(argv) % 2:
        raise ValueError("the watchdog needs LABEL VALUE pairs naming its owner")
    pairs = zip(argv[0::2], argv[1::2], strict=True)
    return [LABEL_KERNEL, *(f"{key}={value}" for key, value in pairs)]


def wait_for_owner(fd: int = 0) -> None:
    """Block until the owner's end of the pipe on *fd* is closed (it exited or was killed)."""
    while os.read(fd, 4096):
        pass  # the owner never writes; if it did, keep waiting for EOF


def remove_containers(labels: Sequence[str]) -> list[str]:
    """Force-remove every container (and its volumes) carrying all *labels*; the ids removed.

    A container that cannot be removed (already gone, the daemon refused) is left to the next
    sweep, which finds it by the same labels; its error is written to stderr. An unreachable
    daemon raises the SDK's error.
    """
    import docker  # the SDK: on the host only, imported once the owner is gone

    client = docker.DockerClient.from_env()
    removed: list[str] = []
    try:
        for row in client.api.containers(all=True, filters={"label": list(labels)}):
            try:
                client.api.remove_container(row["Id"], force=True, v=True)
            except docker.errors.APIError as exc:
                print(f"sunroom watchdog: cannot remove {row['Id'][:12]}: {exc}", file=sys.stderr)
            else:
                removed.append(row["Id"])
    finally:
        client.close()
    return removed


def main(argv: Sequence[str]) -> int:
    """Wait for the owner on stdin, then remove its containers; the exit status."""
    labels = labels_from(argv)
    wait_for_owner(0)
    remove_containers(labels)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
