"""The file routes: a kernel's workdir over HTTP, for raw kernels and for sessions' kernels.

- ``PUT {base}/files/{path}``: the body, streamed into the workdir file *path* (parents made)
  → 200 ``{"path", "size"}``. Its limit is ``ServiceConfig.max_file_bytes``, not the JSON
  body limit: a declared ``Content-Length`` over it is answered 413 before the body is read; a
  chunked body is counted as it arrives and answered 413 the moment it passes the limit. The
  data goes to a temporary file that becomes *path* only when the whole body arrived, so a
  refused or broken upload writes nothing.
- ``GET {base}/files/{path}``: the file, streamed (``application/octet-stream``) with its
  ``Content-Length``. Where the kernel's descriptors can be taken (subprocess and bwrap
  kernels, forked docker kernels; :meth:`~sunroom.sandbox.files.KernelFiles.open_shared`)
  and the server offers ``zerocopysend``, the bytes go from the kernel's open file to the
  socket with ``sendfile``, never through the channel; otherwise they come through it.
- ``GET {base}/files?glob=PATTERN``: ``{"files": [{"path", "size", "mtime", "is_dir"}]}``
  (default glob ``**/*``; at most 10,000 entries). The wildcards are ``**``, ``*`` and ``?``
  only: a pattern with ``[`` or ``]`` (a character class elsewhere, never one here) is a 400
  ``InvalidGlob`` rather than a listing that silently matches nothing.
- ``DELETE {base}/files/{path}``: remove a file, link or directory tree → 200.

*base* is ``/kernels/{id}`` or ``/sessions/{id}`` (a session this server runs: 409 otherwise).
File operations wait for a running cell. Errors: a refused path (absolute, ``..``, NUL, a link
out of the workdir) 422, nothing there 404, a file where a directory is needed (or the other
way round) 409, a full workdir 507.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sunroom.errors import FileError
from sunroom.sandbox.files import SharedFile
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service.kernels import KernelManager
from sunroom.service.problems import error_body
from sunroom.service.sessions import SessionManager

__all__ = ["ZEROCOPY", "file_response", "file_routes"]

ZEROCOPY: Final = "http.response.zerocopysend"
"""The ASGI extension a server may offer: a response body sent from a file with ``sendfile``
(this service's server does, :mod:`sunroom.service.server`)."""

Endpoint = Callable[[Request], Awaitable[Response]]

STATUS: Final = {
    "refused": 422,
    "not_found": 404,
    "is_dir": 409,
    "not_dir": 409,
    "no_space": 507,
    "too_many": 422,
    "failed": 422,
}
"""The HTTP status of each FileError reason."""


def _problem(exc: FileError) -> Response:
    status = STATUS.get(exc.reason, 422)
    return JSONResponse(error_body("FileError", str(exc)), status_code=status)


def file_routes(
    kernels: Callable[[], KernelManager], sessions: Callable[[], SessionManager]
) -> list[tuple[str, str, Endpoint]]:
    """The file routes (path, method, endpoint) for raw kernels and sessions."""

    async def raw_kernel(request: Request) -> AsyncKernel:
        return kernels().kernel(request.path_params["kid"])

    async def session_kernel(request: Request) -> AsyncKernel:
        return await sessions().kernel(request.path_params["sid"])

    out: list[tuple[str, str, Endpoint]] = []
    for base, find in (("/kernels/{kid}", raw_kernel), ("/sessions/{sid}", session_kernel)):
        out += [
            (f"{base}/files", "GET", _lister(find)),
            (f"{base}/files/{{path:path}}", "PUT", _uploader(find)),
            (f"{base}/files/{{path:path}}", "GET", _downloader(find)),
            (f"{base}/files/{{path:path}}", "DELETE", _deleter(find)),
        ]
    return out


Finder = Callable[[Request], Awaitable[AsyncKernel]]


def _uploader(find: Finder) -> Endpoint:
    async def put(request: Request) -> Response:
        kernel = await find(request)
        path: str = request.path_params["path"]

        async def body() -> AsyncIterator[bytes]:
            async for piece in request.stream():
                if piece:
                    yield piece

        try:
            size = await kernel.files.write(path, body())
        except FileError as exc:
            return _problem(exc)
        except ClientDisconnect:  # nothing was written; nobody is left to answer
            return Response(status_code=400)
        return JSONResponse({"path": path, "size": size})

    return put


class _Sendfile(Response):
    """A file the kernel opened, sent with ``sendfile`` (the server's ``zerocopysend``)."""

    media_type = "application/octet-stream"

    def __init__(self, shared: SharedFile) -> None:
        super().__init__(headers={"content-length": str(shared.size)})
        self._shared = shared

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            with io.FileIO(self._shared.fd, "rb", closefd=False) as file:
                message = {"file": file, "offset": 0, "count": self._shared.size}
                await send({"type": ZEROCOPY, **message, "more_body": False})
        finally:
            await self._shared.aclose()


def _downloader(find: Finder) -> Endpoint:
    async def get(request: Request) -> Response:
        kernel = await find(request)
        try:
            return await file_response(request, kernel, request.path_params["path"])
        except FileError as exc:
            return _problem(exc)

    return get


async def file_response(request: Request, kernel: AsyncKernel, path: str) -> Response:
    """The workdir file *path* of *kernel* as a 200 response, streamed as the module says.

    The file is opened before the response is made: a missing file, a directory or a refused
    path raises FileError here (a 404 or 4xx, not a broken stream). The E2B facade's
    ``GET /files`` (:mod:`sunroom.service.e2b.envd`) sends files with it too.
    """
    if ZEROCOPY in request.scope.get("extensions", {}):
        shared = await kernel.files.open_shared(path)
        if shared is not None:
            return _Sendfile(shared)
    size, stream = await kernel.files.read_sized(path)

    async def body() -> AsyncIterator[bytes]:
        left = size  # the Content-Length sent: a file that grew is cut there
        try:
            async for chunk in stream:
                if len(chunk) >= left:
                    yield chunk[:left]
                    return
                left -= len(chunk)
                yield chunk
        finally:
            await stream.aclose()
        if left:  # the file shrank meanwhile: end the connection, the body is short
            raise FileError("the file shrank while it was sent", reason="failed")

    headers = {"content-length": str(size)}
    return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)


def glob_problem(glob: str) -> str | None:
    """Why *glob* is not a pattern the listing understands (one sentence), or None when it is."""
    if "[" in glob or "]" in glob:
        return (
            "glob: character classes ([...]) are not supported; the wildcards are **, * and ? "
            "(? also matches a literal [ or ])"
        )
    return None


def _lister(find: Finder) -> Endpoint:
    async def listing(request: Request) -> Response:
        glob = request.query_params.get("glob", "**/*")
        problem = glob_problem(glob)
        if problem is not None:
            return JSONResponse(error_body("InvalidGlob", problem), status_code=400)
        kernel = await find(request)
        try:
            rows = await kernel.files.list(glob)
        except FileError as exc:
            return _problem(exc)
        return JSONResponse({"files": [row.to_dict() for row in rows]})

    return listing


def _deleter(find: Finder) -> Endpoint:
    async def delete(request: Request) -> Response:
        kernel = await find(request)
        path: str = request.path_params["path"]
        try:
            await kernel.files.delete(path)
        except FileError as exc:
            return _problem(exc)
        return JSONResponse({"path": path, "deleted": True})

    return delete
