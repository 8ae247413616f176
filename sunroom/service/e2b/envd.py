"""E2B's envd file routes over a sunroom kernel: what ``sandbox.files`` of E2B's SDK calls.

E2B runs a daemon, *envd*, in each sandbox; its SDK reaches the sandbox's files through it.
:func:`envd_routes` answers the part of envd's API that ``sandbox.files`` uses, over the
workdir of the sandbox's default-context kernel (``kernel.files``):

- ``GET /files?path=P`` → the file's bytes, streamed (``application/octet-stream``): 404 when
  nothing is there, 400 for a directory. ``Accept-Encoding`` is ignored (never compressed).
- ``POST /files?path=P`` → 200 ``[{"name", "type": "file", "path"}]``, one entry per file
  written. The body is ``application/octet-stream`` (one file at ``path``; it may be
  ``Content-Encoding: gzip``) or ``multipart/form-data`` (its parts named ``file``, each
  written to ``path`` when given, else to its filename; two parts to one path is a 400).
  Bodies are streamed into ``kernel.files.write`` part by part, never held whole: each file
  goes to a temporary name that becomes its path only once all of it arrived, so a refused,
  broken or oversize upload leaves nothing of that file. Missing parent directories are
  made. Other content types are a 400.
- Connect unary RPCs, JSON codec (``POST /filesystem.Filesystem/<Method>``,
  ``Content-Type: application/json``; another codec is a 415): ``ListDir {path, depth}`` →
  ``{"entries": [EntryInfo]}`` (depth 0 means 1; sorted by path, the deeper entries after
  their directory), ``Stat {path}`` → ``{"entry": EntryInfo}``, ``Remove {path}`` → ``{}``
  (a path with nothing there is removed already, as envd's ``RemoveAll`` answers).
  ``EntryInfo`` is protobuf JSON: ``name``, ``type`` (``FILE_TYPE_FILE`` or
  ``FILE_TYPE_DIRECTORY``; a symbolic link is listed as itself, a file), ``path`` (absolute),
  ``size`` (an int64, so a JSON string) and ``modifiedTime`` (RFC 3339, UTC);
  ``mode``, ``permissions``, ``owner``, ``group``, ``symlinkTarget`` and ``metadata`` are
  never set (the kernel's file API does not report them). The workdir itself answers
  ``Stat`` as a directory without size or time.
- ``GET /health`` → 204 while the sandbox lives (the SDK's ``is_running``).

A file operation waits for a cell that runs in the kernel to end (``kernel.files`` is
serialised with cells), where E2B's envd works beside running code.

Paths: E2B's are absolute. One under the sandbox's *workdir* (``EnvdTarget.workdir``, e.g.
``/work`` on bwrap) is taken relative to it; a relative path (and ``~``) relative to it; any
other is a 400 (``invalid_argument``) naming the workdir. E2B's home, ``/home/user``, does
not exist here, and its message says so.

Not covered (each answers Connect's ``unimplemented``, HTTP 501, with one sentence saying so;
never a hang): ``MakeDir`` and ``Move`` (the kernel's file API cannot make an empty
directory or move a file in one step), ``WatchDir`` and the watchers, every
``/process.Process/`` method (``sandbox.commands``, ``sandbox.pty``), and file metadata
(``X-Metadata-*`` headers on an upload: 501 before anything is written). The ``username``
parameter and the RPCs' ``Authorization: Basic`` user are ignored: the kernel has one user.

Credentials and errors: every request goes through *resolve* first, which checks the
sandbox's token (``X-Access-Token``) and finds the sandbox (``E2b-Sandbox-Id``). An unknown
or killed sandbox (resolve's NotFoundError, or its kernel closed meanwhile) answers 502
``{"code": 502, "message": "The sandbox <id> was not found"}`` on the HTTP routes and
Connect's ``unavailable`` with that message on the RPCs: E2B's SDK reads "was not found" as
"the sandbox is not running". A bad token answers 401 (``unauthenticated``). HTTP errors are
JSON ``{"code": <status>, "message"}`` as envd's; RPC errors are Connect's JSON
``{"code": "<code>", "message"}`` with the HTTP status the Connect protocol gives that code.
A missing file is 404 (``not_found``), a refused path 400 (``invalid_argument``), a full
workdir 507; another SunroomError is a 500 (``internal``) with its public message, logged
with its traceback.

Limits: an upload holds at most *max_file_bytes*, the body as sent and again once
gunzipped: reading stops at the cap, the file being written is dropped and the answer is 413.
An RPC body holds at most :data:`MAX_RPC_BYTES`. Multipart bodies are parsed as they stream by
python-multipart's parser (without that package they answer 501).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import posixpath
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

import pydantic
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sunroom.errors import ClosedError, FileError, SunroomError, UsageError
from sunroom.sandbox.files_checks import FileInfo
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service.files import file_response
from sunroom.service.limits import BodyTooLarge
from sunroom.service.problems import (
    NotFoundError,
    Unauthorized,
    Unsupported,
    public_message,
    validation_message,
)

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

__all__ = ["CONNECT_STATUS", "MAX_RPC_BYTES", "EnvdTarget", "Resolve", "envd_routes"]

log = logging.getLogger("sunroom.service")

MAX_RPC_BYTES: Final = 64 * 1024
"""The largest Connect RPC request body (its JSON) the routes read."""

E2B_HOME: Final = "/home/user"
"""The home directory of E2B's sandboxes, which sunroom's do not have."""

CONNECT_STATUS: Final = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""The HTTP status of each Connect error code (the Connect protocol's table)."""

_FILE_ERRORS: Final = {
    "refused": (400, "invalid_argument"),
    "not_found": (404, "not_found"),
    "is_dir": (400, "invalid_argument"),
    "not_dir": (400, "invalid_argument"),
    "no_space": (507, "resource_exhausted"),
    "too_many": (400, "failed_precondition"),
    "too_big": (413, "resource_exhausted"),
    "failed": (500, "internal"),
}
"""The HTTP status and Connect code of each FileError reason."""

_PIECE: Final = 1024 * 1024
"""Most bytes one step of gzip decompression makes."""

_IMPLEMENTED: Final = frozenset({"ListDir", "Stat", "Remove"})


@final
@dataclass(frozen=True, slots=True)
class EnvdTarget:
    """The sandbox an envd request is for, as *resolve* found it."""

    kernel: AsyncKernel
    """The sandbox's default-context kernel (whose workdir the routes serve)."""
    workdir: str
    """The absolute path of the kernel's workdir as code in the sandbox sees it."""
    sandbox_id: str


Resolve = Callable[[Request], Awaitable[EnvdTarget]]
"""The request's sandbox, its credentials checked: raises NotFoundError, Unauthorized."""

Handler = Callable[[Request, EnvdTarget], Awaitable[Response]]


def envd_routes(resolve: Resolve, *, max_file_bytes: int) -> list[Route]:
    """The envd routes (paths as the module docstring says, relative to where they are mounted).

    *max_file_bytes* caps an upload (413 beyond; nothing of that file is written).
    """
    if type(max_file_bytes) is not int or max_file_bytes <= 0:
        raise ValueError("max_file_bytes must be an int > 0")

    async def upload(request: Request, target: EnvdTarget) -> Response:
        return await _upload(request, target, max_file_bytes)

    return [
        Route("/health", _guarded(resolve, _health, rpc=False), methods=["GET"]),
        Route("/files", _guarded(resolve, _download, rpc=False), methods=["GET"]),
        Route("/files", _guarded(resolve, upload, rpc=False), methods=["POST"]),
        Route(
            "/filesystem.Filesystem/{method}",
            _guarded(resolve, _filesystem, rpc=True),
            methods=["POST"],
        ),
        Route("/process.Process/{method}", _guarded(resolve, _process, rpc=True), methods=["POST"]),
    ]


# -- the endpoints --------------------------------------------------------------------------


async def _health(request: Request, target: EnvdTarget) -> Response:
    return Response(status_code=204)


async def _download(request: Request, target: EnvdTarget) -> Response:
    rel = _relative(request.query_params.get("path", ""), target.workdir)
    shown = _absolute(target.workdir, rel)
    if not rel:
        raise FileError(f"{shown} is a directory, not a file", reason="is_dir")
    try:
        return await file_response(request, target.kernel, rel)
    except FileError as exc:  # the kernel's message does not name the path: this one does
        if exc.reason == "not_found":
            raise FileError(f"{shown} does not exist", reason="not_found") from None
        if exc.reason == "is_dir":
            raise FileError(f"{shown} is a directory, not a file", reason="is_dir") from None
        raise


async def _upload(request: Request, target: EnvdTarget, max_file_bytes: int) -> Response:
    if any(name.lower().startswith("x-metadata-") for name in request.headers):
        raise Unsupported("sunroom's E2B API does not store file metadata (X-Metadata-*)")
    body = _capped(request.stream(), max_file_bytes)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        body = _capped(_gunzip(body), max_file_bytes)
    elif encoding not in ("", "identity"):
        raise UsageError(f"the Content-Encoding {encoding[:40]!r} is not supported (gzip is)")
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    path = request.query_params.get("path")
    if media == "application/octet-stream":
        if path is None:
            raise UsageError("an application/octet-stream upload needs the path parameter")
        written = [await _write(target, path, body)]
    elif media == "multipart/form-data":
        written = await _write_parts(target, request, body, path)
    else:
        raise UsageError(
            f"an upload must be multipart/form-data or application/octet-stream, not {media[:60]!r}"
        )
    return JSONResponse(written)


async def _filesystem(request: Request, target: EnvdTarget) -> Response:
    method = request.path_params["method"]
    if method not in _IMPLEMENTED:
        raise Unsupported(_not_covered(f"filesystem.Filesystem/{method}"))
    refused = _codec_refused(request)
    if refused is not None:
        return refused
    body = await _rpc_body(request)
    if method == "ListDir":
        listing = _ListDirRequest.model_validate_json(body)
        entries = await _list_dir(target, listing.path, max(1, listing.depth))
        return JSONResponse({"entries": entries})
    if method == "Stat":
        stat = _PathRequest.model_validate_json(body)
        return JSONResponse({"entry": await _stat(target, stat.path)})
    remove = _PathRequest.model_validate_json(body)
    await _remove(target, remove.path)
    return JSONResponse({})


async def _process(request: Request, target: EnvdTarget) -> Response:
    raise Unsupported(_not_covered(f"process.Process/{request.path_params['method']}"))


def _not_covered(what: str) -> str:
    return (
        f"sunroom's E2B API does not cover {what[:120]}: it serves code execution and "
        "sandbox.files (read, write, list, exists, get_info, remove)"
    )


# -- errors ---------------------------------------------------------------------------------


def _guarded(
    resolve: Resolve, handler: Handler, *, rpc: bool
) -> Callable[[Request], Awaitable[Response]]:
    """*handler* behind *resolve*, its errors answered as envd's (*rpc*: as Connect's)."""

    async def endpoint(request: Request) -> Response:
        target: EnvdTarget | None = None
        try:
            target = await resolve(request)
            return await handler(request, target)
        except ClientDisconnect:  # nobody is left to answer; nothing of the upload was kept
            return Response(status_code=400)
        except Exception as exc:  # noqa: BLE001 - answered below, or raised again
            status, code, message = _classify(request, exc, target)
            if target is None:  # refused before the body was read: let the client finish it
                await _drain(request)
            if rpc:
                return JSONResponse(
                    {"code": code, "message": message}, status_code=CONNECT_STATUS[code]
                )
            return JSONResponse({"code": status, "message": message}, status_code=status)

    return endpoint


DRAIN_BYTES: Final = 1 << 20
"""A refused request's unread body is read and dropped up to this, so the client, still
sending it, gets the answer rather than a connection closed under it."""


async def _drain(request: Request) -> None:
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > DRAIN_BYTES:
                return
    except (RuntimeError, ClientDisconnect):  # already read, or the client left
        return


def _classify(request: Request, exc: Exception, target: EnvdTarget | None) -> tuple[int, str, str]:
    """The HTTP status, Connect code and message of *exc*; raises it again when not ours."""
    if isinstance(exc, NotFoundError):
        return 502, "unavailable", str(exc)
    if isinstance(exc, ClosedError) and target is not None:  # killed while it was served
        return 502, "unavailable", f"The sandbox {target.sandbox_id} was not found"
    if isinstance(exc, Unauthorized):
        return 401, "unauthenticated", str(exc)
    if isinstance(exc, Unsupported):
        return 501, "unimplemented", str(exc)
    if isinstance(exc, BodyTooLarge):
        return 413, "resource_exhausted", str(exc)
    if isinstance(exc, FileError):
        status, code = _FILE_ERRORS.get(exc.reason, (500, "internal"))
        return status, code, str(exc)
    if isinstance(exc, pydantic.ValidationError):
        return 400, "invalid_argument", validation_message(exc)
    if isinstance(exc, UsageError):
        return 400, "invalid_argument", str(exc)
    if isinstance(exc, SunroomError):
        log.error("E2B envd %s %s failed", request.method, request.url.path, exc_info=exc)
        return 500, "internal", public_message(exc)
    raise exc


# -- paths and entries ----------------------------------------------------------------------


def _relative(path: str, workdir: str) -> str:
    """The workdir-relative path of E2B path *path* (``""``: the workdir itself).

    Raises FileError(reason="refused") for a path outside the workdir.
    """
    if "\x00" in path:
        raise FileError("a path must not contain a NUL character", reason="refused")
    if path == "~" or path.startswith("~/"):
        path = path[2:]
    full = posixpath.normpath(posixpath.join(workdir, path))
    full = "/" + full.lstrip("/")  # normpath keeps a leading "//"
    root = "/" + workdir.strip("/")
    if full == root:
        return ""
    prefix = root.rstrip("/") + "/"
    if full.startswith(prefix):
        return full[len(prefix) :]
    shown = path[:200]
    if full == E2B_HOME or full.startswith(E2B_HOME + "/"):
        raise FileError(
            f"{shown!r} is under {E2B_HOME}, E2B's home, which does not exist in a sunroom "
            f"sandbox: use a path under its working directory {workdir} or a relative one",
            reason="refused",
        )
    raise FileError(
        f"{shown!r} is outside the sandbox's working directory {workdir}, the only "
        "directory sunroom's E2B API reaches",
        reason="refused",
    )


def _absolute(workdir: str, rel: str) -> str:
    return posixpath.join(workdir, rel) if rel else workdir


def _timestamp(mtime: float) -> str:
    """*mtime* (epoch seconds) as protobuf JSON's Timestamp (RFC 3339, UTC, ``Z``)."""
    micros = round(mtime * 1_000_000)
    seconds, fraction = divmod(micros, 1_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if fraction % 1000 == 0 and fraction:
        text += f".{fraction // 1000:03d}"
    elif fraction:
        text += f".{fraction:06d}"
    return text + "Z"


def _entry(workdir: str, info: FileInfo) -> dict[str, str]:
    """*info* as protobuf JSON's ``filesystem.EntryInfo``."""
    return {
        "name": posixpath.basename(info.path),
        "type": "FILE_TYPE_DIRECTORY" if info.is_dir else "FILE_TYPE_FILE",
        "path": _absolute(workdir, info.path),
        "size": str(info.size),  # an int64: a string in protobuf JSON
        "modifiedTime": _timestamp(info.mtime),
    }


def _workdir_entry(workdir: str) -> dict[str, str]:
    return {
        "name": posixpath.basename(workdir.rstrip("/")) or "/",
        "type": "FILE_TYPE_DIRECTORY",
        "path": workdir,
    }


async def _info(target: EnvdTarget, rel: str) -> FileInfo:
    """The listing entry of the workdir path *rel* (not ``""``). Raises FileError."""
    for info in await target.kernel.files.list(rel):  # its wildcards match themselves too
        if info.path == rel:
            return info
    raise FileError(f"{_absolute(target.workdir, rel)} does not exist", reason="not_found")


async def _stat(target: EnvdTarget, path: str) -> dict[str, str]:
    rel = _relative(path, target.workdir)
    if not rel:
        return _workdir_entry(target.workdir)
    return _entry(target.workdir, await _info(target, rel))


async def _list_dir(target: EnvdTarget, path: str, depth: int) -> list[dict[str, str]]:
    """The entries under *path* down to *depth* levels, by path (one listing per level)."""
    rel = _relative(path, target.workdir)
    shown = _absolute(target.workdir, rel)
    if rel and not (await _info(target, rel)).is_dir:
        raise FileError(f"{shown} is not a directory", reason="not_dir")
    base = rel + "/" if rel else ""
    found: list[FileInfo] = []
    for level in range(1, depth + 1):
        pattern = base + "/".join(["*"] * level)  # its wildcards match themselves too
        try:
            rows = await target.kernel.files.list(pattern)
        except FileError as exc:
            if exc.reason != "too_many":
                raise
            raise FileError(
                f"{shown} has more than 10,000 entries {level} levels down: list a deeper "
                "directory or with a smaller depth",
                reason="too_many",
            ) from None
        rows = [r for r in rows if r.path.startswith(base)]
        found += rows
        if not any(r.is_dir for r in rows):
            break
    found.sort(key=lambda info: info.path)
    return [_entry(target.workdir, info) for info in found]


async def _remove(target: EnvdTarget, path: str) -> None:
    rel = _relative(path, target.workdir)
    if not rel:
        raise FileError(
            f"{target.workdir} is the sandbox's working directory, which cannot be removed",
            reason="refused",
        )
    try:
        await target.kernel.files.delete(rel)
    except FileError as exc:
        if exc.reason != "not_found":
            raise
        # nothing there: removed already (envd's RemoveAll answers the same)


# -- RPC bodies -----------------------------------------------------------------------------


class _PathRequest(pydantic.BaseModel):
    """``StatRequest`` and ``RemoveRequest`` in protobuf JSON (unknown fields ignored)."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)

    path: str = pydantic.Field(default="", max_length=8192)


class _ListDirRequest(_PathRequest):
    """``ListDirRequest`` in protobuf JSON."""

    depth: int = pydantic.Field(default=0, ge=0, le=2**32 - 1)


async def _rpc_body(request: Request) -> bytes:
    """The JSON of a unary Connect request (at most :data:`MAX_RPC_BYTES`)."""
    parts: list[bytes] = []
    async for chunk in _capped(request.stream(), MAX_RPC_BYTES):
        parts.append(chunk)
    return b"".join(parts) or b"{}"


def _codec_refused(request: Request) -> Response | None:
    """The Connect protocol's 415 for an RPC in a codec other than JSON, or None."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return None
    message = (
        f"sunroom's E2B API answers Connect RPCs in JSON (application/json), not {media[:60]!r}"
    )
    return JSONResponse({"code": "unimplemented", "message": message}, status_code=415)


# -- uploads --------------------------------------------------------------------------------


async def _capped(chunks: AsyncIterator[bytes], cap: int) -> AsyncIterator[bytes]:
    """*chunks* (empty ones dropped), raising BodyTooLarge as soon as they pass *cap* bytes."""
    seen = 0
    async for chunk in chunks:
        seen += len(chunk)
        if seen > cap:
            raise BodyTooLarge(f"the upload is over the limit of {cap} bytes")
        if chunk:
            yield chunk


async def _gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """*chunks*, a gzip stream (one member or several), decompressed piece by piece.

    Never more than :data:`_PIECE` bytes at once, whatever the ratio. Raises UsageError for
    data that is not gzip or ends inside a member.
    """
    inflater = zlib.decompressobj(wbits=31)
    fed = False
    try:
        async for chunk in chunks:
            fed = True
            data = chunk
            while True:
                out = inflater.decompress(data, _PIECE)
                if out:
                    yield out
                if inflater.eof:
                    data = inflater.unused_data
                    if not data:
                        break
                    inflater = zlib.decompressobj(wbits=31)  # the next member
                    continue
                data = inflater.unconsumed_tail
                if not data and len(out) < _PIECE:
                    break
    except zlib.error:
        raise UsageError("the upload is not valid gzip (Content-Encoding: gzip)") from None
    if fed and not inflater.eof:
        raise UsageError("the gzip upload ended before its end (Content-Encoding: gzip)")


async def _write(target: EnvdTarget, path: str, data: AsyncIterator[bytes]) -> dict[str, str]:
    """Write *data* to the E2B path *path*; its entry in the upload's answer."""
    rel = _relative(path, target.workdir)
    shown = _absolute(target.workdir, rel)
    if not rel:
        raise FileError(f"{shown} is a directory", reason="is_dir")
    await target.kernel.files.write(rel, data)
    return {"name": posixpath.basename(rel), "type": "file", "path": shown}


@final
@dataclass(frozen=True, slots=True)
class _Part:
    """The start of one part of a multipart body."""

    name: str
    filename: str | None


_Event = _Part | bytes | None
"""A step of a multipart body: a part starts, some of its data, it ends (None)."""


async def _write_parts(
    target: EnvdTarget,
    request: Request,
    body: AsyncIterator[bytes],
    path: str | None,
) -> list[dict[str, str]]:
    """Write the ``file`` parts of a multipart body, each as it streams in (envd's rules)."""
    try:
        from python_multipart.multipart import parse_options_header
    except ImportError:
        raise Unsupported(
            "multipart uploads need the python-multipart package on the server "
            "(pip install python-multipart); application/octet-stream uploads work without it"
        ) from None
    _, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if not boundary:
        raise UsageError("the multipart/form-data upload has no boundary")
    written: list[dict[str, str]] = []
    async with contextlib.aclosing(_multipart(body, boundary)) as events:
        async for event in events:
            if not isinstance(event, _Part):
                continue  # data outside a part: the preamble
            data = _part_data(events)
            if event.name != "file":
                async for _ in data:
                    pass  # another form field: envd skips it too
                continue
            where = path if path is not None else event.filename
            if not where:
                raise UsageError("a file part needs a filename (its path) or the path parameter")
            shown = _absolute(target.workdir, _relative(where, target.workdir))
            if any(entry["path"] == shown for entry in written):
                raise UsageError(
                    f"two parts of one upload go to {shown[:200]}: the first was written"
                )
            written.append(await _write(target, where, data))
    return written


async def _part_data(events: AsyncIterator[_Event]) -> AsyncIterator[bytes]:
    """The data of the part that just started in *events*, up to its end."""
    async for event in events:
        if event is None:
            return
        if isinstance(event, _Part):
            raise UsageError("the multipart body is malformed: a part started inside another")
        yield event
    raise UsageError("the multipart body ended inside a part")  # _multipart raises first


@final
class _Steps:
    """python-multipart's callbacks, gathering a multipart body's steps as it is parsed."""

    def __init__(self) -> None:
        self.events: list[_Event] = []
        self.ended = False
        self._field = self._value = self._disposition = b""

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self._disposition = b""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def on_header_end(self) -> None:
        if self._field.strip().lower() == b"content-disposition":
            self._disposition = self._value
        self._field = self._value = b""

    def on_headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._disposition)
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        self.events.append(_Part(name, None if filename is None else filename.decode("utf-8")))

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if end > start:
            self.events.append(bytes(data[start:end]))

    def on_part_end(self) -> None:
        self.events.append(None)

    def on_end(self) -> None:
        self.ended = True


async def _multipart(body: AsyncIterator[bytes], boundary: bytes) -> AsyncGenerator[_Event, None]:
    """The steps of the multipart *body*, parsed as it streams (python-multipart's parser)."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser

    steps = _Steps()
    parser = MultipartParser(boundary, steps.callbacks())
    try:
        async for chunk in body:
            parser.write(chunk)
            batch = steps.events[:]
            steps.events.clear()
            for event in batch:
                yield event
        parser.finalize()
    except (FormParserError, UnicodeDecodeError):
        raise UsageError("the multipart/form-data upload is malformed") from None
    for event in steps.events:
        yield event
    if not steps.ended:
        raise UsageError("the multipart/form-data upload ended before its closing boundary")
