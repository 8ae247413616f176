"""A child process of the host, reaped through its pidfd on the event loop: no watcher thread.

asyncio's ``create_subprocess_exec`` (Python 3.11) watches every child with a thread of its
own (``ThreadedChildWatcher``): ``start`` waits until that thread runs, which cost each kernel
start ~2.3 ms of its ~2.5 ms spawn on the 2-core VM, and a host with 1,000 kernels held 1,000
such threads. :func:`spawn` starts the process with ``subprocess.Popen`` (which vforks the
host unless a user or group is asked for) and the loop reaps it when its pidfd becomes
readable. Where ``pidfd_open`` is missing (Linux before 5.3) a thread waits instead, as
asyncio's would.

The child is reaped only through :class:`Child` (``waitpid`` of its own pid), never by a
``Popen`` method: call none on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import threading
from typing import Any, final

log = logging.getLogger(__name__)


@final
class Child:
    """One started child: its pid, a pidfd naming it, and its exit once the loop reaped it."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.pid = popen.pid
        self._popen = popen  # kept so that its __del__ sees a return code, never reaps
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self.pidfd: int | None
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:  # no pidfd_open here: wait in a thread, as asyncio would
            self.pidfd = None
            threading.Thread(
                target=self._wait_blocking, name=f"sunroom-wait-{self.pid}", daemon=True
            ).start()
        else:
            loop.add_reader(self.pidfd, self._reap)

    @property
    def returncode(self) -> int | None:
        """The exit code (``-N`` for signal N) once reaped; None while it runs."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait until the child has exited and been reaped; its return code."""
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """Close the pidfd, once the child is reaped (the owner's teardown). Idempotent."""
        if self.pidfd is not None and self._popen.returncode is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (a waitpid(-1) of the application)
            log.warning("child %d was reaped by someone else; its exit status is lost", self.pid)
            self._exit(255)
            return
        if pid != 0:
            self._exit(os.waitstatus_to_exitcode(status))

    def _exit(self, code: int) -> None:
        if self.pidfd is not None:
            self._loop.remove_reader(self.pidfd)
        self._popen.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)

    def _wait_blocking(self) -> None:
        try:
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = 255
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._exit, code)


def spawn(argv: list[str], **popen_kwargs: Any) -> Child:
    """Start *argv* with ``subprocess.Popen(argv, **popen_kwargs)``; raises what Popen raises.

    Call on the event loop that is to reap the child.
    """
    loop = asyncio.get_running_loop()
    popen: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen_kwargs)  # noqa: S603
    return Child(popen, loop)
