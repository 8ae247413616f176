"""The service's Prometheus metrics: :class:`Metrics` (one registry per app), :class:`HttpMetrics`.

Each app owns its :class:`Metrics` and its own ``CollectorRegistry`` (never the process-wide
default one: several servers may run in one process, and each reports only its own work).
``GET /metrics`` answers :meth:`Metrics.exposition` in Prometheus' text format.
docs/observability.md lists every metric; in short:

- counted as work happens: cells (``sunroom_execute_seconds{backend}``: raw-kernel executes
  and session cells, by the kernel's own duration), session host calls
  (``sunroom_host_call_seconds{function}``), session model calls, tokens and cost
  (``sunroom_model_*_total{provider,model}``, from the sessions' ``UsageUpdated`` totals),
  sessions taken over from another owner (``sunroom_lease_handovers_total``), warm-pool claims
  (``sunroom_warm_pool_{hits,misses}_total{pool}``, ``sunroom_kernel_claim_seconds{pool}``),
  and every HTTP answer of the app (``sunroom_http_requests_total{method,route,status}``,
  ``sunroom_http_429_total{route}``), by :class:`HttpMetrics`;
- read when scraped: the kernels this process runs (``sunroom_kernels{backend}``), its live
  sessions (``sunroom_sessions_live``) and the store's sessions by status
  (``sunroom_sessions{status}``: one bounded query per status, saturating at
  :data:`SESSION_COUNT_CAP`, because the store has no count query).

The inner parts (session manager and resume, templates, E2B sandboxes) report through the
:class:`~sunroom.service.probes.Probe` seam, which this class implements; nothing in
``sunroom.agent``, ``sunroom.sandbox`` or ``sunroom.providers`` knows about Prometheus.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sunroom.agent import events as ev
from sunroom.agent.budget import Spend
from sunroom.service.probes import EventObserver
from sunroom.store import EventStore, SessionStatus

__all__ = [
    "CONTENT_TYPE",
    "SESSION_COUNT_CAP",
    "SESSION_STATUSES",
    "HttpMetrics",
    "Metrics",
    "split_model",
]

log = logging.getLogger("sunroom.service")

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
"""The content type of :meth:`Metrics.exposition` (Prometheus' text format)."""

SESSION_COUNT_CAP: Final = 1000
"""``sunroom_sessions{status}`` counts at most this many sessions per status (a bound on the
scrape's cost: the store lists them, it has no count query)."""

SESSION_STATUSES: Final[tuple[SessionStatus, ...]] = (
    "running",
    "finished",
    "failed",
    "cancelled",
    "interrupted",
)
"""The statuses ``sunroom_sessions`` reports."""

_SECONDS_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                           60.0, 120.0, 300.0)  # fmt: skip


def split_model(spec: str) -> tuple[str, str]:
    """``(provider, model)`` of a session's ``provider:name`` model spec.

    The provider is ``""`` when the spec names none.
    """
    provider, sep, name = spec.partition(":")
    return (provider, name) if sep else ("", spec)


@final
class Metrics:
    """Every metric of one app, in its own :attr:`registry` (see the module docstring).

    Implements :class:`~sunroom.service.probes.Probe`. Call :meth:`watch` once the managers
    exist, so that scrapes can count their kernels and sessions.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.execute_seconds = Histogram(
            "sunroom_execute_seconds",
            "Cells run (raw-kernel executes and session cells), by the kernel's duration.",
            ["backend"], registry=r, buckets=_SECONDS_BUCKETS,
        )  # fmt: skip
        self.host_call_seconds = Histogram(
            "sunroom_host_call_seconds",
            "Host function calls made by sessions' kernels, by how long each took.",
            ["function"], registry=r, buckets=_SECONDS_BUCKETS,
        )  # fmt: skip
        self.model_calls = Counter(
            "sunroom_model_calls", "Model calls made by sessions (sub-calls included).",
            ["provider", "model"], registry=r,
        )  # fmt: skip
        self.model_tokens = Counter(
            "sunroom_model_tokens", "Tokens of sessions' model calls.",
            ["provider", "model", "direction"], registry=r,
        )  # fmt: skip
        self.model_cost = Counter(
            "sunroom_model_cost_micro_usd",
            "Cost of sessions' model calls in micro-USD (calls of unknown price add nothing).",
            ["provider", "model"], registry=r,
        )  # fmt: skip
        self.lease_handovers = Counter(
            "sunroom_lease_handovers",
            "Sessions this process took over from another owner (whose lease ran out).",
            registry=r,
        )
        self.pool_hits = Counter(
            "sunroom_warm_pool_hits",
            "Kernel claims a warm pool answered with what it had ready.",
            ["pool"], registry=r,
        )  # fmt: skip
        self.pool_misses = Counter(
            "sunroom_warm_pool_misses",
            "Kernel claims a warm pool had nothing ready for (started on demand).",
            ["pool"], registry=r,
        )  # fmt: skip
        self.claim_seconds = Histogram(
            "sunroom_kernel_claim_seconds", "How long claims from a warm pool took.",
            ["pool"], registry=r, buckets=_SECONDS_BUCKETS,
        )  # fmt: skip
        self.http_requests = Counter(
            "sunroom_http_requests",
            "HTTP answers of the app, by method, route template and status.",
            ["method", "route", "status"], registry=r,
        )  # fmt: skip
        self.http_429 = Counter(
            "sunroom_http_429",
            "Requests answered 429 (a limit of sessions, kernels or kernel requests).",
            ["route"], registry=r,
        )  # fmt: skip
        self._live = _LiveCollector()
        r.register(self._live)

    # -- wiring ------------------------------------------------------------------------------

    def watch(
        self,
        *,
        raw_kernels: Callable[[], Iterable[str]],
        sessions: Callable[[], Iterable[object]],
    ) -> None:
        """Count the raw kernels and the live sessions at each scrape.

        *raw_kernels* gives the raw kernels' backends; *sessions* the live sessions' journals,
        as given to :meth:`session_observer`.
        """
        self._live.raw_kernels = raw_kernels
        self._live.sessions = sessions

    async def refresh(self, store: EventStore) -> None:
        """Read the store's session counts for the next :meth:`exposition`.

        A store that fails is logged (with its traceback) and leaves the counts out of it.
        """
        counts: dict[str, int] = {}
        try:
            for status in SESSION_STATUSES:
                listed = await store.list_sessions(status=status, limit=SESSION_COUNT_CAP)
                counts[status] = len(listed)
        except Exception:
            log.exception("counting the store's sessions for /metrics failed")
            counts = {}
        self._live.stored = counts

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    # -- observations ------------------------------------------------------------------------

    def executed(self, backend: str, seconds: float) -> None:
        """A raw kernel ran a cell on *backend* in *seconds* (its own measure)."""
        self.execute_seconds.labels(backend).observe(seconds)

    def pool_claimed(self, pool: str, *, hit: bool, seconds: float) -> None:
        """A claim from warm pool *pool* took *seconds*; *hit*: it had a kernel ready."""
        (self.pool_hits if hit else self.pool_misses).labels(pool).inc()
        self.claim_seconds.labels(pool).observe(seconds)

    def answered(self, method: str, route: str, status: int) -> None:
        """The app answered an HTTP request."""
        self.http_requests.labels(method, route, str(status)).inc()
        if status == 429:
            self.http_429.labels(route).inc()

    # -- the Probe ---------------------------------------------------------------------------

    def session_observer(
        self, journal: object, *, backend: str, model: str, spent: Spend | None
    ) -> EventObserver:
        """See :meth:`Probe.session_observer <sunroom.service.probes.Probe.session_observer>`."""
        self._live.session_backends[journal] = backend
        provider, name = split_model(model)
        return _SessionCounts(self, provider, name, backend, spent or Spend()).observe

    def lease_handover(self) -> None:
        """Count a session this process took over from another owner."""
        self.lease_handovers.inc()


@dataclass(slots=True)
class _SessionCounts:
    """Turns one session's running totals (``UsageUpdated``) into counter increments."""

    metrics: Metrics
    provider: str
    model: str
    backend: str
    seen: Spend

    def observe(self, event: ev.Event) -> None:
        m = self.metrics
        if isinstance(event, ev.ExecutionFinished):
            if event.status != "vetoed":  # a vetoed cell never ran
                m.execute_seconds.labels(self.backend).observe(event.duration_s)
        elif isinstance(event, ev.HostCallFinished):
            m.host_call_seconds.labels(event.name).observe(event.duration_s)
        elif isinstance(event, ev.UsageUpdated):
            self._usage(event)

    def _usage(self, event: ev.UsageUpdated) -> None:
        m, who, seen = self.metrics, (self.provider, self.model), self.seen
        calls = event.model_calls - seen.model_calls
        tokens_in = event.usage.input_tokens - seen.usage.input_tokens
        tokens_out = event.usage.output_tokens - seen.usage.output_tokens
        if calls > 0:
            m.model_calls.labels(*who).inc(calls)
        if tokens_in > 0:
            m.model_tokens.labels(*who, "input").inc(tokens_in)
        if tokens_out > 0:
            m.model_tokens.labels(*who, "output").inc(tokens_out)
        cost = None if event.cost_micro_usd is None else event.cost_micro_usd - seen.cost_micro_usd
        if cost is not None and seen.cost_known and cost > 0:
            m.model_cost.labels(*who).inc(cost)
        self.seen = Spend(
            model_calls=max(event.model_calls, seen.model_calls),
            usage=event.usage,
            cost_micro_usd=event.cost_micro_usd if event.cost_micro_usd is not None else 0,
            unpriced_calls=0 if event.cost_micro_usd is not None else 1,
        )


@final
class _LiveCollector(Collector):
    """The gauges read at scrape time: kernels by backend, live sessions, stored sessions."""

    def __init__(self) -> None:
        self.raw_kernels: Callable[[], Iterable[str]] = tuple
        self.sessions: Callable[[], Iterable[object]] = tuple
        self.session_backends: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
        self.stored: dict[str, int] = {}

    def describe(self) -> Iterable[Metric]:
        return []  # no samples read at registration

    def collect(self) -> Iterator[Metric]:
        kernels = GaugeMetricFamily(
            "sunroom_kernels",
            "Kernels this process runs: raw kernels and live sessions' kernels, by backend.",
            labels=["backend"],
        )
        by_backend: dict[str, int] = {}
        for backend in self.raw_kernels():
            by_backend[backend] = by_backend.get(backend, 0) + 1
        live = list(self.sessions())
        for journal in live:
            backend = self.session_backends.get(journal, "unknown")
            by_backend[backend] = by_backend.get(backend, 0) + 1
        for backend, n in sorted(by_backend.items()):
            kernels.add_metric([backend], n)
        yield kernels
        yield GaugeMetricFamily(
            "sunroom_sessions_live",
            "Sessions this process runs now (holding or starting a kernel).",
            value=len(live),
        )
        if self.stored:
            sessions = GaugeMetricFamily(
                "sunroom_sessions",
                f"Sessions in the store by status (every replica's; at most {SESSION_COUNT_CAP} "
                "counted per status).",
                labels=["status"],
            )
            for status, n in self.stored.items():
                sessions.add_metric([status], n)
            yield sessions


@final
class HttpMetrics:
    """ASGI middleware: counts every HTTP answer of *app* in *metrics* (:meth:`Metrics.answered`).

    The route label is the template of the route the request matched (``/kernels/{kid}/execute``,
    the E2B facade's ``/v2/sandboxes``), never the raw path; when a middleware answered before
    a router ran (a 401), the template among *routes* that matches it. Other requests the E2B
    facade answers (*facade* claims them: under ``/e2b``, or refused before its router) are
    ``e2b``, requests nothing matches ``unmatched``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        routes: Sequence[BaseRoute],
        facade: Callable[[Scope], bool],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self._routes = routes
        self._facade = facade

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; count its answer's status once the answer starts."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and not status:
                status.append(int(message["status"]))
                self.metrics.answered(scope["method"], self._route(scope), status[0])
            await send(message)

        await self.app(scope, receive, counted)

    def _route(self, scope: Scope) -> str:
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        if self._facade(scope):
            return "e2b"
        for route in self._routes:  # answered before the router ran
            match, _ = route.matches(scope)
            path = getattr(route, "path", None)
            if match is not Match.NONE and isinstance(path, str):
                return path
        return "unmatched"
