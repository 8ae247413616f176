"""A running Jupyter kernel: the sunroom process handle plus its jupyter-client manager and client.

:class:`JupyterProcess` implements :class:`~sunroom.sandbox.backend.KernelProcess` by
delegating to the sandbox's handle (the supervisor's process tree), and adds
:meth:`~JupyterProcess.execute_cell`, which :class:`~sunroom.sandbox.kernel.AsyncKernel` uses
instead of the channel's ``execute``: the cell goes to the kernel as an ``execute_request`` and
its messages come back as sunroom's execute result (:mod:`sunroom.jupyter.results`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, final

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from sunroom.jupyter.results import CellMessages, OutputCallback
from sunroom.sandbox.backend import KernelProcess

log = logging.getLogger(__name__)


@final
class JupyterProcess:
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

    # -- KernelProcess -------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """The kernel's working directory as the host sees it."""
        return self.inner.workdir

    @property
    def host_pid(self) -> int | None:
        """The kernel's pid in the host's PID namespace, when the sandbox knows it."""
        pid: int | None = getattr(self.inner, "host_pid", None)
        return pid

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
        tail_of = getattr(self.inner, "log_tail", None)
        return "" if tail_of is None else str(await tail_of())

    # -- cells ---------------------------------------------------------------------------------

    def execute_cell(
        self,
        code: str,
        *,
        max_output_bytes: int,
        max_display_bytes: int,
        on_output: OutputCallback | None,
        closed: asyncio.Future[Any],
    ) -> asyncio.Future[dict[str, Any]]:
        """Send *code* as an ``execute_request``; the future gets the execute result dict.

        The future fails with ConnectionError when *closed* (the kernel's sunroom channel)
        completes first: the kernel died. Whoever completes the future early (the cell's
        clock giving up) stops the collection.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[dict[str, Any]] = loop.create_future()
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
        reply = await self.client.execute_interactive(
            code,
            silent=False,
            store_history=True,
            allow_stdin=False,
            stop_on_error=False,
            output_hook=self._hook(cell),
        )
        content = reply.get("content") if isinstance(reply, dict) else None
        cell.reply(content if isinstance(content, dict) else {})

    @staticmethod
    def _hook(cell: CellMessages) -> Any:
        def hook(msg: dict[str, Any]) -> None:
            try:
                cell.add(msg)
            except Exception:  # one malformed message must not end the cell's collection
                log.exception("a Jupyter message could not be read; it was dropped")

        return hook


async def close_quietly(manager: AsyncKernelManager, client: AsyncKernelClient | None) -> None:
    """Close a manager (and client) whose kernel never became a :class:`JupyterProcess`."""
    if client is not None:
        client.stop_channels()
    try:
        await manager.cleanup_resources(restart=False)
    except Exception:  # the start's own error is the one to report
        log.exception("closing a Jupyter kernel manager after a failed start failed")
