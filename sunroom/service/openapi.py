"""The service described: :func:`openapi_document`, OpenAPI 3.1, served at ``/openapi.json``.

Every route the app serves is described in :data:`OPERATIONS` by its request and response
models (:mod:`sunroom.service.schemas`, pydantic), its query parameters, its statuses and the
error body of :mod:`sunroom.service.problems`; the document is built from the app's own route
table, so a route missing here is a :class:`LookupError` (``tests/service/test_openapi.py``
fails on it). Bodies that are not JSON are described by their media type: the SSE stream of a
session's events (``text/event-stream``) and a workdir file's bytes
(``application/octet-stream``). Every route but ``/healthz`` needs the bearer token,
``/openapi.json`` included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import pydantic
from pydantic.json_schema import models_json_schema

from sunroom.service import schemas as s

__all__ = ["OPERATIONS", "Operation", "Query", "openapi_document"]

JSON = dict[str, Any]
Model = type[pydantic.BaseModel]


@final
@dataclass(frozen=True, slots=True)
class Query:
    """A query parameter (or, with ``header=True``, a request header)."""

    name: str
    schema: Mapping[str, Any]
    description: str
    header: bool = False


@final
@dataclass(frozen=True, slots=True)
class Operation:
    """One route's description.

    *answers* maps each success status to its body model (None: a body of *stream* type);
    *errors* lists the error statuses it may answer besides 401 (every protected route) and
    400 for a Host header the server does not serve (every route).
    """

    summary: str
    answers: Mapping[int, Model | None]
    errors: tuple[int, ...] = ()
    body: Model | Literal["bytes"] | None = None
    params: tuple[Query, ...] = ()
    stream: Literal["sse", "bytes", "json"] | None = None
    public: bool = False
    description: str = field(default="")


_LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
               "At most this many sessions, newest first.")  # fmt: skip
_AFTER = Query("after", {"type": "integer", "minimum": 0, "default": 0},
               "Replay the events after this seq (Last-Event-ID wins over it).")  # fmt: skip
_LAST_ID = Query("Last-Event-ID", {"type": "string", "pattern": "^[0-9]+$"},
                 "The last event seq the client saw (SSE resume).", header=True)  # fmt: skip
_TIMEOUT = Query("timeout", {"type": "number", "minimum": 0, "maximum": 3600, "default": 0},
                 "Seconds to wait for the run to end before answering 202.")  # fmt: skip
_GLOB = Query("glob", {"type": "string", "default": "**/*"},
              "Wildcards **, * and ? (no character classes).")  # fmt: skip

_SSE_TEXT = (
    "Server-sent events from the session's log, then live. Each message has `id` (the event's "
    "seq), `event` (its type) and `data` (JSON: `seq`, `ts`, `type` and the event's fields); "
    "comment lines are keepalives. The stream ends with `event: end` and data "
    '`{"status", "last_seq"}` once the session has no run in progress. Reconnect with '
    "`Last-Event-ID` (or `?after=`) to resume without loss or repeats."
)


def _files(base: str, what: str) -> dict[tuple[str, str], Operation]:
    owner = (404, 409) if what == "session" else (404,)
    return {
        ("GET", f"{base}/files"): Operation(
            f"List the {what}'s workdir files", {200: s.FilesOut},
            errors=(*owner, 400, 422), params=(_GLOB,),
        ),
        ("PUT", f"{base}/files/{{path}}"): Operation(
            f"Write a file into the {what}'s workdir (streamed; parents made)",
            {200: s.FileWritten}, errors=(*owner, 409, 413, 422, 507), body="bytes",
        ),
        ("GET", f"{base}/files/{{path}}"): Operation(
            f"Read a file of the {what}'s workdir (streamed)", {200: None},
            errors=(*owner, 409, 422), stream="bytes",
        ),
        ("DELETE", f"{base}/files/{{path}}"): Operation(
            f"Remove a file, link or directory tree of the {what}'s workdir",
            {200: s.FileDeleted}, errors=(*owner, 409, 422),
        ),
    }  # fmt: skip


OPERATIONS: Final[Mapping[tuple[str, str], Operation]] = {
    ("GET", "/healthz"): Operation("Health and counts", {200: s.HealthOut}, public=True),
    ("GET", "/openapi.json"): Operation(
        "This description (OpenAPI 3.1)", {200: None}, stream="json"
    ),
    ("POST", "/sessions"): Operation(
        "Create a session (and start its first run when it has a task)",
        {201: s.SessionCreated}, errors=(422, 429, 502, 503), body=s.CreateSession,
    ),
    ("GET", "/sessions"): Operation(
        "The newest session records", {200: s.SessionsOut}, errors=(422,), params=(_LIMIT,)
    ),
    ("GET", "/sessions/{sid}"): Operation("A session's record", {200: s.SessionOut}, errors=(404,)),
    ("DELETE", "/sessions/{sid}"): Operation(
        "Cancel a session and close it", {200: s.SessionDeleted}, errors=(404,)
    ),
    ("POST", "/sessions/{sid}/messages"): Operation(
        "Send a user message (starts a run when the session is idle)", {202: s.Accepted},
        errors=(404, 409, 422, 503), body=s.MessageIn,
    ),
    ("GET", "/sessions/{sid}/events"): Operation(
        "The session's events (SSE), resumable", {200: None}, errors=(404, 422),
        params=(_AFTER, _LAST_ID), stream="sse", description=_SSE_TEXT,
    ),
    ("GET", "/sessions/{sid}/result"): Operation(
        "The run's result: 200 once it ended, 202 while it runs",
        {200: s.ResultOut, 202: s.ResultOut}, errors=(404, 422), params=(_TIMEOUT,),
    ),
    ("GET", "/sessions/{sid}/approvals"): Operation(
        "The approval requests waiting for an answer", {200: s.ApprovalsOut}, errors=(404, 409)
    ),
    ("POST", "/sessions/{sid}/approvals/{call_id}"): Operation(
        "Answer an approval request (durable on return)", {200: s.ApprovalAnswered},
        errors=(404, 409, 422), body=s.ApprovalIn,
    ),
    ("POST", "/kernels"): Operation(
        "Start a raw kernel", {201: s.KernelCreated}, errors=(422, 429, 503),
        body=s.CreateKernel,
    ),
    ("GET", "/kernels"): Operation("This server's raw kernels, oldest first", {200: s.KernelsOut}),
    ("POST", "/kernels/{kid}/execute"): Operation(
        "Run one cell", {200: s.ExecutionOut}, errors=(404, 409, 422, 429, 500, 503),
        body=s.Execute,
    ),
    ("POST", "/kernels/{kid}/fork"): Operation(
        "Copy the kernel's live state into new raw kernels (one trust domain)",
        {201: s.Forked}, errors=(404, 409, 422, 429, 503), body=s.Fork,
    ),
    ("GET", "/kernels/{kid}"): Operation("A raw kernel", {200: s.KernelOut}, errors=(404,)),
    ("DELETE", "/kernels/{kid}"): Operation(
        "Kill a raw kernel", {200: s.KernelDeleted}, errors=(404,)
    ),
    **_files("/kernels/{kid}", "kernel"),
    **_files("/sessions/{sid}", "session"),
}  # fmt: skip
"""Every route's description, by (method, OpenAPI path)."""

_REASONS: Final = {
    400: "A malformed request, or a Host header this server does not serve",
    401: "No valid bearer token",
    404: "No such session, kernel, request or file",
    409: "Not in a state that allows the request",
    413: "The body is over the server's limit",
    422: "The request is invalid (the message names the field)",
    429: "The server is at its limit (Retry-After: 1)",
    500: "The kernel or the server failed",
    502: "The model provider failed",
    503: "Unavailable now: shutting down, owned by another server (Retry-After), or no sandbox",
    507: "The kernel's workdir is full",
}

_PATH_PARAMS: Final = {
    "sid": "A session id",
    "kid": "A raw kernel id",
    "call_id": "An approval request's call id",
    "path": "A path in the workdir, relative (no `..`)",
}


_BYTES: Final = {"contentMediaType": "application/octet-stream"}
"""A body of raw bytes (OpenAPI 3.1 describes binary content by its media type)."""


def openapi_path(route: str) -> str:
    """*route* (Starlette's template, ``{path:path}``) as an OpenAPI path (``{path}``)."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route)


def _components() -> JSON:
    models: set[Model] = {s.ProblemOut}
    for op in OPERATIONS.values():
        models.update(m for m in op.answers.values() if m is not None)
        if isinstance(op.body, type):
            models.add(op.body)
    ordered = sorted(models, key=lambda m: m.__name__)
    _, top = models_json_schema(
        [(m, "validation") for m in ordered], ref_template="#/components/schemas/{model}"
    )
    return {
        "schemas": top["$defs"],
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "responses": {
            "Problem": {
                "description": "An error: its class name and one sentence",
                "content": {"application/json": {"schema": _ref(s.ProblemOut)}},
            }
        },
    }


def _ref(model: Model) -> JSON:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _content(op: Operation, model: Model | None) -> JSON:
    if model is not None:
        return {"application/json": {"schema": _ref(model)}}
    if op.stream == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if op.stream == "bytes":
        return {"application/octet-stream": {"schema": _BYTES}}
    return {"application/json": {"schema": {"type": "object"}}}


def _operation(method: str, path: str, op: Operation) -> JSON:
    out: JSON = {
        "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_')}",
        "summary": op.summary,
    }
    if op.description:
        out["description"] = op.description
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"},
         "description": _PATH_PARAMS[n]}
        for n in re.findall(r"\{(\w+)\}", path)
    ]  # fmt: skip
    params += [
        {"name": q.name, "in": "header" if q.header else "query", "required": False,
         "schema": dict(q.schema), "description": q.description}
        for q in op.params
    ]  # fmt: skip
    if params:
        out["parameters"] = params
    if op.body == "bytes":
        media = {"application/octet-stream": {"schema": _BYTES}}
        out["requestBody"] = {"required": True, "content": media}
    elif op.body is not None:
        content = {"application/json": {"schema": _ref(op.body)}}
        out["requestBody"] = {"required": True, "content": content}
    responses: JSON = {
        str(status): {"description": op.summary, "content": _content(op, model)}
        for status, model in op.answers.items()
    }
    errors = {400, *op.errors} | (set() if op.public else {401})
    for status in sorted(errors):
        responses[str(status)] = {
            "description": _REASONS[status],
            "content": {"application/json": {"schema": _ref(s.ProblemOut)}},
        }
    out["responses"] = responses
    if op.public:
        out["security"] = []
    return out


def openapi_document(routes: Iterable[tuple[str, str]], *, version: str) -> JSON:
    """The OpenAPI 3.1 document of *routes* ((Starlette path, method) pairs), as JSON data.

    Raises LookupError naming a route that :data:`OPERATIONS` does not describe.
    """
    paths: dict[str, JSON] = {}
    for route, method in routes:
        path = openapi_path(route)
        op = OPERATIONS.get((method, path))
        if op is None:
            raise LookupError(f"the route {method} {path} has no description in OPERATIONS")
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sunroom",
            "version": version,
            "description": "Agent sessions and raw kernels over HTTP (docs/service.md).",
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": _components(),
    }
