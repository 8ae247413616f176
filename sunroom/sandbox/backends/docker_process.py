"""The handle on one docker kernel: interrupt, kill (force-remove) and exit classification."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

from sunroom.errors import KernelError
from sunroom.sandbox.backend import KernelProcessBase
from sunroom.sandbox.identity import Identity, IdentityLease
from sunroom.sandbox.process import Companion, close_companions
from sunroom.sandbox.rundirs import remove_tree

if TYPE_CHECKING:
    import docker

_SIGNAL_NAMES: Final = {s.value: s.name for s in signal.Signals}


def _logs(client: docker.DockerClient, cid: str, tail: int = 40) -> str:
    """The tail of a container's output, formatted for an error message ('' if none)."""
    try:
        raw = client.api.logs(cid, stdout=True, stderr=True, tail=tail)
    except Exception:
        return ""
    text = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else ""
    return f"\n--- container log ---\n{text}" if text else ""


REMOVE_ATTEMPTS = 3
"""How many times :func:`_remove` asks for a container that stopped during its removal."""


def _stopped_while_removed(exc: docker.errors.APIError) -> bool:
    """Whether *exc* is the daemon's race with a container that stopped during its removal.

    A forced removal kills the container first; when the container stops between the daemon's
    look and its kill, the daemon answers 500 "Could not kill running container ..., cannot
    remove - Container ... is not running" (seen with Docker 20.10), though the container is
    stopped and a second removal succeeds.
    """
    return "is not running" in str(exc.explanation or "")


def _remove(client: docker.DockerClient, cid: str) -> None:
    """Force-remove a container (SIGKILL, then remove); a container already gone is fine.

    A removal the daemon refuses because the container stopped meanwhile is asked again, up to
    :data:`REMOVE_ATTEMPTS` times in all; any other error is raised.
    """
    import docker  # the backend checked it is installed

    errors = docker.errors
    for attempt in range(1, REMOVE_ATTEMPTS + 1):
        try:
            client.api.remove_container(cid, force=True, v=True)
        except errors.NotFound:
            return
        except errors.APIError as exc:
            if exc.status_code == 409:  # removal already in progress
                return
            if attempt < REMOVE_ATTEMPTS and _stopped_while_removed(exc):
                time.sleep(0.05 * attempt)  # the daemon finishes recording the stop
                continue
            raise
        return


@final
class DockerKernelProcess(KernelProcessBase):
    """Handle on one kernel container; implements ``KernelProcess``.

    ``kill()`` force-removes the container and closes the client when this handle owns it.
    """

    def __init__(
        self,
        *,
        client: docker.DockerClient,
        owns_client: bool,
        container_id: str,
        name: str,
        pid: int,
        workdir: Path,
        memory_mb: int,
        identity: Identity,
        lease: IdentityLease | None = None,
    ) -> None:
        self._client = client
        self.identity = identity
        """The host uid/gid the container's processes run as."""
        self._lease = lease
        self._owns_client = owns_client
        self.container_id = container_id
        self.name = name
        self._pid = pid
        self._workdir = workdir
        self._memory_mb = memory_mb
        self._kernel_pid: int | None = None
        self._killed = False
        self._teardown: asyncio.Task[None] | None = None
        self._state: dict[str, Any] | None = None
        self._interrupts: list[threading.Thread] = []
        self.ipc_dir: Path | None = None
        """A foreign kernel program's IPC directory as the host sees it (``ExecSpec``); its
        parent run dir is removed with the container."""
        self.net_dir: Path | None = None
        """The kernel's network directory (its egress proxy's socket), removed with it."""
        self.companions: list[Companion] = []
        """Host resources that live as long as the container (its egress proxy)."""

    @property
    def pid(self) -> int:
        """The host pid of the container's PID 1, the supervisor (0 if it had already exited)."""
        return self._pid

    @property
    def workdir(self) -> Path:
        """A placeholder host path that does not exist.

        The kernel's workdir lives in the container's tmpfs at ``/work`` and is gone with the
        container; the host cannot see it.
        """
        return self._workdir

    @property
    def kernel_pid(self) -> int | None:
        """The runtime's pid inside the container, from its hello."""
        return self._kernel_pid

    def adopt(self, kernel_pid: int) -> None:
        """Record the runtime's pid (container namespace); signals go through the daemon."""
        self._kernel_pid = kernel_pid

    def interrupt(self) -> None:
        """SIGINT the container's supervisor, which relays it to the runtime. Does not block.

        The request runs in a daemon thread; failures (a container already gone) are ignored.
        """
        if self._killed:
            return
        self._interrupts = [t for t in self._interrupts if t.is_alive()]
        thread = threading.Thread(target=self._send_sigint, name="sunroom-docker-sigint")
        thread.daemon = True
        self._interrupts.append(thread)
        thread.start()

    def _send_sigint(self) -> None:
        with contextlib.suppress(Exception):
            self._client.api.kill(self.container_id, signal="SIGINT")

    def alive(self) -> bool:
        """Whether the container is still running (asks the daemon: blocks briefly)."""
        if self._killed:
            return False
        try:
            info = self._client.api.inspect_container(self.container_id)
        except Exception:
            return False
        return bool((info.get("State") or {}).get("Running"))

    async def kill(self) -> None:
        """Force-remove the container (SIGKILL, then remove); close an owned client. Idempotent.

        Raises KernelError only if the daemon refuses the removal (the container is then
        removed by the next process's sweep). Cancellation-safe: the removal runs to its end in
        a task of its own, and every call (a repeat after a cancellation too) waits for it.
        """
        self._killed = True
        if self._teardown is None:
            self._teardown = asyncio.get_running_loop().create_task(
                self._remove_container(), name=f"sunroom-remove-{self.name}"
            )
        await asyncio.shield(self._teardown)

    async def _remove_container(self) -> None:
        try:
            await asyncio.to_thread(self._kill_sync)
        except Exception as exc:
            raise KernelError(
                f"could not remove kernel container {self.name}: {exc}; it will be removed by "
                "the next sweep"
            ) from exc
        else:
            if self._lease is not None:
                self._lease.release()  # the container and all its processes are gone
            if self.ipc_dir is not None:
                await asyncio.to_thread(remove_tree, self.ipc_dir.parent)
        finally:
            await close_companions(self.companions)
            if self.net_dir is not None:
                await asyncio.to_thread(remove_tree, self.net_dir.parent)
            if self._owns_client:
                self._client.close()

    def _kill_sync(self) -> None:
        for thread in self._interrupts:
            thread.join(2.0)
        if self._state is None:
            with contextlib.suppress(Exception):
                state = self._client.api.inspect_container(self.container_id).get("State") or {}
                if not state.get("Running"):
                    self._state = state
        _remove(self._client, self.container_id)

    def _wait_state(self) -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            self._client.api.wait(self.container_id, timeout=5)
        with contextlib.suppress(Exception):
            state: dict[str, Any] = (
                self._client.api.inspect_container(self.container_id).get("State") or {}
            )
            if not state.get("Running"):
                return state
        return None

    async def exit_reason(self) -> str:
        """Classify the death from the container's state: out of memory, a signal, a status."""
        if self._state is None and not self._killed:
            self._state = await asyncio.to_thread(self._wait_state)
        state = self._state
        if state is None:
            return "the kernel's connection closed; its container's exit status is unknown"
        if state.get("OOMKilled"):
            return f"the kernel ran out of memory (limit {self._memory_mb} MB) and was killed"
        code = int(state.get("ExitCode") or 0)
        if code > 128:
            num = code - 128
            name = _SIGNAL_NAMES.get(num, str(num))
            if num == signal.SIGKILL:
                return f"the kernel was killed by {name} (possibly out of memory)"
            return f"the kernel died from signal {name}"
        return f"the kernel process exited with status {code}"
