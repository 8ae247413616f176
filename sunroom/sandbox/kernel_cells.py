"""Cells: :meth:`~sunroom.sandbox.kernel.AsyncKernel.execute`, its results, timeouts and deaths.

A cell runs under a :class:`~sunroom.sandbox.cellclock.CellClock`: past its timeout it is
interrupted (the state is kept), and a cell that ignores the interrupt costs the kernel, which
is restarted. A kernel that dies, breaks the protocol or fails outside the cell is restarted
too; the result says ``state_lost``. User errors are data in the result, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, cast, final

from sunroom import tracing
from sunroom.errors import ClosedError, KernelError, ProtocolError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RemoteError, cut
from sunroom.rpc.codec import WireError
from sunroom.rpc.shapes import ExecuteReply
from sunroom.sandbox.cellclock import Alarm, CellClock, CellLost
from sunroom.sandbox.kernel_lifecycle import KernelCore
from sunroom.sandbox.kernel_serving import KernelServing
from sunroom.sandbox.result import CellError, DisplayItem, ExecutionResult, Status

if TYPE_CHECKING:
    from sunroom.tracing import Span

Started = asyncio.Future[ExecuteReply] | asyncio.Future[object]
"""A cell's answer to come: the channel's (checked) or a Jupyter kernel's (checked after)."""


@final
class KernelCells:
    """Runs cells one at a time and turns their answers (or the kernel's death) into results."""

    def __init__(self, core: KernelCore, serving: KernelServing) -> None:
        self._core = core
        self._serving = serving
        self._count = 0
        self._alarm: Alarm | None = None  # the cells' clocks', one after another
        self._check_execute = schema.execute_result(
            core.limits.max_output_bytes, core.limits.display_bytes
        )

    async def execute(
        self, code: str, *, timeout_s: float | None = None, filename: str | None = None
    ) -> ExecutionResult:
        """Run *code* as one cell and return its result; user errors are data, never raised.

        *filename* names the code in tracebacks and SyntaxErrors (default ``<cell-N>``; not
        used by Jupyter kernels, which name cells themselves).

        A kernel that breaks the protocol (an answer that is not an execute result, a frame
        over the caps, ...) or fails outside the cell comes back the same way, as a
        ``status="died"`` result giving the reason, and is restarted (``state_lost``). Raises
        ClosedError after close, KernelStartError if a (re)start fails, UsageError for a non-str
        *code* or one over ``Limits.max_code_bytes`` (checked before anything is sent).
        """
        if not isinstance(code, str):
            raise UsageError("code must be a str")
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise UsageError("filename must be a non-empty str")
        core = self._core
        core.limits.check_code(code)
        timeout = core.limits.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise UsageError("timeout_s must be positive")
        async with core.lock:
            self._count += 1
            with tracing.cell_span(
                index=self._count, code_length=len(code), links=core.trace_links
            ) as span:
                if span is not None and tracing.captures_content():
                    tracing.annotate(span, {"sunroom.cell.code": code})
                core.trace_context = tracing.current_context()
                try:
                    result = await self._execute(code, timeout, filename)
                finally:
                    core.trace_context = None
                if span is not None:
                    _record(span, result)
            return result

    async def _execute(self, code: str, limit_s: float, filename: str | None) -> ExecutionResult:
        """Run the cell (the lock held): its result, or the kernel's loss as one."""
        core = self._core
        if core.closed or core.channel is None or core.channel.closed.done():
            await core.ensure()
        assert core.channel is not None
        assert core.proc is not None
        started = time.perf_counter()
        toolset = self._serving.toolset
        if toolset is not None and toolset.pending:
            failed = await self._serving.bind_lazy()
            if failed is not None:
                error = CellError("McpServerError", str(failed), "")
                return ExecutionResult(
                    status="error", error=error, duration_s=time.perf_counter() - started
                )
        params: dict[str, object] = {
            "code": code,
            "max_output_bytes": core.limits.max_output_bytes,
            "max_display_bytes": core.limits.display_bytes,
        }
        if filename is not None:
            params["filename"] = filename
        core.running_cell = True
        try:
            call = self._start_cell(code, params)
            clock = CellClock(
                call, core.proc, limit_s, core.limits.interrupt_grace_s, alarm=self._alarm_for(call)
            )
            core.clock = clock
            try:
                await call  # the clock interrupts the cell, then gives up on it
            except CellLost:
                return await self._after_loss(
                    "timeout",
                    CellError(
                        "TimeoutError",
                        f"the cell ran past its {limit_s:g} s limit and ignored the "
                        "interrupt; the kernel was restarted",
                        "",
                    ),
                    started,
                )
            finally:
                clock.stop()
                core.clock = None
            return self._to_result(call, started, timed_out=clock.interrupted, timeout=limit_s)
        except (ProtocolError, ClosedError, ConnectionError, RemoteError) as exc:
            return await self._after_death(exc, started)
        finally:
            core.running_cell = False

    def _alarm_for(self, call: Started) -> Alarm:
        """The alarm of the cells' clocks on *call*'s loop (a new loop gets a new one)."""
        loop = call.get_loop()
        alarm = self._alarm
        if alarm is None or alarm.loop is not loop:
            if alarm is not None:
                alarm.close()
            alarm = self._alarm = Alarm(loop)
        return alarm

    def _start_cell(self, code: str, params: dict[str, object]) -> Started:
        """Send the cell: over the channel, or as a Jupyter ``execute_request`` (jupyter)."""
        core = self._core
        assert core.channel is not None
        assert core.proc is not None
        execute_cell = core.proc.execute_cell
        if execute_cell is None:
            return core.channel.request("execute", params, check=self._check_execute)
        return execute_cell(
            code,
            max_output_bytes=core.limits.max_output_bytes,
            max_display_bytes=core.limits.display_bytes,
            on_output=core.on_output,
            closed=core.channel.closed,
        )

    def _to_result(
        self,
        call: Started,
        started: float,
        *,
        timed_out: bool = False,
        timeout: float = 0.0,
    ) -> ExecutionResult:
        got = call.result()  # raises if the kernel died
        proc = self._core.proc
        if proc is not None and proc.execute_cell is not None:
            try:  # the channel checks its own answers
                raw = self._check_execute(got)
            except WireError as exc:  # a protocol break, as on the channel: never raised
                raise ProtocolError(f"the Jupyter cell result is malformed: {exc}") from None
        else:
            raw = cast(ExecuteReply, got)  # checked by the channel
        err = raw["error"]
        error = CellError(err["type"], err["message"], err["traceback"]) if err else None
        status: Status = "ok" if error is None else "error"
        if timed_out and error is not None and error.type == "KeyboardInterrupt":
            status = "timeout"
            error = CellError(
                "TimeoutError",
                f"the cell ran past its {timeout:g} s limit and was interrupted "
                "(the kernel's state is kept)",
                error.traceback,
            )
        return ExecutionResult(
            status=status,
            stdout=raw["stdout"],
            stderr=raw["stderr"],
            value=raw["value"],
            error=error,
            duration_s=time.perf_counter() - started,
            truncated_bytes=raw["truncated_bytes"],
            outputs=tuple(DisplayItem(i["data"], i["metadata"]) for i in raw["outputs"]),
            dropped_outputs=raw["dropped_outputs"],
        )

    async def _after_death(self, exc: BaseException, started: float) -> ExecutionResult:
        proc = self._core.proc
        if self._core.closed or proc is None:  # aclose() killed it under the cell: no restart
            raise ClosedError("the kernel was closed while the cell ran") from exc
        if isinstance(exc, ProtocolError):
            reason = f"the kernel broke the protocol ({cut(str(exc), 300)}) and was killed"
            await proc.kill()
        elif isinstance(exc, RemoteError):  # the runtime failed outside the cell: still alive
            failure = f"{cut(exc.error.type, 100)}: {cut(exc.error.message, 300)}"
            reason = f"the kernel failed outside the cell ({failure}) and was killed"
            await proc.kill()
        else:
            reason = await proc.exit_reason()
        # the restart is the result's state_lost, not the reason: whoever reads it says so
        return await self._after_loss("died", CellError("KernelDied", reason, ""), started)

    async def _after_loss(
        self, status: Status, error: CellError, started: float
    ) -> ExecutionResult:
        # if the restart fails, the next execute retries the start and raises then
        with contextlib.suppress(KernelError):
            await self._core.restart()
        return ExecutionResult(
            status=status,
            error=error,
            duration_s=time.perf_counter() - started,
            state_lost=True,
        )

    def interrupt(self) -> None:
        """Send SIGINT to the running cell (it raises KeyboardInterrupt; state is kept)."""
        proc = self._core.proc
        if self._core.running_cell and proc is not None:
            proc.interrupt()


def _record(span: Span, result: ExecutionResult) -> None:
    """The cell's outcome on its span: status, error type (ERROR), whether state was lost."""
    error = result.error
    attributes: dict[str, str | bool] = {"sunroom.cell.status": result.status}
    if error is not None:
        attributes["sunroom.cell.error"] = error.type
    if result.state_lost:
        attributes["sunroom.cell.state_lost"] = True
    tracing.annotate(span, attributes, error=None if error is None else error.type)
