"""The service described: :func:`openapi_document`, OpenAPI 3.1, served at ``/openapi.json``.

Every route the app serves is described in :data:`OPERATIONS` by its request and response
models (:mod:`sunroom.service.schemas`, pydantic), its query parameters, its statuses and the
error body of :mod:`sunroom.service.problems`; the document is built from the app's own route
table, so a route missing here is a :class:`LookupError` (``tests/service/test_openapi.py``
fails on it). The E2B facade's routes, which the app hands over before its route table, are
described in :data:`FACADE_OPERATIONS` from their list
(:data:`~sunroom.service.e2b.catalog.FACADE_ROUTES`), tagged ``e2b``, with E2B's own bodies
(:mod:`sunroom.service.e2b.schemas`), errors and credentials. Bodies that are not JSON are
described by their media type: the SSE stream of a session's events (``text/event-stream``),
a workdir file's bytes (``application/octet-stream``), the Prometheus metrics
(``text/plain``) and the lines of the facade's
``/execute`` (``application/x-ndjson``, each line's schema in ``x-line-schema``). Every route
but ``/healthz`` needs the bearer token (or, for the facade's, E2B's credentials),
``/openapi.json`` included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import pydantic
from pydantic.json_schema import models_json_schema

from sunroom.service import schemas as s
from sunroom.service.e2b import schemas as e
from sunroom.service.e2b.catalog import UNCOVERED_METHODS, UNCOVERED_PATHS
from sunroom.service.e2b.control import MAX_PAGE, CreateRequest, RefreshRequest, TimeoutRequest
from sunroom.service.e2b.facade import INTERPRETER_PORT
from sunroom.service.e2b.interpreter import CreateContextRequest, ExecuteRequest

__all__ = [
    "FACADE_OPERATIONS",
    "OPERATIONS",
    "Operation",
    "Query",
    "facade_paths",
    "openapi_document",
    "openapi_path",
]

JSON = dict[str, Any]
Model = type[pydantic.BaseModel]


@final
@dataclass(frozen=True, slots=True)
class Query:
    """A query parameter (or, with ``header=True``, a request header).

    *required*: a request must carry it.
    """

    name: str
    schema: Mapping[str, Any]
    description: str
    header: bool = False
    required: bool = False


@final
@dataclass(frozen=True, slots=True)
class Operation:
    """One route's description.

    *answers* maps each success status to its body model (None: a body of *stream* type, or
    no body for 204; with *stream* ``"ndjson"`` the model is each line's); *errors* lists the
    error statuses it may answer besides 401 (every protected route) and 400 for a Host header
    the server does not serve (every route). *body* ``"upload"`` is a file upload
    (``multipart/form-data`` or ``application/octet-stream``).

    The E2B facade's routes differ from sunroom's own: *problem* is their error body (a model,
    or ``"text"`` for plain text), *security* names the schemes any one of which admits a
    request (None: the document's bearer token), *reasons* and *names* describe their error
    statuses and path parameters where sunroom's words do not fit.
    """

    summary: str
    answers: Mapping[int, Model | None]
    errors: tuple[int, ...] = ()
    body: Model | Literal["bytes", "upload"] | None = None
    params: tuple[Query, ...] = ()
    stream: Literal["sse", "bytes", "json", "ndjson", "text"] | None = None
    public: bool = False
    description: str = field(default="")
    tags: tuple[str, ...] = ()
    problem: Model | Literal["text"] = s.ProblemOut
    security: tuple[str, ...] | None = None
    reasons: Mapping[int, str] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)


_LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
               "At most this many sessions, newest first.")  # fmt: skip
_AFTER = Query("after", {"type": "integer", "minimum": 0, "default": 0},
               "Replay the events after this seq (Last-Event-ID wins over it).")  # fmt: skip
_FOLLOW = Query("follow", {"type": "integer", "enum": [0, 1], "default": 0},
                "1: stay open across runs, sending `event: idle` instead of `end` while the "
                "session has no run in progress.")  # fmt: skip
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
    "`Last-Event-ID` (or `?after=`) to resume without loss or repeats. With `?follow=1` it "
    "sends `event: idle` (the same data) instead and stays open for the next run."
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
    ("GET", "/readyz"): Operation(
        "Readiness: the store answers and the server is not draining (503 otherwise)",
        {200: s.ReadyOut, 503: s.ReadyOut}, public=True,
    ),
    ("GET", "/openapi.json"): Operation(
        "This description (OpenAPI 3.1)", {200: None}, stream="json"
    ),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics (text format)", {200: None}, stream="text",
        description="This server's metrics in Prometheus' text exposition format "
        "(docs/observability.md). It needs the bearer token unless the server runs with "
        "`metrics_public` (`sunroom serve --metrics-public`): then a scraper needs none.",
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
        params=(_AFTER, _FOLLOW, _LAST_ID), stream="sse", description=_SSE_TEXT,
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


def openapi_path(route: str) -> str:
    """*route* (Starlette's template, ``{path:path}``) as an OpenAPI path (``{path}``)."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route)


_RPC: Final = "/filesystem.Filesystem/"
_RPCS: Final = ("ListDir", "Stat", "Remove")
"""envd's filesystem RPCs the facade serves (one route; the others answer 501)."""

_DESCRIBED_AS: Final = {
    # as /sandboxes/{rest} it would be /sandboxes/{sid} again, which OpenAPI forbids
    "/sandboxes/{rest:path}": ("/sandboxes/{sid}/{rest}",),
    # one route, each RPC with its own bodies; the templated path is the rest (501)
    _RPC + "{method}": (*(_RPC + name for name in _RPCS), _RPC + "{method}"),
}


def facade_paths(route: str) -> tuple[str, ...]:
    """The OpenAPI paths that describe the facade's route *route* (a Starlette template)."""
    return _DESCRIBED_AS.get(route) or (openapi_path(route),)


# -- the E2B facade (sunroom.service.e2b): E2B's API, at the server's root and under /e2b

_CONTROL: Final = ("e2bApiKey", "bearer")
_SANDBOX: Final = ("e2bAccessToken", "e2bTrafficToken", "e2bApiKey", "bearer")

_E2B_NAMES: Final = {
    "sid": "A sandbox id (`sandboxID`)",
    "cid": "A code context id",
    "rest": "The rest of the path (it may hold `/`; after `/templates` and the like, also empty)",
    "method": "The RPC's method (one not listed here)",
}

_E2B_REASONS: Final = {
    400: "A malformed request or a bad value (the message names it)",
    401: "No valid credentials: X-API-KEY or the bearer token (a sandbox route also takes its "
    "X-Access-Token or E2B-Traffic-Access-Token)",
    404: "No such sandbox, template, context or file",
    413: "The body is over the server's limit",
    415: "An RPC in a codec other than JSON (Connect's `unimplemented`)",
    429: "The server runs its limit of E2B sandbox kernels",
    500: "The sandbox's kernel failed",
    501: "Not covered by sunroom's E2B API (the message says what)",
    502: 'The sandbox is unknown or was killed ("The sandbox ... was not found", as E2B\'s '
    "proxy answers; the SDK reads it as not running)",
    503: "Unavailable now (the server is stopping, no kernel could start); for an RPC, also "
    "an unknown or killed sandbox (Connect code `unavailable`)",
    507: "The sandbox's workdir is full",
}

_SANDBOX_ID = Query("E2b-Sandbox-Id", {"type": "string"},
                    "The sandbox the request is for (what routes it to the facade)",
                    header=True, required=True)  # fmt: skip
_INTERPRETER = Query("E2b-Sandbox-Port", {"type": "string", "enum": [INTERPRETER_PORT]},
                     "The code interpreter's port", header=True, required=True)  # fmt: skip
_ENVD = Query("E2b-Sandbox-Port", {"type": "string"},
              f"envd's port (the SDK sends 49983): any but {INTERPRETER_PORT}",
              header=True)  # fmt: skip
_ANY_PORT = Query("E2b-Sandbox-Port", {"type": "string"},
                  f"{INTERPRETER_PORT}: the code interpreter answers 200 \"OK\"; any other "
                  "(or none): envd answers 204", header=True)  # fmt: skip
_E2B_PATH = Query("path", {"type": "string"},
                  "The file's path: beneath the sandbox's workdir, or relative to it")  # fmt: skip
_USERNAME = Query("username", {"type": "string"}, "E2B's user (ignored: one user here)")
_LISTING = (
    Query("metadata", {"type": "string"},
          "Only sandboxes with this metadata, as `k=v&k2=v2` (URL-encoded)"),
    Query("state", {"type": "string", "default": "running"},
          "Comma-separated states (`running`, `paused`); sandboxes here are running"),
    Query("template", {"type": "string"}, "Only sandboxes of this template"),
    Query("order", {"type": "string", "enum": ["asc", "desc"], "default": "asc"},
          "`desc`: newest first"),
    Query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": MAX_PAGE},
          "At most this many sandboxes"),
    Query("nextToken", {"type": "string"}, "The previous page's `x-next-token` header"),
)  # fmt: skip

_EXECUTE_TEXT = (
    "Newline-delimited JSON, one object per line, told apart by `type` (each line is an "
    "`ExecuteLine`, which this media type's `x-line-schema` names): `stdout` and `stderr` "
    "(`text`, `timestamp` in Unix nanoseconds) as the cell writes; then each `result` (the "
    "display items, then the main result with `is_main_result`; E2B's MIME fields `text`, "
    "`html`, `markdown`, `svg`, `png`, `jpeg`, `pdf`, `latex`, `json`, `javascript`, `data`, "
    "`chart`, other MIME types in `extra`); an `error` (`name`, `value`, `traceback`) when the "
    "cell raised; `number_of_executions` (`execution_count`); last `end_of_execution`. A "
    "`keepalive` line comes after a few seconds of silence. A stream cut off before "
    "`end_of_execution` means the sandbox was killed under the cell; a client that goes away "
    "interrupts the cell (its context keeps its state). `env_vars` hold for this execution only."
)
_RPC_TEXT = (
    "A Connect unary RPC with the JSON codec (`Content-Type: application/json`); its errors "
    'are Connect\'s `{"code", "message"}` with the HTTP status of the Connect code.'
)
_UNCOVERED_TEXT = (
    "E2B's pause, resume, snapshots, fork, network, metrics, logs, templates, volumes and "
    "secrets: every method and path below this one that this document does not list."
)


def _control(
    summary: str,
    answers: Mapping[int, Model | None],
    errors: tuple[int, ...] = (404,),
    **more: Any,
) -> Operation:
    return Operation(summary, answers, errors, tags=("e2b",), problem=e.E2BError,
                     security=_CONTROL, reasons=_E2B_REASONS, names=_E2B_NAMES, **more)  # fmt: skip


def _in_sandbox(
    summary: str,
    answers: Mapping[int, Model | None],
    errors: tuple[int, ...],
    *,
    port: Query,
    problem: Model | Literal["text"],
    params: tuple[Query, ...] = (),
    **more: Any,
) -> Operation:
    return Operation(summary, answers, errors, params=(_SANDBOX_ID, port, *params),
                     tags=("e2b",), problem=problem, security=_SANDBOX, reasons=_E2B_REASONS,
                     names=_E2B_NAMES, **more)  # fmt: skip


def _interpreter(summary: str, answers: Mapping[int, Model | None], errors: tuple[int, ...],
                 **more: Any) -> Operation:  # fmt: skip
    return _in_sandbox(summary, answers, (*errors, 502), port=_INTERPRETER, problem="text", **more)


def _rpc(summary: str, body: Model, answer: Model) -> Operation:
    return _in_sandbox(summary, {200: answer}, (400, 404, 415, 500, 503), port=_ENVD,
                       problem=e.ConnectError, body=body, description=_RPC_TEXT)  # fmt: skip


_UNCOVERED = _control("Not covered by sunroom's E2B API (501)", {}, (501,),
                      description=_UNCOVERED_TEXT)  # fmt: skip
_CREATE = _control("Create a sandbox (a sunroom kernel) from a template", {201: e.CreatedSandbox},
                   (404, 429, 500, 501, 503), body=CreateRequest)  # fmt: skip
_LIST = _control("The running sandboxes, oldest first (the next page's token in x-next-token)",
                 {200: e.ListedSandboxes}, (), params=_LISTING)  # fmt: skip
_CONNECT = _control("Connect to a running sandbox (its timeout extended to the one given)",
                    {200: e.CreatedSandbox}, body=TimeoutRequest)  # fmt: skip

FACADE_OPERATIONS: Final[Mapping[tuple[str, str], Operation]] = {
    ("POST", "/sandboxes"): _CREATE,
    ("POST", "/v2/sandboxes"): _CREATE,
    ("GET", "/sandboxes"): _LIST,
    ("GET", "/v2/sandboxes"): _LIST,
    ("GET", "/sandboxes/{sid}"): _control("A running sandbox", {200: e.SandboxDetail}),
    ("DELETE", "/sandboxes/{sid}"): _control("Kill a sandbox", {204: None}),
    ("POST", "/sandboxes/{sid}/timeout"): _control(
        "Set the sandbox's timeout, from now", {204: None}, body=TimeoutRequest
    ),
    ("POST", "/sandboxes/{sid}/refreshes"): _control(
        "Keep the sandbox alive longer (at least `duration` seconds from now)", {204: None},
        body=RefreshRequest,
    ),
    ("POST", "/sandboxes/{sid}/connect"): _CONNECT,
    ("POST", "/v2/sandboxes/{sid}/connect"): _CONNECT,
    **{
        (method, described): _UNCOVERED
        for path in UNCOVERED_PATHS for described in facade_paths(path)
        for method in UNCOVERED_METHODS
    },
    ("POST", "/execute"): _interpreter(
        "Run a cell in a code context, streaming its output", {200: e.ExecuteLine},
        (400, 404, 501), body=ExecuteRequest, stream="ndjson", description=_EXECUTE_TEXT,
    ),
    ("POST", "/contexts"): _interpreter(
        "Create a code context (a namespace of its own; Python only)", {200: e.CodeContext},
        (400, 501), body=CreateContextRequest,
    ),
    ("GET", "/contexts"): _interpreter("The sandbox's code contexts", {200: e.CodeContexts}, ()),
    ("POST", "/contexts/{cid}/restart"): _interpreter(
        "Restart a code context (its namespace emptied)", {200: e.Null}, (404,)
    ),
    ("DELETE", "/contexts/{cid}"): _interpreter("Remove a code context", {200: e.Null}, (404,)),
    ("GET", "/health"): _in_sandbox(
        "Whether the sandbox runs (the code interpreter's or envd's health)",
        {200: e.HealthOK, 204: None}, (502,), port=_ANY_PORT, problem=e.E2BError,
        description="envd's errors are JSON as described; the code interpreter's plain text.",
    ),
    ("GET", "/files"): _in_sandbox(
        "Read a file of the sandbox (streamed)", {200: None}, (400, 404, 500, 502), port=_ENVD,
        problem=e.E2BError, params=(_E2B_PATH, _USERNAME), stream="bytes",
    ),
    ("POST", "/files"): _in_sandbox(
        "Write files into the sandbox (multipart: each part's filename is its path when "
        "several; octet-stream: one file at `path`, optionally gzip-encoded)",
        {200: e.WrittenFiles}, (400, 413, 500, 501, 502, 507), port=_ENVD, problem=e.E2BError,
        params=(_E2B_PATH, _USERNAME), body="upload",
    ),
    ("POST", _RPC + "ListDir"): _rpc(
        "List a directory (to `depth` levels)", e.ListDirRequest, e.ListDirOut
    ),
    ("POST", _RPC + "Stat"): _rpc("A file's or directory's entry", e.PathRequest, e.EntryOut),
    ("POST", _RPC + "Remove"): _rpc(
        "Remove a file or a directory tree (nothing there: removed already)", e.PathRequest,
        e.Nothing,
    ),
    ("POST", _RPC + "{method}"): _in_sandbox(
        "envd's other filesystem RPCs (MakeDir, Move, WatchDir, the watchers): not covered (501)",
        {}, (501,), port=_ENVD, problem=e.ConnectError,
    ),
    ("POST", "/process.Process/{method}"): _in_sandbox(
        "Commands: not covered by sunroom's E2B API (501)", {}, (501,), port=_ENVD,
        problem=e.ConnectError,
    ),
}  # fmt: skip
"""The E2B facade's routes (:data:`~sunroom.service.e2b.catalog.FACADE_ROUTES`) described, by
(method, OpenAPI path of :func:`facade_paths`)."""

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


_SCHEMES: Final = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "e2bApiKey": {"type": "apiKey", "in": "header", "name": "X-API-KEY",
                  "description": "The server's token, as E2B's SDK sends its API key"},
    "e2bAccessToken": {"type": "apiKey", "in": "header", "name": "X-Access-Token",
                       "description": "A sandbox's own token (`envdAccessToken`): its routes"},
    "e2bTrafficToken": {"type": "apiKey", "in": "header", "name": "E2B-Traffic-Access-Token",
                        "description": "A sandbox's traffic token (`trafficAccessToken`)"},
}  # fmt: skip

_E2B_TAG: Final = {
    "name": "e2b",
    "description": 'E2B\'s API, for its unmodified SDK (docs/integrations.md, "E2B"): set '
    "E2B_API_URL and E2B_SANDBOX_URL to this server's URL and E2B_API_KEY to its token. Every "
    "route of this tag also answers under `/e2b` (`/e2b/v2/sandboxes` ...). The routes a "
    "sandbox serves (`/execute`, `/contexts`, `/files`, the RPCs, `/health`) are the facade's "
    "only with the `E2b-Sandbox-Id` header. A Host header this server does not serve is "
    "refused 400 with sunroom's own error body, as on every route.",
}


def _models(op: Operation) -> Iterator[Model]:
    yield from (m for m in op.answers.values() if m is not None)
    for model in (op.body, op.problem):
        if isinstance(model, type):
            yield model


def _components() -> JSON:
    """The schemas of every model the operations name. Raises ValueError on a name used twice."""
    models: set[Model] = {s.ProblemOut}
    for op in (*OPERATIONS.values(), *FACADE_OPERATIONS.values()):
        models.update(_models(op))
    ordered = sorted(models, key=lambda m: m.__name__)
    for one, other in zip(ordered, ordered[1:], strict=False):
        if one.__name__ == other.__name__:
            raise ValueError(f"two models of the API are named {one.__name__}")
    _, top = models_json_schema(
        [(m, "validation") for m in ordered], ref_template="#/components/schemas/{model}"
    )
    return {
        "schemas": top["$defs"],
        "securitySchemes": _SCHEMES,
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
    if op.stream == "ndjson" and model is not None:
        lines = {"schema": {"type": "string"}, "x-line-schema": _ref(model)}
        return {"application/x-ndjson": lines}
    if model is not None:
        return {"application/json": {"schema": _ref(model)}}
    if op.stream == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if op.stream == "bytes":
        return {"application/octet-stream": {"schema": _BYTES}}
    if op.stream == "text":
        return {"text/plain": {"schema": {"type": "string"}}}
    return {"application/json": {"schema": {"type": "object"}}}


def _body(op: Operation) -> JSON | None:
    if op.body == "bytes":
        return {"application/octet-stream": {"schema": _BYTES}}
    if op.body == "upload":
        parts = {
            "type": "object",
            "additionalProperties": _BYTES,
            "description": "One part per file (its filename is its path when several)",
        }
        return {"multipart/form-data": {"schema": parts},
                "application/octet-stream": {"schema": _BYTES}}  # fmt: skip
    if op.body is not None:
        return {"application/json": {"schema": _ref(op.body)}}
    return None


def _problem(op: Operation) -> JSON:
    if op.problem == "text":
        return {"text/plain": {"schema": {"type": "string"}}}
    return {"application/json": {"schema": _ref(op.problem)}}


def _operation(method: str, path: str, op: Operation) -> JSON:
    out: JSON = {
        "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_')}",
        "summary": op.summary,
    }
    if op.tags:
        out["tags"] = list(op.tags)
    if op.description:
        out["description"] = op.description
    names = {**_PATH_PARAMS, **op.names}
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"},
         "description": names[n]}
        for n in re.findall(r"\{(\w+)\}", path)
    ]  # fmt: skip
    params += [
        {"name": q.name, "in": "header" if q.header else "query", "required": q.required,
         "schema": dict(q.schema), "description": q.description}
        for q in op.params
    ]  # fmt: skip
    if params:
        out["parameters"] = params
    body = _body(op)
    if body is not None:
        out["requestBody"] = {"required": True, "content": body}
    responses: JSON = {
        str(status): {"description": op.summary}
        | ({} if status == 204 else {"content": _content(op, model)})
        for status, model in op.answers.items()
    }
    reasons = {**_REASONS, **op.reasons}
    errors = {400, *op.errors} | (set() if op.public else {401})
    for status in sorted(errors):
        responses[str(status)] = {"description": reasons[status], "content": _problem(op)}
    out["responses"] = responses
    if op.public:
        out["security"] = []
    elif op.security is not None:
        out["security"] = [{name: []} for name in op.security]
    return out


def _add(paths: dict[str, JSON], method: str, path: str, op: Operation | None) -> None:
    if op is None:
        raise LookupError(f"the route {method} {path} has no description")
    item = paths.setdefault(path, {})
    if method.lower() in item:
        raise LookupError(f"the route {method} {path} is described twice")
    item[method.lower()] = _operation(method, path, op)


def openapi_document(
    routes: Iterable[tuple[str, str]],
    *,
    version: str,
    facade_routes: Iterable[tuple[str, str]] = (),
) -> JSON:
    """The OpenAPI 3.1 document of *routes* ((Starlette path, method) pairs), as JSON data.

    *facade_routes* are the E2B facade's (:data:`~sunroom.service.e2b.catalog.FACADE_ROUTES`),
    described by :data:`FACADE_OPERATIONS` under the tag ``e2b``. Raises LookupError naming a
    route that :data:`OPERATIONS` (or :data:`FACADE_OPERATIONS`) does not describe, or one
    that both describe.
    """
    paths: dict[str, JSON] = {}
    for route, method in routes:
        path = openapi_path(route)
        _add(paths, method, path, OPERATIONS.get((method, path)))
    for route, method in facade_routes:
        for path in facade_paths(route):
            _add(paths, method, path, FACADE_OPERATIONS.get((method, path)))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sunroom",
            "version": version,
            "description": "Agent sessions and raw kernels over HTTP (docs/service.md), and an "
            "E2B-compatible API (the tag `e2b`; each of its routes also answers under `/e2b`).",
        },
        "tags": [_E2B_TAG],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": _components(),
    }
