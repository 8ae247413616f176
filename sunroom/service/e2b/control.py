"""The control-plane routes of the E2B facade: sandboxes created, listed, timed and killed.

The subset of E2B's REST API (``api.e2b.app``) its SDK's ``Sandbox`` class uses, with E2B's
JSON field names (``templateID``, ``sandboxID``, ``envdAccessToken`` ...):

* ``POST /sandboxes`` and ``/v2/sandboxes`` (201, the sandbox with its tokens),
* ``GET /sandboxes`` and ``/v2/sandboxes`` (``metadata`` filter as ``k=v&k2=v2``, ``state``,
  ``limit`` up to :data:`MAX_PAGE`, ``nextToken``; the next page's token in ``x-next-token``),
* ``GET /sandboxes/{id}``, ``DELETE /sandboxes/{id}`` (204),
* ``POST /sandboxes/{id}/timeout`` (204), ``/refreshes`` (204), ``/connect`` and
  ``/v2/sandboxes/{id}/connect`` (200, the sandbox with its tokens).

Every other route of E2B's API (pause, resume, snapshots, fork, network, metrics, logs,
templates, volumes, secrets) answers 501 with a sentence saying so. Errors are E2B's JSON
``{"code": status, "message": ...}``. A create that asks for what sandboxes here cannot give
(internet access, MCP, IAM, volumes, auto-pause, egress rules) is refused with 501 rather than
granted in part.
"""

from __future__ import annotations

import datetime
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sunroom.errors import UsageError
from sunroom.service.bodies import parse_json
from sunroom.service.e2b.catalog import UNCOVERED_METHODS, UNCOVERED_PATHS
from sunroom.service.e2b.sandboxes import ENVD_VERSION, Sandbox, Sandboxes
from sunroom.service.problems import Unsupported

__all__ = ["MAX_PAGE", "control_routes"]

MAX_PAGE: Final = 100
"""Sandboxes one page of a listing holds at most (and by default)."""

CLIENT_ID: Final = "sunroom"


class NetworkRequest(pydantic.BaseModel):
    """E2B's ``network`` option; only ``allowPublicTraffic`` is honoured (always token-guarded)."""

    model_config = pydantic.ConfigDict(extra="allow")

    allowPublicTraffic: bool | None = None  # noqa: N815 - E2B's JSON name


class CreateRequest(pydantic.BaseModel):
    """The body of ``POST /sandboxes`` (E2B's ``NewSandbox``)."""

    model_config = pydantic.ConfigDict(extra="ignore")

    templateID: str = pydantic.Field(min_length=1, max_length=256)  # noqa: N815
    timeout: int | None = None
    metadata: dict[str, str] = pydantic.Field(default_factory=dict)
    envVars: dict[str, str] = pydantic.Field(default_factory=dict)  # noqa: N815
    allow_internet_access: bool | None = None
    autoPause: bool | None = None  # noqa: N815
    autoResume: Any = None  # noqa: N815
    secure: bool | None = None
    network: NetworkRequest | None = None
    mcp: Any = None
    iam: Any = None
    volumeMounts: Any = None  # noqa: N815


class TimeoutRequest(pydantic.BaseModel):
    """The body of ``POST /sandboxes/{id}/timeout`` and ``/connect``."""

    model_config = pydantic.ConfigDict(extra="ignore")

    timeout: int | None = None


class RefreshRequest(pydantic.BaseModel):
    """The body of ``POST /sandboxes/{id}/refreshes``."""

    model_config = pydantic.ConfigDict(extra="ignore")

    duration: int | None = None


def control_routes(sandboxes: Sandboxes) -> list[Route]:
    """The control-plane routes (the server token is checked before they run)."""
    api = _Control(sandboxes)
    routes = [
        Route("/sandboxes", api.create, methods=["POST"]),
        Route("/v2/sandboxes", api.create, methods=["POST"]),
        Route("/sandboxes", api.list, methods=["GET"]),
        Route("/v2/sandboxes", api.list, methods=["GET"]),
        Route("/sandboxes/{sid}", api.get, methods=["GET"]),
        Route("/sandboxes/{sid}", api.kill, methods=["DELETE"]),
        Route("/sandboxes/{sid}/timeout", api.timeout, methods=["POST"]),
        Route("/sandboxes/{sid}/refreshes", api.refresh, methods=["POST"]),
        Route("/sandboxes/{sid}/connect", api.connect, methods=["POST"]),
        Route("/v2/sandboxes/{sid}/connect", api.connect, methods=["POST"]),
    ]
    methods = list(UNCOVERED_METHODS)
    routes += [Route(path, api.uncovered, methods=methods) for path in UNCOVERED_PATHS]
    return routes


def _time(ts: float) -> str:
    stamp = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _created(sandbox: Sandbox) -> dict[str, Any]:
    """E2B's ``Sandbox``: what create and connect answer (the tokens included)."""
    return {
        "templateID": sandbox.template_id,
        "sandboxID": sandbox.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.envd_token,
        "trafficAccessToken": sandbox.traffic_token,
    }


def _listed(sandbox: Sandbox) -> dict[str, Any]:
    """E2B's ``ListedSandbox`` (no tokens)."""
    limits = sandbox.default.kernel.limits
    return {
        "templateID": sandbox.template_id,
        "sandboxID": sandbox.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": _time(sandbox.started_at),
        "endAt": _time(sandbox.end_at),
        "cpuCount": 1,
        "memoryMB": limits.memory_mb,
        "diskSizeMB": limits.disk_mb,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": dict(sandbox.metadata),
    }


def _metadata_filter(raw: str | None) -> Mapping[str, str]:
    if not raw:
        return {}
    return dict(urllib.parse.parse_qsl(raw, keep_blank_values=True))


class _Control:
    def __init__(self, sandboxes: Sandboxes) -> None:
        self._sandboxes = sandboxes

    async def create(self, request: Request) -> Response:
        body = CreateRequest.model_validate(parse_json(await request.body()))
        _refuse_uncovered(body)
        sandbox = await self._sandboxes.create(
            body.templateID, timeout_s=body.timeout, metadata=body.metadata, envs=body.envVars
        )
        return JSONResponse(_created(sandbox), status_code=201)

    async def list(self, request: Request) -> Response:
        query = request.query_params
        wanted = _metadata_filter(query.get("metadata"))
        states = {s for s in query.get("state", "running").split(",") if s}
        template = query.get("template")
        found = [
            s
            for s in self._sandboxes.listing()
            if "running" in states
            and all(s.metadata.get(k) == v for k, v in wanted.items())
            and (template is None or s.template_id == template)
        ]
        if query.get("order") == "desc":
            found.reverse()
        limit = _limit(query.get("limit"))
        start = 0
        token = query.get("nextToken")
        if token:
            ids = [s.sandbox_id for s in found]
            start = ids.index(token) if token in ids else len(found)
        page = found[start : start + limit]
        headers = {}
        if start + limit < len(found):
            headers["x-next-token"] = found[start + limit].sandbox_id
        return JSONResponse([_listed(s) for s in page], headers=headers)

    async def get(self, request: Request) -> Response:
        sandbox = self._sandboxes.get(request.path_params["sid"])
        detail = _listed(sandbox)
        detail["envdAccessToken"] = sandbox.envd_token
        detail["allowInternetAccess"] = False
        return JSONResponse(detail)

    async def kill(self, request: Request) -> Response:
        await self._sandboxes.kill(request.path_params["sid"])
        return Response(status_code=204)

    async def timeout(self, request: Request) -> Response:
        body = TimeoutRequest.model_validate(parse_json(await request.body()))
        if body.timeout is None:
            raise UsageError("the body must name the new timeout in seconds")
        self._sandboxes.set_timeout(request.path_params["sid"], body.timeout)
        return Response(status_code=204)

    async def refresh(self, request: Request) -> Response:
        body = RefreshRequest.model_validate(parse_json(await request.body()))
        self._sandboxes.connect(request.path_params["sid"], body.duration)
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        body = TimeoutRequest.model_validate(parse_json(await request.body()))
        sandbox = self._sandboxes.connect(request.path_params["sid"], body.timeout)
        return JSONResponse(_created(sandbox))

    async def uncovered(self, request: Request) -> Response:
        raise Unsupported(
            f"sunroom's E2B API does not cover {request.method} {request.url.path[:120]} "
            "(docs/integrations.md lists what it covers)"
        )


def _limit(raw: str | None) -> int:
    if raw is None:
        return MAX_PAGE
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PAGE:
        raise UsageError(f"limit must be a whole number from 1 to {MAX_PAGE}")
    return value


def _refuse_uncovered(body: CreateRequest) -> None:
    """Refuse, rather than ignore, what a sandbox here cannot be given."""
    asked = []
    if body.allow_internet_access:
        asked.append("internet access (sandboxes here have no network)")
    if body.autoPause:
        asked.append("auto-pause")
    if body.mcp:
        asked.append("an MCP gateway")
    if body.iam:
        asked.append("workload identity")
    if body.volumeMounts:
        asked.append("volumes")
    if body.network is not None and body.network.model_extra:
        asked.append("network rules")
    if asked:
        raise Unsupported(f"sunroom's E2B API cannot give a sandbox {', '.join(asked)}")
