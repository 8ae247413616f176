"""The ASGI application: :func:`create_app` (Starlette), served by uvicorn.

Routes (all but ``/healthz`` and ``/readyz`` need ``Authorization: Bearer <token>``):

- ``GET /healthz``: ``{"ok": true, "sessions": n, "kernels": n}`` (liveness)
- ``GET /readyz``: 200 ``{"ready": true}`` while the store answers and the server is not
  draining, else 503 (readiness; no token either)
- ``GET /openapi.json``: this API described, OpenAPI 3.1 (:mod:`sunroom.service.openapi`),
  the E2B facade's routes included
- ``GET /metrics``: Prometheus metrics (:mod:`sunroom.service.metrics`); without the token
  when ``metrics_public`` is set
- ``POST /sessions``: :class:`~.schemas.CreateSession` → 201 ``{"session_id"}``
- ``GET /sessions``: the newest session records; ``GET /sessions/{id}``: one record
- ``POST /sessions/{id}/messages``: :class:`~.schemas.MessageIn` → 202
- ``GET /sessions/{id}/events``: SSE from the log (``Last-Event-ID`` or ``?after=``; with
  ``?follow=1`` it stays open across runs, see :mod:`sunroom.service.sse`)
- ``GET /sessions/{id}/result?timeout=``: 200 with the result, or 202 while running
- ``GET /sessions/{id}/approvals``: the approval requests waiting for an answer
- ``POST /sessions/{id}/approvals/{call_id}``: :class:`~.schemas.ApprovalIn` → 200 (404 for an
  unknown request, 409 for one already answered; docs/approvals.md)
- ``DELETE /sessions/{id}``: cancel and close it → 200
- ``POST /kernels``: :class:`~.schemas.CreateKernel` → 201 ``{"kernel_id"}``
- ``POST /kernels/{id}/execute``: :class:`~.schemas.Execute` → ``ExecutionResult.to_dict()``
- ``POST /kernels/{id}/fork``: :class:`~.schemas.Fork` (``{"n": k}``, 1-64) → 201
  ``{"kernel_ids": [...], "shares_trust_domain_with": id}``: copies of the kernel's live
  state, raw kernels of their own that share its sandbox (one trust domain: hand separate
  tenants kernels of a template instead) (409 while it is busy or runs threads of its own;
  see docs/fork.md)
- ``GET /kernels/{id}``: ``{"kernel_id", "backend", "kernel_name", "sandbox", "template",
  "created_at"}`` (``kernel_name`` and ``sandbox`` are null but for the jupyter backend)
- ``GET /kernels``: ``{"kernels": [...]}``, each as ``GET /kernels/{id}`` answers, oldest
  first: the raw kernels of this server, which has one token (one tenant)
- ``DELETE /kernels/{id}``: kill it → 200
- ``PUT|GET|DELETE /kernels/{id}/files/{path}``, ``GET /kernels/{id}/files?glob=``, and the same
  under ``/sessions/{id}``: the kernel's workdir (:mod:`sunroom.service.files`)
- ``GET /`` and ``/ui/*``: the web view (:mod:`sunroom.service.webview`; off with ``ui=False``),
  whose login exchanges the token for a session cookie the routes above accept too

Errors are ``{"error": {"type", "message"}}`` with the status of
:func:`~sunroom.service.problems.status_for`; the message is one sentence and never echoes a
request's values. An unexpected exception (a bug) is a 500 ``InternalError`` whose text stays
in the log; every 5xx is logged with its traceback. A client that disconnects before its
request's body arrived (it went away, or the read deadline cut it off) is no server error: one
DEBUG line, no traceback, nothing done. On SIGTERM/SIGINT the raw kernels are closed at once and
their requests in flight answer 503 ``ShuttingDown`` (logged at INFO, no traceback).

Replicas (``advertise_url`` set, a shared store): any replica answers any request; a request
that needs the process holding a session or raw kernel is forwarded there, new work is placed
on the least loaded of a sample (:mod:`sunroom.service.forward`, :mod:`sunroom.service.cluster`),
a raw kernel whose replica died answers 409 ``KernelLost`` (``code: kernel_lost``), and
SIGTERM drains: no new work, runs get ``drain_grace_s`` to end their turn, their leases are
released so other replicas resume them at once (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
import pydantic
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sunroom import __version__
from sunroom.errors import SunroomError, UsageError
from sunroom.sandbox.functions import HostFunction, as_host_function
from sunroom.service.auth import BearerAuth, HostCheck
from sunroom.service.bodies import parse_json
from sunroom.service.cluster import Cluster
from sunroom.service.config import MAX_HEADER_BYTES, ServiceConfig
from sunroom.service.e2b import E2BFacade, E2BRoutes, Sandboxes
from sunroom.service.e2b.catalog import FACADE_ROUTES
from sunroom.service.files import file_routes
from sunroom.service.forward import ErrorAnswer, Forwarding, Router, Target
from sunroom.service.functions import load_functions
from sunroom.service.kernels import KernelManager
from sunroom.service.limits import BodyLimit, BodyTooLarge, HeaderLimit
from sunroom.service.metrics import CONTENT_TYPE, HttpMetrics, Metrics
from sunroom.service.models import resolve_model
from sunroom.service.openapi import openapi_document
from sunroom.service.problems import (
    KernelLost,
    ShuttingDown,
    error_body,
    public_message,
    retry_after,
    status_for,
    validation_message,
)
from sunroom.service.schemas import (
    ApprovalIn,
    CreateKernel,
    CreateSession,
    Execute,
    Fork,
    MessageIn,
)
from sunroom.service.sessions import ModelResolver, SessionManager
from sunroom.service.signals import Signals
from sunroom.service.sse import EventStream
from sunroom.service.templates import Templates
from sunroom.service.webview import WebView
from sunroom.store import AppendFollower, EventStore, SessionRecord

__all__ = ["create_app"]

log = logging.getLogger("sunroom.service")

M = TypeVar("M", bound=pydantic.BaseModel)
MAX_SEQ = 2**63 - 1
"""The largest event seq (SQLite's integer range)."""
Endpoint = Callable[[Request], Awaitable[Response]]


def _record_json(record: SessionRecord) -> dict[str, Any]:
    return {
        "session_id": record.session_id,
        "status": record.status,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "finished_at": record.finished_at,
        "config": record.config,
        "result": record.result,
        "owner": record.owner,
    }


async def _body(request: Request, model: type[M]) -> M:
    return model.model_validate(parse_json(await request.body()))


def _number(raw: str, *, name: str, low: float, high: float, whole: bool, unit: str) -> float:
    """A query value in ``[low, high]``. Raises UsageError naming *name* and the range."""
    message = f"{name} must be a {'whole ' if whole else ''}number from {low:g} to {high:g} {unit}"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise UsageError(message) from None
    if not low <= value <= high:  # False for NaN
        raise UsageError(message)
    return value


def create_app(
    config: ServiceConfig,
    *,
    resolve: ModelResolver = resolve_model,
    functions: Sequence[Callable[..., Any] | HostFunction] = (),
) -> Starlette:
    """The service as an ASGI app. Its lifespan opens the store and starts the managers.

    Args:
        config: must carry a token (see :meth:`ServiceConfig.with_token`).
        resolve: builds sessions' models (tests inject fakes here).
        functions: host functions for every session and kernel, besides ``config.functions``.

    Raises UsageError when the config has no token or a function cannot be loaded.
    """
    if not config.token:
        raise UsageError("the service needs a token (ServiceConfig.with_token())")
    every = [as_host_function(f) for f in functions] + load_functions(config.functions)
    service = _Service(config, resolve=resolve, functions=every)
    view = service.webview
    routes = [
        Route(path, _answered(endpoint), methods=[method])
        for path, method, endpoint in [*service.routes(), *(view.routes() if view else [])]
    ]
    open_paths = (
        "/healthz",
        "/readyz",
        *(("/metrics",) if config.metrics_public else ()),
        *(WebView.OPEN_PATHS if view else ()),
    )
    handlers: dict[Any, Callable[..., Any]] = {
        HTTPException: _on_error,
        pydantic.ValidationError: _on_error,
        SunroomError: _on_error,
        Exception: _on_error,
    }
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                HttpMetrics, metrics=service.metrics, routes=routes, facade=E2BFacade.claims
            ),
            Middleware(HeaderLimit, max_bytes=MAX_HEADER_BYTES),
            Middleware(HostCheck, allowed=config.host_allowed),
            Middleware(E2BRoutes, facade=E2BFacade(config, service.sandboxes)),
            Middleware(
                BearerAuth,
                token=config.token,
                open_paths=open_paths,
                open_prefixes=WebView.OPEN_PREFIXES if view else (),
                cookies=view.cookies if view else None,
            ),
            Middleware(
                BodyLimit, max_bytes=config.max_body_bytes, file_max_bytes=config.max_file_bytes
            ),
            Middleware(
                Forwarding,
                route=service.router,
                client=service.forward_client,
                replica_id=service.replica_id,
                answer_error=_error_answer,
                unreachable=service.unreachable,
            ),
        ],
        exception_handlers=handlers,
        lifespan=service.lifespan,
    )
    app.state.closing = service.closing
    app.state.health = service.health  # answered off the loop by server.serve's health gate
    return app


class _Service:
    """The app's endpoints over its managers, which its lifespan opens and closes.

    ``closing`` is set when the server shuts down (SSE streams end, raw kernels close).
    """

    def __init__(
        self, config: ServiceConfig, *, resolve: ModelResolver, functions: list[HostFunction]
    ) -> None:
        self.config = config
        self._resolve = resolve
        self._functions = functions
        self.closing = asyncio.Event()
        self._store: EventStore | None = None
        self._cluster: Cluster | None = None
        self._client: aiohttp.ClientSession | None = None
        self._followed = False
        self._sessions: SessionManager | None = None
        self._kernels: KernelManager | None = None
        self._openapi: bytes | None = None
        self.metrics = Metrics()
        self.sandboxes = Sandboxes(config=config, functions=functions, probe=self.metrics)
        self.webview = (
            WebView(config, store=self.store, sessions=self.sessions) if config.ui else None
        )

    def routes(self) -> list[tuple[str, str, Endpoint]]:
        """Every route: (path, method, endpoint)."""
        return [
            ("/healthz", "GET", self.healthz),
            ("/readyz", "GET", self.readyz),
            ("/openapi.json", "GET", self.openapi),
            ("/metrics", "GET", self.scrape),
            ("/sessions", "POST", self.create_session),
            ("/sessions", "GET", self.list_sessions),
            ("/sessions/{sid}", "GET", self.get_session),
            ("/sessions/{sid}", "DELETE", self.delete_session),
            ("/sessions/{sid}/messages", "POST", self.post_message),
            ("/sessions/{sid}/events", "GET", self.events),
            ("/sessions/{sid}/result", "GET", self.result),
            ("/sessions/{sid}/approvals", "GET", self.list_approvals),
            ("/sessions/{sid}/approvals/{call_id}", "POST", self.answer_approval),
            ("/kernels", "POST", self.create_kernel),
            ("/kernels", "GET", self.list_kernels),
            ("/kernels/{kid}/execute", "POST", self.execute),
            ("/kernels/{kid}/fork", "POST", self.fork_kernel),
            ("/kernels/{kid}", "GET", self.get_kernel),
            ("/kernels/{kid}", "DELETE", self.delete_kernel),
            *file_routes(self.kernels, self.sessions),
        ]

    def store(self) -> EventStore:
        """The open store (while the lifespan runs)."""
        if self._store is None:
            raise RuntimeError("the service's lifespan has not started")
        return self._store

    def sessions(self) -> SessionManager:
        """The session manager (while the lifespan runs)."""
        if self._sessions is None:
            raise RuntimeError("the service's lifespan has not started")
        return self._sessions

    def kernels(self) -> KernelManager:
        """The raw kernels' manager (while the lifespan runs)."""
        if self._kernels is None:
            raise RuntimeError("the service's lifespan has not started")
        return self._kernels

    def router(self) -> Router | None:
        """Where requests belong, while this server is a replica of a cluster (else None)."""
        cluster = self._cluster
        return self._home if cluster is not None and cluster.enabled else None

    def forward_client(self) -> aiohttp.ClientSession | None:
        """The connection pool to the other replicas (None outside a cluster)."""
        return self._client

    def unreachable(self, url: str) -> None:
        """A replica could not be reached: routing reads its record again."""
        if self._cluster is not None:
            self._cluster.unreachable(url)

    def replica_id(self) -> str:
        """The id of this replica (its owner string)."""
        return self._cluster.replica_id if self._cluster is not None else ""

    async def _home(self, target: Target) -> str | None:
        cluster = self._cluster
        assert cluster is not None
        if target.kind == "new":
            return await cluster.place()
        if target.kind == "session":
            return await cluster.session_home(target.id, here=self.sessions().is_live(target.id))
        try:
            return await cluster.kernel_home(target.id, here=self.kernels().holds(target.id))
        except KernelLost:
            if target.method == "DELETE":
                return None  # the caller lets go of it: delete_kernel forgets it
            raise

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the store and start the managers; close them all at the end."""
        config = self.config
        async with config.new_store() as store:
            self._store = store
            templates = Templates(config, probe=self.metrics)
            self._sessions = SessionManager(
                store,
                config=config,
                resolve_model=self._resolve,
                functions=self._functions,
                templates=templates,
                probe=self.metrics,
            )
            self._kernels = KernelManager(
                config=config, functions=self._functions, templates=templates
            )
            self.metrics.watch(
                raw_kernels=lambda: [str(k["backend"]) for k in self.kernels().listing()],
                sessions=lambda: [live.journal for live in self.sessions().live_sessions()],
            )
            await self.sessions().start()
            cluster = self._cluster = Cluster(
                store,
                config=config,
                replica_id=self.sessions().owner,
                load=lambda: self.sessions().live + self.kernels().live,
            )
            if cluster.enabled:
                # aiohttp: its C parser costs a fraction of httpx's CPU per forwarded request
                self._client = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=512, limit_per_host=256),
                    timeout=aiohttp.ClientTimeout(total=None, connect=2.0),
                    auto_decompress=False,
                    cookie_jar=aiohttp.DummyCookieJar(),
                )
            follower = _follow(store, self.sessions().signals)
            self._followed = follower is not None
            await cluster.start()
            await self.sandboxes.start(templates)
            stopping = asyncio.get_running_loop().create_task(
                _shut_down_on(self.closing, self.kernels()), name="sunroom-kernels-shutdown"
            )
            # a replica drains as soon as it is told to stop, while uvicorn still closes its
            # connections: its sessions are handed over without waiting for that
            draining = asyncio.get_running_loop().create_task(
                _drain_on(self.closing, cluster, self.sessions(), config.drain_grace_s),
                name="sunroom-drain",
            )
            try:
                yield
            finally:
                if not self.closing.is_set():  # a kernel shutdown under way is never cut short
                    stopping.cancel()
                await asyncio.wait([stopping])
                if not stopping.cancelled() and stopping.exception() is not None:
                    log.error("closing the raw kernels failed", exc_info=stopping.exception())
                if not self.closing.is_set():
                    draining.cancel()
                await asyncio.wait([draining])
                if not draining.cancelled() and draining.exception() is not None:
                    log.error("draining the sessions failed", exc_info=draining.exception())
                await self.kernels().aclose()
                await self.sandboxes.aclose()
                await self.sessions().aclose()  # at once unless drained (then a no-op)
                await cluster.aclose()
                if follower is not None:
                    follower.cancel()
                    await asyncio.wait([follower])
                if self._client is not None:
                    await self._client.close()
                await templates.aclose()

    def health(self) -> dict[str, Any]:
        """The body of ``/healthz``. Only reads counts: safe from the health gate's thread.

        ``sessions``: live here (holding or starting a kernel; what ``max_sessions`` counts),
        ``sessions_idle``: of those, idle (released first under pressure, or after
        ``session_idle_s``), ``sessions_released``: released while idle since the start (in
        the store, resumed by their next message; not counted), ``kernels``: raw kernels.
        """
        ok = self._sessions is not None
        return {
            "ok": ok,
            "sessions": self.sessions().live if ok else 0,
            "sessions_idle": self.sessions().idle_count if ok else 0,
            "sessions_released": self.sessions().released if ok else 0,
            "kernels": self.kernels().live if ok else 0,
            "e2b_sandboxes": self.sandboxes.live,
        }

    async def healthz(self, request: Request) -> Response:
        return JSONResponse(self.health())

    async def readyz(self, request: Request) -> Response:
        """Ready: the store answers within 2 s and the server is not draining or closing."""
        if self.closing.is_set() or (self._cluster is not None and self._cluster.draining):
            return JSONResponse({"ready": False, "reason": "draining"}, status_code=503)
        try:
            await asyncio.wait_for(self.store().get_session("readyz"), 2.0)
        except Exception as exc:
            log.warning("readiness: the store did not answer: %s", exc)
            return JSONResponse({"ready": False, "reason": "store"}, status_code=503)
        return JSONResponse({"ready": True})

    async def openapi(self, request: Request) -> Response:
        if self._openapi is None:  # built once, from the routes this app serves
            routes = [(path, method) for path, method, _ in self.routes()]
            document = openapi_document(routes, version=__version__, facade_routes=FACADE_ROUTES)
            self._openapi = json.dumps(document, separators=(",", ":")).encode()
        return Response(self._openapi, media_type="application/json")

    async def scrape(self, request: Request) -> Response:
        await self.metrics.refresh(self.store())
        return Response(self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def create_session(self, request: Request) -> Response:
        body = await _body(request, CreateSession)
        if body.files:  # they name paths on this host: for its own user (sunroom run), not clients
            raise UsageError(
                "files: the service binds no host files for its clients; send the data in "
                "inputs (values) or write it with the kernel's file routes"
            )
        scripted = body.model is not None and body.model.startswith("scripted:")
        if scripted and body.model != self.config.model:  # it names a file: clients must not pick
            raise UsageError(
                "a session may name a scripted: model only when the server was started "
                "with that model (sunroom serve --model scripted:PATH)"
            )
        sid = await self.sessions().create(body, background=True)
        return JSONResponse({"session_id": sid}, status_code=201)

    async def list_sessions(self, request: Request) -> Response:
        raw = request.query_params.get("limit", "100")
        limit = _number(raw, name="limit", low=1, high=1000, whole=True, unit="(sessions)")
        records = await self.store().list_sessions(limit=int(limit))
        return JSONResponse({"sessions": [_record_json(r) for r in records]})

    async def get_session(self, request: Request) -> Response:
        return JSONResponse(_record_json(await self.sessions().get(request.path_params["sid"])))

    async def post_message(self, request: Request) -> Response:
        body = await _body(request, MessageIn)
        await self.sessions().send(request.path_params["sid"], body.text)
        return JSONResponse({"accepted": True}, status_code=202)

    async def events(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        await self.sessions().get(sid)  # 404 before the stream starts
        header = request.headers.get("last-event-id")
        name = "Last-Event-ID" if header else "after"
        raw = header or request.query_params.get("after") or "0"
        after = int(_number(raw, name=name, low=0, high=MAX_SEQ, whole=True, unit="(an event seq)"))
        follow = request.query_params.get("follow", "0")
        if follow not in ("0", "1"):
            raise UsageError("follow must be 0 or 1")
        stream = EventStream(
            store=self.store(),
            signals=self.sessions().signals,
            config=self.config,
            sid=sid,
            after=after,
            closing=self.closing,
            # a following reader (the web view) waits across runs: it must not pin the session
            hold=None if follow == "1" else lambda: self.sessions().holding(sid),
            followed=self._followed,
            follow=follow == "1",
        )
        return _Raw(stream)

    async def result(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        raw = request.query_params.get("timeout", "0")
        timeout = _number(raw, name="timeout", low=0, high=3600, whole=False, unit="seconds")
        status, value = await self.sessions().result(sid, timeout_s=timeout)
        body = {"session_id": sid, "status": status, "result": value}
        return JSONResponse(body, status_code=202 if status == "running" else 200)

    async def list_approvals(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        approvals = await self.sessions().approvals(sid)
        return JSONResponse({"session_id": sid, "approvals": approvals})

    async def answer_approval(self, request: Request) -> Response:
        sid, call_id = request.path_params["sid"], request.path_params["call_id"]
        body = await _body(request, ApprovalIn)
        await self.sessions().approve(
            sid, call_id, allow=body.allow, reason=body.reason, lease=body.lease
        )
        return JSONResponse({"session_id": sid, "call_id": call_id, "allow": body.allow})

    async def delete_session(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        await self.sessions().delete(sid)
        return JSONResponse({"session_id": sid, "deleted": True})

    async def create_kernel(self, request: Request) -> Response:
        with self.kernels().admitted():
            kid = await self.kernels().create(await _body(request, CreateKernel))
        await self._place([kid])
        return JSONResponse({"kernel_id": kid}, status_code=201)

    async def _place(self, kids: list[str]) -> None:
        """Record (in a cluster) that these raw kernels live on this replica."""
        cluster = self._cluster
        if cluster is None or not cluster.enabled:
            return
        for kid in kids:
            try:
                await self.store().place_kernel(kid, replica_id=cluster.replica_id)
            except Exception:  # it still runs here; other replicas answer 404 for it
                log.exception("recording where kernel %s lives failed", kid)

    async def execute(self, request: Request) -> Response:
        with self.kernels().admitted():
            body = await _body(request, Execute)
            kid = request.path_params["kid"]
            backend = str(self.kernels().describe(kid)["backend"])
            out = await self.kernels().execute(kid, body.code, timeout_s=body.timeout_s)
            self.metrics.executed(backend, out.duration_s)
        return JSONResponse(out.to_dict())

    async def fork_kernel(self, request: Request) -> Response:
        with self.kernels().admitted():
            body = await _body(request, Fork)
            ids = await self.kernels().fork(request.path_params["kid"], body.n)
        await self._place(ids)
        # the copies share the kernel's sandbox: one trust domain, never separate tenants
        answer = {"kernel_ids": ids, "shares_trust_domain_with": request.path_params["kid"]}
        return JSONResponse(answer, status_code=201)

    async def list_kernels(self, request: Request) -> Response:
        return JSONResponse({"kernels": self.kernels().listing()})

    async def get_kernel(self, request: Request) -> Response:
        return JSONResponse(self.kernels().describe(request.path_params["kid"]))

    async def delete_kernel(self, request: Request) -> Response:
        kid = request.path_params["kid"]
        cluster = self._cluster
        if cluster is not None and cluster.enabled:
            cluster.forget_kernel(kid)
            if not self.kernels().holds(kid) and await self.store().forget_kernel(kid):
                return JSONResponse({"kernel_id": kid, "deleted": True})  # a lost kernel
            await self.kernels().delete(kid)
            await self.store().forget_kernel(kid)
            return JSONResponse({"kernel_id": kid, "deleted": True})
        await self.kernels().delete(kid)
        return JSONResponse({"kernel_id": kid, "deleted": True})


async def _on_error(request: Request, exc: Exception) -> Response:
    """The JSON error answer to *exc* (the module docstring says which status and text)."""
    if isinstance(exc, ClientDisconnect):  # the client went away: not the server's failure
        log.debug("%s %s: the client disconnected before its request arrived",
                  request.method, request.url.path)  # fmt: skip
        return Response(status_code=400)  # never sent: nobody is left to read it
    if isinstance(exc, BodyTooLarge):  # close: the rest of the body is never read
        body = error_body("BodyTooLarge", str(exc))
        return JSONResponse(body, status_code=413, headers={"Connection": "close"})
    if isinstance(exc, HTTPException):
        body = error_body("HTTPException", str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
    if isinstance(exc, pydantic.ValidationError):
        body = error_body("ValidationError", validation_message(exc))
        return JSONResponse(body, status_code=422)
    status = status_for(exc)
    if isinstance(exc, ShuttingDown):  # an expected end: no traceback
        log.info("%s %s: answered 503, the server is shutting down",
                 request.method, request.url.path)  # fmt: skip
    elif status >= 500:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    if not isinstance(exc, SunroomError):  # a bug: its text is for the log, not the client
        message = "the server failed unexpectedly; its log has the details"
        body = error_body("InternalError", message)
        return JSONResponse(body, status_code=500)
    message = public_message(exc) if status >= 500 else str(exc)  # no traceback or path
    wait = retry_after(exc)
    headers = {"Retry-After": str(wait)} if wait is not None else None
    body = error_body(
        type(exc).__name__, message, code=exc.code if isinstance(exc, KernelLost) else None
    )
    return JSONResponse(body, status_code=status, headers=headers)


def _answered(endpoint: Endpoint) -> Endpoint:
    """*endpoint*, answering an unexpected exception itself: logged once, never re-raised.

    (Starlette's handler for ``Exception`` re-raises, so the server would log it again.)
    """

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (HTTPException, pydantic.ValidationError, SunroomError):
            raise  # answered by the exception handlers below
        except Exception as exc:
            return await _on_error(request, exc)

    return run


def _error_answer(exc: BaseException) -> ErrorAnswer:
    """*exc* (raised while routing a request to its replica) as the app answers it."""
    if not isinstance(exc, SunroomError):
        log.error("routing a request to its replica failed", exc_info=exc)
        message = "the server failed unexpectedly; its log has the details"
        return 500, error_body("InternalError", message), []
    status = status_for(exc)
    if status >= 500:
        log.error("routing a request to its replica failed", exc_info=exc)
    message = public_message(exc) if status >= 500 else str(exc)
    wait = retry_after(exc)
    headers = [(b"retry-after", str(wait).encode())] if wait is not None else []
    code = exc.code if isinstance(exc, KernelLost) else None
    return status, error_body(type(exc).__name__, message, code=code), headers


def _follow(store: EventStore, signals: Signals) -> asyncio.Task[None] | None:
    """Wake SSE readers on every process's appends, when the store can tell (PostgreSQL)."""
    follow = getattr(store, "follow", None)
    if follow is None:
        return None

    def woken(sid: str) -> None:
        if sid == "*":
            signals.fire_all()
        else:
            signals.fire(sid)

    follower: AppendFollower = store  # type: ignore[assignment]
    return asyncio.get_running_loop().create_task(
        follower.follow(woken), name="sunroom-follow-appends"
    )


async def _drain_on(
    closing: asyncio.Event, cluster: Cluster, sessions: SessionManager, grace_s: float
) -> None:
    """Once *closing* is set, drain a replica: no new work, runs end or are handed over.

    Outside a cluster this does nothing (a lone server stops its runs at once, as before).
    """
    await closing.wait()
    if not cluster.enabled:
        return
    cluster.drain()
    await _drain_runs(sessions, grace_s)
    await sessions.aclose()  # stops what is left and releases every lease


async def _drain_runs(sessions: SessionManager, grace_s: float) -> None:
    """Give the runs in progress up to *grace_s* to end their turn (a drain, on SIGTERM)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while loop.time() < deadline:
        busy = [live for live in sessions.live_sessions() if not live.idle.is_set()]
        if not busy:
            return
        await asyncio.sleep(0.05)
    left = len([s for s in sessions.live_sessions() if not s.idle.is_set()])
    log.warning("drain: %d runs did not end within %g s; they stop and resume elsewhere",
                left, grace_s)  # fmt: skip


async def _shut_down_on(closing: asyncio.Event, kernels: KernelManager) -> None:
    """Once *closing* is set (SIGTERM/SIGINT), close the raw kernels at once.

    Their requests in flight answer 503 ``ShuttingDown`` within the server's graceful period,
    instead of being cancelled when it runs out (a ``CancelledError`` traceback per request).
    """
    await closing.wait()
    await kernels.shut_down()


class _Raw(Response):
    """A response that hands the connection to a raw ASGI callable (the SSE stream)."""

    def __init__(self, inner: EventStream) -> None:
        super().__init__()
        self._inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._inner(scope, receive, send)
