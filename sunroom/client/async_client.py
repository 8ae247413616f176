"""The async client of ``sunroom serve``: :class:`AsyncClient` (httpx).

Each method is one route (``/openapi.json`` describes them); an error answer raises the class
the service named (:func:`~sunroom.client.problems.error_from`), a service that cannot be
reached raises :class:`~sunroom.errors.ServiceError`.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType
from typing import Any, Final, TypeVar, final
from urllib.parse import quote

import httpx
import pydantic

from sunroom.client.problems import error_from
from sunroom.client.sse import END, SessionEvent, event_of, parse_sse
from sunroom.errors import ServiceError
from sunroom.sandbox.result import CellError, DisplayItem, ExecutionResult
from sunroom.service import schemas as s

__all__ = ["AsyncClient", "execution_result"]

M = TypeVar("M", bound=pydantic.BaseModel)

IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The mime types whose values travel as base64 and come back as bytes."""

MAX_QUIET_RECONNECTS: Final = 3
"""Reconnects of an event stream in a row that brought no event before it gives up."""


def execution_result(out: s.ExecutionOut) -> ExecutionResult:
    """The :class:`~sunroom.ExecutionResult` a local kernel would have returned for *out*."""
    error = out.error
    return ExecutionResult(
        status=out.status,
        stdout=out.stdout,
        stderr=out.stderr,
        value=out.value,
        error=CellError(error.type, error.message, error.traceback) if error else None,
        duration_s=float(out.duration_s),
        truncated_bytes=out.truncated_bytes,
        state_lost=out.state_lost,
        outputs=tuple(
            DisplayItem(
                {m: base64.b64decode(v) if m in IMAGE_TYPES else v for m, v in d.data.items()},
                d.metadata,
            )
            for d in out.outputs
        ),
        dropped_outputs=out.dropped_outputs,
    )


def _body(options: pydantic.BaseModel | None, given: Mapping[str, object]) -> dict[str, Any]:
    body = options.model_dump(mode="json", exclude_unset=True) if options is not None else {}
    body.update({k: v for k, v in given.items() if v is not None})
    return body


@final
class AsyncClient:
    """A client of the sunroom service at *url* (``http://127.0.0.1:8765``), with its *token*.

    *timeout_s* bounds each request's connect and each read (a session's ``result`` waits its
    own timeout on top). Close it with :meth:`aclose` or ``async with``.
    """

    def __init__(self, url: str, *, token: str, timeout_s: float = 60.0) -> None:
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections. Idempotent."""
        await self._http.aclose()

    # -- plumbing --------------------------------------------------------------------------

    async def _request(
        self, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        try:
            answer = await self._http.request(method, path, timeout=timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(f"the service could not be reached ({type(exc).__name__})") from exc
        if answer.status_code >= 400:
            raise error_from(
                answer.status_code, answer.content, retry_after=answer.headers.get("retry-after")
            )
        return answer

    async def _json(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        answer = await self._request(method, path, **kwargs)
        try:
            return model.model_validate_json(answer.content)
        except pydantic.ValidationError:
            raise ServiceError(
                f"the service's answer to {method} {path.split('?')[0]} is not what its API "
                "describes",
                status=answer.status_code,
            ) from None

    # -- the service ----------------------------------------------------------------------

    async def health(self) -> s.HealthOut:
        """``GET /healthz``: whether it is up, and its counts."""
        return await self._json(s.HealthOut, "GET", "/healthz")

    async def openapi(self) -> dict[str, Any]:
        """``GET /openapi.json``: the service's OpenAPI 3.1 description."""
        document: dict[str, Any] = (await self._request("GET", "/openapi.json")).json()
        return document

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self,
        task: str | None = None,
        *,
        inputs: Mapping[str, object] | None = None,
        options: s.CreateSession | None = None,
    ) -> str:
        """Create a session (its first run starts when there is a *task*); its id.

        *options* carries every other field of ``POST /sessions`` (model, limits, approvals
        ...); *task* and *inputs* win over its own.
        """
        body = _body(options, {"task": task, "inputs": dict(inputs) if inputs else None})
        return (await self._json(s.SessionCreated, "POST", "/sessions", json=body)).session_id

    async def sessions(self, *, limit: int = 100) -> list[s.SessionOut]:
        """The newest session records (at most *limit*)."""
        out = await self._json(s.SessionsOut, "GET", "/sessions", params={"limit": limit})
        return out.sessions

    async def session(self, session_id: str) -> s.SessionOut:
        """A session's record."""
        return await self._json(s.SessionOut, "GET", f"/sessions/{quote(session_id, safe='')}")

    async def send(self, session_id: str, text: str) -> None:
        """Send a user message (it starts a run when the session is idle)."""
        path = f"/sessions/{quote(session_id, safe='')}/messages"
        await self._json(s.Accepted, "POST", path, json={"text": text})

    async def events(
        self, session_id: str, *, after: int = 0
    ) -> AsyncGenerator[SessionEvent, None]:
        """The session's events after seq *after*, then live, until it has no run in progress.

        A connection that drops is resumed from the last event seen (``Last-Event-ID``): no
        event is lost or repeated. Raises ServiceError after :data:`MAX_QUIET_RECONNECTS`
        reconnects in a row that brought nothing.
        """
        path = f"/sessions/{quote(session_id, safe='')}/events"
        last, quiet = after, 0
        while True:
            headers = {"Last-Event-ID": str(last)}
            seen = last
            try:
                async with self._http.stream("GET", path, headers=headers) as answer:
                    if answer.status_code >= 400:
                        await answer.aread()
                        raise error_from(answer.status_code, answer.content)
                    async for _, kind, data in parse_sse(answer.aiter_lines()):
                        if kind == END:
                            return
                        event = event_of(kind, data)
                        last = event.seq
                        yield event
            except (httpx.TransportError, httpx.DecodingError):
                pass  # the stream was cut: resume from the last seq seen
            quiet = 0 if last > seen else quiet + 1
            if quiet >= MAX_QUIET_RECONNECTS:
                raise ServiceError(
                    f"the event stream ended {quiet} times in a row without an event or its end"
                )

    async def result(self, session_id: str, *, timeout_s: float = 0.0) -> s.ResultOut:
        """The run's result once it ended, waiting up to *timeout_s* (``running`` before)."""
        path = f"/sessions/{quote(session_id, safe='')}/result"
        wait = self._timeout_s + timeout_s
        return await self._json(
            s.ResultOut, "GET", path, params={"timeout": timeout_s}, timeout_s=wait
        )

    async def approvals(self, session_id: str) -> list[s.ApprovalOut]:
        """The session's approval requests waiting for an answer, oldest first."""
        path = f"/sessions/{quote(session_id, safe='')}/approvals"
        return (await self._json(s.ApprovalsOut, "GET", path)).approvals

    async def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        allow: bool,
        reason: str | None = None,
        lease: bool = False,
    ) -> None:
        """Answer approval request *call_id*; durable when this returns.

        *lease* allows the function for the rest of the run. Raises NotFoundError,
        ConflictError (answered already).
        """
        path = f"/sessions/{quote(session_id, safe='')}/approvals/{quote(call_id, safe='')}"
        body = {"allow": allow, "reason": reason, "lease": lease}
        await self._json(s.ApprovalAnswered, "POST", path, json=body)

    async def delete_session(self, session_id: str) -> None:
        """Cancel the session and close it."""
        path = f"/sessions/{quote(session_id, safe='')}"
        await self._json(s.SessionDeleted, "DELETE", path)

    # -- raw kernels -----------------------------------------------------------------------

    async def create_kernel(
        self,
        *,
        backend: str | None = None,
        inputs: Mapping[str, object] | None = None,
        template: str | None = None,
        options: s.CreateKernel | None = None,
    ) -> str:
        """Start a raw kernel; its id.

        *options* carries every other field of ``POST /kernels`` (limits, network, mcp ...);
        the keywords win over its own.
        """
        given = {"backend": backend, "template": template, "inputs": dict(inputs or {}) or None}
        body = _body(options, given)
        return (await self._json(s.KernelCreated, "POST", "/kernels", json=body)).kernel_id

    async def kernels(self) -> list[s.KernelOut]:
        """The raw kernels of the server, oldest first."""
        return (await self._json(s.KernelsOut, "GET", "/kernels")).kernels

    async def kernel(self, kernel_id: str) -> s.KernelOut:
        """A raw kernel's description."""
        return await self._json(s.KernelOut, "GET", f"/kernels/{quote(kernel_id, safe='')}")

    async def execute(
        self, kernel_id: str, code: str, *, timeout_s: float | None = None
    ) -> ExecutionResult:
        """Run one cell; its result as a local kernel returns it (the cell's errors are data)."""
        path = f"/kernels/{quote(kernel_id, safe='')}/execute"
        wait = self._timeout_s + (timeout_s or 0.0)
        body = {"code": code, "timeout_s": timeout_s}
        out = await self._json(s.ExecutionOut, "POST", path, json=body, timeout_s=wait)
        return execution_result(out)

    async def fork(self, kernel_id: str, n: int = 1) -> list[str]:
        """*n* copies of the kernel's live state, raw kernels sharing its sandbox; their ids."""
        path = f"/kernels/{quote(kernel_id, safe='')}/fork"
        return (await self._json(s.Forked, "POST", path, json={"n": n})).kernel_ids

    async def close_kernel(self, kernel_id: str) -> None:
        """Kill the raw kernel."""
        await self._json(s.KernelDeleted, "DELETE", f"/kernels/{quote(kernel_id, safe='')}")

    # -- a raw kernel's workdir --------------------------------------------------------------

    def _file(self, kernel_id: str, path: str) -> str:
        return f"/kernels/{quote(kernel_id, safe='')}/files/{quote(path)}"

    async def write_file(self, kernel_id: str, path: str, data: bytes) -> int:
        """Write *data* to *path* in the kernel's workdir (parents made); its size."""
        answer = await self._json(s.FileWritten, "PUT", self._file(kernel_id, path), content=data)
        return answer.size

    async def read_file(self, kernel_id: str, path: str) -> bytes:
        """The bytes of *path* in the kernel's workdir."""
        return (await self._request("GET", self._file(kernel_id, path))).content

    async def list_files(self, kernel_id: str, glob: str = "**/*") -> list[s.FileOut]:
        """The workdir entries matching *glob* (wildcards ``**``, ``*``, ``?``)."""
        path = f"/kernels/{quote(kernel_id, safe='')}/files"
        return (await self._json(s.FilesOut, "GET", path, params={"glob": glob})).files

    async def delete_file(self, kernel_id: str, path: str) -> None:
        """Remove *path* (a file, a link or a directory tree) from the kernel's workdir."""
        await self._json(s.FileDeleted, "DELETE", self._file(kernel_id, path))
