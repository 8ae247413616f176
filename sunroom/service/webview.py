"""The web view's routes: the page, its files, the login and the reads it needs.

``GET /`` is the page (``sunroom/service/ui/static``, shipped in the package; no CDN). It holds
no data: without a login it shows only its form, which posts the token once to ``POST
/ui/login`` for a session cookie (:mod:`sunroom.service.login`); the page then calls the API
with that cookie. The routes here:

- ``GET /`` and ``GET /ui/static/{name}``: the page and its files (open, no data in them)
- ``POST /ui/login`` ``{"token"}``: 200 and the cookie, 401 for a wrong token, 429 after too
  many (per client address), 403 from another origin
- ``POST /ui/logout``: 200 and the cookie dropped
- ``GET /ui/me``: 200 while logged in (401 otherwise, from the auth middleware)
- ``GET /ui/api/sessions?limit=``: the newest sessions with what the list shows (status,
  preset, model, task, times, turns, model calls, tokens, cost)
- ``GET /ui/api/sessions/{id}/log?after=&limit=``: the session's events as SSE would send
  them, in one JSON answer (the page's first view; then it follows the SSE stream)
- ``GET /ui/frame/{id}/{seq}/{index}``: an HTML display output of a cell, as a document of
  its own under ``Content-Security-Policy: sandbox allow-scripts`` (an opaque origin: its
  scripts cannot read the page, the cookie or the API)

Every answer carries ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store``;
the page and its files a strict CSP (no inline script, frames only from this server).
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sunroom.agent.budget import Spend
from sunroom.errors import UsageError
from sunroom.service.bodies import parse_json
from sunroom.service.config import ServiceConfig
from sunroom.service.journal import TRANSCRIPT
from sunroom.service.login import COOKIE, CookieSigner, LoginThrottle, same_origin
from sunroom.service.problems import NotFoundError, error_body
from sunroom.service.sessions import SessionManager
from sunroom.store import EventStore, SessionRecord

__all__ = ["PAGE_CSP", "STATIC_DIR", "WebView"]

STATIC_DIR: Final = Path(__file__).parent / "ui" / "static"
"""Where the page's files are (inside the package)."""

PAGE_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
"""The page's Content-Security-Policy: nothing inline, nothing from elsewhere."""

FRAME_CSP: Final = (
    "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; font-src data:; frame-ancestors 'self'"
)
"""An HTML output's policy: an opaque origin that may run its own inline scripts and styles,
load nothing and connect nowhere."""

MAX_LOG_EVENTS: Final = 20_000
"""The most events one ``/log`` answer holds (``more`` says when there are others)."""

_BASE_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
_PAGE_HEADERS: Final = {
    **_BASE_HEADERS,
    "Content-Security-Policy": PAGE_CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_TYPES: Final = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

Endpoint = Callable[[Request], Awaitable[Response]]


@final
class WebView:
    """The web view's endpoints over the service's store and session manager.

    Args:
        config: the service's settings (the token signs cookies; ``ui_session_s``).
        store: the open store (a callable: it exists once the app's lifespan runs).
        sessions: the session manager (likewise).
        static_dir: the page's files.
    """

    def __init__(
        self,
        config: ServiceConfig,
        *,
        store: Callable[[], EventStore],
        sessions: Callable[[], SessionManager],
        static_dir: Path = STATIC_DIR,
    ) -> None:
        self._config = config
        self._store = store
        self._sessions = sessions
        self.cookies = CookieSigner(config.token, lifetime_s=config.ui_session_s)
        self._throttle = LoginThrottle()
        self._files = _load(static_dir)

    def routes(self) -> list[tuple[str, str, Endpoint]]:
        """The web view's routes: (path, method, endpoint)."""
        return [
            ("/", "GET", self.page),
            ("/ui/static/{name:path}", "GET", self.static),
            ("/ui/login", "POST", self.login),
            ("/ui/logout", "POST", self.logout),
            ("/ui/me", "GET", self.me),
            ("/ui/api/sessions", "GET", self.list_sessions),
            ("/ui/api/sessions/{sid}/log", "GET", self.log),
            ("/ui/frame/{sid}/{seq:int}/{index:int}", "GET", self.frame),
        ]

    OPEN_PATHS: Final = ("/", "/ui/login", "/ui/logout")
    OPEN_PREFIXES: Final = ("/ui/static/",)

    async def page(self, request: Request) -> Response:
        """The page (``index.html``)."""
        return self._file("index.html")

    async def static(self, request: Request) -> Response:
        """One of the page's files (404 for any other name)."""
        return self._file(request.path_params["name"])

    def _file(self, name: str) -> Response:
        found = self._files.get(name)
        if found is None:
            body = error_body("NotFound", "no such file in the web view")
            return JSONResponse(body, status_code=404, headers=_BASE_HEADERS)
        data, media = found
        return Response(data, media_type=media, headers=_PAGE_HEADERS)

    async def login(self, request: Request) -> Response:
        """Exchange the token for a session cookie (see the module docstring)."""
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and not same_origin(origin, host, request.url.scheme):
            message = "log in from this server's own page"
            return JSONResponse(error_body("CsrfRefused", message), 403, headers=_BASE_HEADERS)
        client = request.client.host if request.client is not None else ""
        wait = self._throttle.retry_after(client)
        if wait is not None:
            message = "too many wrong tokens from this address; wait and try again"
            headers = {**_BASE_HEADERS, "Retry-After": str(max(1, round(wait)))}
            return JSONResponse(error_body("TooManyLogins", message), 429, headers=headers)
        body = parse_json(await request.body())
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not self.cookies.matches_token(token):
            self._throttle.failed(client)
            message = "that is not this server's token"
            return JSONResponse(error_body("Unauthorized", message), 401, headers=_BASE_HEADERS)
        response = JSONResponse({"logged_in": True}, headers=_BASE_HEADERS)
        response.set_cookie(
            COOKIE,
            self.cookies.issue(),
            max_age=int(self.cookies.lifetime_s),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        """Drop the session cookie from the browser."""
        response = JSONResponse({"logged_in": False}, headers=_BASE_HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def me(self, request: Request) -> Response:
        """200: the request carried a valid login (the auth middleware answered the others)."""
        return JSONResponse({"logged_in": True}, headers=_BASE_HEADERS)

    async def list_sessions(self, request: Request) -> Response:
        """The newest sessions (``limit``, 1-1000, default 200) with the list's columns."""
        limit = _whole(request.query_params.get("limit", "200"), "limit", 1, 1000)
        records = await self._store().list_sessions(limit=limit)
        live = {s.sid: s for s in self._sessions().live_sessions()}
        rows = []
        for record in records:
            held = live.get(record.session_id)
            spend = held.session.tracker.snapshot() if held is not None else None
            rows.append(self._summary(record, spend))
        return JSONResponse({"sessions": rows}, headers=_BASE_HEADERS)

    def _summary(self, record: SessionRecord, spend: Spend | None) -> dict[str, object]:
        config = record.config
        result = record.result if isinstance(record.result, dict) else None
        if result is not None and "usage" not in result:
            result = None  # a failure record ({"error": ...}), not a run's result
        task = config.get("task")
        row: dict[str, object] = {
            "session_id": record.session_id,
            "status": record.status,
            "preset": config.get("preset"),
            "model": config.get("model") or self._config.model,
            "task": task[:200] if isinstance(task, str) else None,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "finished_at": record.finished_at,
            "turns": None,
            "model_calls": None,
            "sub_calls": None,
            "input_tokens": None,
            "output_tokens": None,
            "cost_micro_usd": None,
        }
        if record.status == "running" and spend is not None:
            row.update(
                model_calls=spend.model_calls,
                sub_calls=spend.sub_calls,
                input_tokens=spend.usage.input_tokens,
                output_tokens=spend.usage.output_tokens,
                cost_micro_usd=spend.cost_micro_usd if spend.cost_known else None,
            )
        elif result is not None:
            usage = result.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            row.update(
                turns=result.get("turns"),
                model_calls=result.get("model_calls"),
                sub_calls=result.get("sub_calls"),
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
                cost_micro_usd=result.get("cost_micro_usd"),
            )
        return row

    async def log(self, request: Request) -> Response:
        """The session's events after ``after`` (at most ``limit``), as SSE's ``data``."""
        sid = request.path_params["sid"]
        if await self._store().get_session(sid) is None:
            raise NotFoundError("no such session")
        after = _whole(request.query_params.get("after", "0"), "after", 0, 2**63 - 1)
        limit = _whole(
            request.query_params.get("limit", str(MAX_LOG_EVENTS)), "limit", 1, MAX_LOG_EVENTS
        )
        batch = await self._store().events(sid, after_seq=after, limit=limit)
        events = [
            {"seq": e.seq, "ts": e.ts, "type": e.kind, **e.payload}
            for e in batch
            if e.kind != TRANSCRIPT
        ]
        body = {
            "events": events,
            "last_seq": batch[-1].seq if batch else after,
            "more": len(batch) == limit,
        }
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        return Response(data, media_type="application/json", headers=_BASE_HEADERS)

    async def frame(self, request: Request) -> Response:
        """HTML output *index* of the cell whose ``ExecutionFinished`` is event *seq*."""
        sid = request.path_params["sid"]
        seq, index = request.path_params["seq"], request.path_params["index"]
        batch = await self._store().events(sid, after_seq=max(seq - 1, 0), limit=1)
        html = None
        if batch and batch[0].seq == seq and batch[0].kind == "ExecutionFinished":
            outputs = batch[0].payload.get("outputs")
            if isinstance(outputs, list) and 0 <= index < len(outputs):
                item = outputs[index]
                data = item.get("data") if isinstance(item, dict) else None
                html = data.get("text/html") if isinstance(data, dict) else None
        if isinstance(html, list) and all(isinstance(line, str) for line in html):
            html = "".join(html)  # a notebook's list of lines
        if not isinstance(html, str):
            raise NotFoundError("no such HTML output")
        headers = {
            **_BASE_HEADERS,
            "Content-Security-Policy": FRAME_CSP,
            "Referrer-Policy": "no-referrer",
            "Cross-Origin-Resource-Policy": "same-origin",
        }
        return Response(html, media_type="text/html", headers=headers)


def _whole(raw: str, name: str, low: int, high: int) -> int:
    """A whole number in ``[low, high]`` from a query value; UsageError naming *name*."""
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise UsageError(f"{name} must be a whole number from {low} to {high}")
    return value


def _load(root: Path) -> dict[str, tuple[bytes, str]]:
    """Every file under *root* (read once: the page is a few small files), by relative name."""
    files: dict[str, tuple[bytes, str]] = {}
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        name = path.relative_to(root).as_posix()
        media = _TYPES.get(path.suffix) or mimetypes.guess_type(name)[0]
        files[name] = (path.read_bytes(), media or "application/octet-stream")
    return files
