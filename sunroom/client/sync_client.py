"""The sync twin of :class:`~sunroom.client.async_client.AsyncClient`: :class:`Client`.

The same methods with the same explicit signatures, each run on a private event loop
(:class:`~sunroom.sandbox.portal.Portal`), as :class:`sunroom.Kernel` runs its async core.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Mapping
from types import TracebackType
from typing import Any, final

from sunroom.client.async_client import AsyncClient
from sunroom.client.sse import SessionEvent
from sunroom.sandbox.portal import Portal
from sunroom.sandbox.result import ExecutionResult
from sunroom.service import schemas as s

__all__ = ["Client"]


@final
class Client:
    """A blocking client of the sunroom service (see :class:`AsyncClient`).

    Close it with :meth:`close` or ``with``.
    """

    def __init__(self, url: str, *, token: str, timeout_s: float = 60.0) -> None:
        self._portal = Portal("sunroom-client", what="the client")
        self._core: AsyncClient = self._portal.call(_made(url, token, timeout_s))

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and the private loop. Idempotent."""
        if not self._portal.closed:
            try:
                self._portal.call(self._core.aclose())
            finally:
                self._portal.close()

    def health(self) -> s.HealthOut:
        """See :meth:`AsyncClient.health`."""
        return self._portal.call(self._core.health())

    def openapi(self) -> dict[str, Any]:
        """See :meth:`AsyncClient.openapi`."""
        return self._portal.call(self._core.openapi())

    def create_session(
        self,
        task: str | None = None,
        *,
        inputs: Mapping[str, object] | None = None,
        options: s.CreateSession | None = None,
    ) -> str:
        """See :meth:`AsyncClient.create_session`."""
        return self._portal.call(self._core.create_session(task, inputs=inputs, options=options))

    def sessions(self, *, limit: int = 100) -> list[s.SessionOut]:
        """See :meth:`AsyncClient.sessions`."""
        return self._portal.call(self._core.sessions(limit=limit))

    def session(self, session_id: str) -> s.SessionOut:
        """See :meth:`AsyncClient.session`."""
        return self._portal.call(self._core.session(session_id))

    def send(self, session_id: str, text: str) -> None:
        """See :meth:`AsyncClient.send`."""
        self._portal.call(self._core.send(session_id, text))

    def events(self, session_id: str, *, after: int = 0) -> Generator[SessionEvent, None, None]:
        """See :meth:`AsyncClient.events` (a blocking iterator; closing it ends the stream)."""
        stream = self._core.events(session_id, after=after)
        try:
            while True:
                try:
                    yield self._portal.call(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            if not self._portal.closed:
                self._portal.call(stream.aclose())

    def result(self, session_id: str, *, timeout_s: float = 0.0) -> s.ResultOut:
        """See :meth:`AsyncClient.result`."""
        return self._portal.call(self._core.result(session_id, timeout_s=timeout_s))

    def approvals(self, session_id: str) -> list[s.ApprovalOut]:
        """See :meth:`AsyncClient.approvals`."""
        return self._portal.call(self._core.approvals(session_id))

    def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        allow: bool,
        reason: str | None = None,
        lease: bool = False,
    ) -> None:
        """See :meth:`AsyncClient.approve`."""
        call = self._core.approve(session_id, call_id, allow=allow, reason=reason, lease=lease)
        self._portal.call(call)

    def delete_session(self, session_id: str) -> None:
        """See :meth:`AsyncClient.delete_session`."""
        self._portal.call(self._core.delete_session(session_id))

    def create_kernel(
        self,
        *,
        backend: str | None = None,
        inputs: Mapping[str, object] | None = None,
        template: str | None = None,
        options: s.CreateKernel | None = None,
    ) -> str:
        """See :meth:`AsyncClient.create_kernel`."""
        call = self._core.create_kernel(
            backend=backend, inputs=inputs, template=template, options=options
        )
        return self._portal.call(call)

    def kernels(self) -> list[s.KernelOut]:
        """See :meth:`AsyncClient.kernels`."""
        return self._portal.call(self._core.kernels())

    def kernel(self, kernel_id: str) -> s.KernelOut:
        """See :meth:`AsyncClient.kernel`."""
        return self._portal.call(self._core.kernel(kernel_id))

    def execute(
        self, kernel_id: str, code: str, *, timeout_s: float | None = None
    ) -> ExecutionResult:
        """See :meth:`AsyncClient.execute`."""
        return self._portal.call(self._core.execute(kernel_id, code, timeout_s=timeout_s))

    def fork(self, kernel_id: str, n: int = 1) -> list[str]:
        """See :meth:`AsyncClient.fork`."""
        return self._portal.call(self._core.fork(kernel_id, n))

    def close_kernel(self, kernel_id: str) -> None:
        """See :meth:`AsyncClient.close_kernel`."""
        self._portal.call(self._core.close_kernel(kernel_id))

    def write_file(self, kernel_id: str, path: str, data: bytes) -> int:
        """See :meth:`AsyncClient.write_file`."""
        return self._portal.call(self._core.write_file(kernel_id, path, data))

    def read_file(self, kernel_id: str, path: str) -> bytes:
        """See :meth:`AsyncClient.read_file`."""
        return self._portal.call(self._core.read_file(kernel_id, path))

    def list_files(self, kernel_id: str, glob: str = "**/*") -> list[s.FileOut]:
        """See :meth:`AsyncClient.list_files`."""
        return self._portal.call(self._core.list_files(kernel_id, glob))

    def delete_file(self, kernel_id: str, path: str) -> None:
        """See :meth:`AsyncClient.delete_file`."""
        self._portal.call(self._core.delete_file(kernel_id, path))


async def _made(url: str, token: str, timeout_s: float) -> AsyncClient:
    """The async core, made on the portal's loop (httpx binds its pool to the loop it runs on)."""
    return AsyncClient(url, token=token, timeout_s=timeout_s)


async def _next(stream: AsyncGenerator[SessionEvent, None]) -> SessionEvent:
    return await anext(stream)
