"""A running Jupyter kernel: the sunroom process handle plus its jupyter-client manager and client.

:class:`JupyterProcess` implements :class:`~sunroom.sandbox.backend.KernelProcess` by
delegating to the sandbox's handle (the supervisor's process tree), and declares
:meth:`~JupyterProcess.execute_cell`, which :class:`~sunroom.sandbox.kernel.AsyncKernel` uses
instead of the channel's ``execute``: the cell goes to the kernel as an ``execute_request`` and
its messages come back as sunroom's execute result (:mod:`.results`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, final

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from sunroom.rpc.channel import cut
from sunroom.sandbox.backend import KernelProcess, KernelProcessBase
from sunroom.sandbox.backends.jupyter import messages
from sunroom.sandbox.backends.jupyter.results import CellMessages, OutputCallback
from sunroom.sandbox.process import SupervisedProcess

log = logging.getLogger(__name__)


@final
class JupyterProcess(KernelProcessBase):
    """One Jupyter kernel's process tree (*inner*) and the manager and client that drive it."""

    def __init__(
        self,
        inner: KernelProcess,
        manager: AsyncKernelManager,
        client: AsyncKernelClient,
        *,
        kernel_name: str,
        python: bool,
        info: dict[str, Any],
    ) -> None:
        self.inner = inner
        self.manager = manager
        self.client = client
        self.kernel_name = kernel_name
        self.python = python
        """Whether the kernel runs sunroom's extension (host functions, inputs)."""
        self.info = info
        """The kernel's ``kernel_info_reply`` content (language, implementation, banner)."""
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The sandbox's supervisor pid (host namespace) when it is a local process tree."""
        return self.inner.pid if isinstance(self.inner, SupervisedProcess) else None

    @property
    def rundir(self) -> Path | None:
        """The sandbox's run directory on the host when it is a local process tree."""
        return self.inner.rundir if isinstance(self.inner, SupervisedProcess) else None

    # -- KernelProcess -------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """The kernel's working directory as the host sees it."""
        return self.inner.workdir

    @property
    def host_pid(self) -> int | None:
        """The kernel's pid in the host's PID namespace, when the sandbox knows it."""
        return self.inner.host_pid

    def adopt(self, kernel_pid: int) -> None:
        """Record the kernel's pid from its hello (the extension's, or the keeper's for it)."""
        self.inner.adopt(kernel_pid)

    def interrupt(self) -> None:
        """SIGINT to the kernel, from outside the sandbox (Jupyter's ``signal`` interrupt mode)."""
        self.inner.interrupt()

    def alive(self) -> bool:
        """Whether the kernel's process tree still runs."""
        return self.inner.alive()

    async def kill(self) -> None:
        """Kill the tree, then close the client's and the manager's sockets. Idempotent."""
        try:
            await self.inner.kill()
        finally:
            if not self._closed:
                self._closed = True
                self.client.stop_channels()
                await self.manager.cleanup_resources(restart=False)

    async def exit_reason(self) -> str:
        """How the kernel ended, for humans."""
        return await self.inner.exit_reason()

    async def log_tail(self) -> str:
        """The kernel's early stderr (its log), when the sandbox keeps one."""
        return await self.inner.log_tail()

    # -- cells ---------------------------------------------------------------------------------

    def execute_cell(
        self,
        code: str,
        *,
        max_output_bytes: int,
        max_display_bytes: int,
        on_output: OutputCallback | None,
        closed: asyncio.Future[None],
    ) -> asyncio.Future[object]:
        """Send *code* as an ``execute_request``; the future gets the execute result dict.

        The future fails with ConnectionError when *closed* (the kernel's sunroom channel)
        completes first: the kernel died. Whoever completes the future early (the cell's
        clock giving up) stops the collection.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[object] = loop.create_future()
        cell = CellMessages(
            max_output_bytes=max_output_bytes,
            max_display_bytes=max_display_bytes,
            on_output=on_output,
        )
        started = time.perf_counter()
        task = loop.create_task(self._run(code, cell), name="sunroom-jupyter-cell")

        def finish(_: object) -> None:
            if done.done():
                return
            if task.done():
                if task.cancelled():
                    done.set_exception(ConnectionError("the Jupyter cell was abandoned"))
                elif task.exception() is not None:
                    done.set_exception(task.exception())  # type: ignore[arg-type]
                else:
                    done.set_result(cell.result(time.perf_counter() - started))
            else:
                done.set_exception(ConnectionError("the Jupyter kernel's channel closed"))

        def abandon(_: object) -> None:
            task.cancel()
            closed.remove_done_callback(finish)

        task.add_done_callback(finish)
        closed.add_done_callback(finish)
        done.add_done_callback(abandon)
        return done

    async def _run(self, code: str, cell: CellMessages) -> None:
        """Send the cell and collect its messages until its ``execute_reply``.

        The IOPub messages whose parent is the cell's request go to *cell* until the kernel
        reports itself idle; then the shell channel's ``execute_reply`` to the request ends
        the cell. Frames that are not a well-formed message (:func:`messages.parse`) are
        ignored and counted; nothing the kernel sends makes this raise.
        """
        client = self.client
        session = client.session
        msg_id: str = client.execute(
            code, silent=False, store_history=True, allow_stdin=False, stop_on_error=False
        )
        try:
            while True:
                msg = await messages.receive(client.iopub_channel.socket, session, None)
                if msg is None:
                    cell.ignored += 1
                    continue
                if msg.parent_id != msg_id:
                    continue  # another request's (an abandoned cell's, kernel_info's)
                if msg.msg_type == "status":
                    state = msg.content.get("execution_state")
                    if state == "idle":
                        break
                    if type(state) is not str:
                        cell.ignored += 1
                    continue
                try:
                    cell.add(msg)
                except Exception:  # a bug here, not the kernel's doing: said, and the cell goes on
                    log.exception("a Jupyter %s message could not be taken", cut(msg.msg_type, 40))
                    cell.ignored += 1
            while True:
                reply = await messages.receive(client.shell_channel.socket, session, None)
                if reply is None:
                    cell.ignored += 1
                elif reply.parent_id == msg_id and reply.msg_type == "execute_reply":
                    cell.reply(reply.content)
                    return
        finally:
            if cell.ignored:
                log.warning(
                    "the Jupyter kernel %r sent %d messages during a cell that did not fit the "
                    "Jupyter protocol; they were ignored",
                    self.kernel_name,
                    cell.ignored,
                )


async def close_quietly(manager: AsyncKernelManager, client: AsyncKernelClient | None) -> None:
    """Close a manager (and client) whose kernel never became a :class:`JupyterProcess`."""
    if client is not None:
        client.stop_channels()
    try:
        await manager.cleanup_resources(restart=False)
    except Exception:  # the start's own error is the one to report
        log.exception("closing a Jupyter kernel manager after a failed start failed")
