"""The service's settings: :class:`ServiceConfig` (pydantic), from arguments and ``SUNROOM_*``.

Every setting has a default that is safe on a developer machine: loopback only, a generated
bearer token, a 1 MiB body limit, bounded sessions, kernels and SSE buffers.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypedDict

import pydantic

from sunroom.errors import UsageError
from sunroom.sandbox.backends import DEFAULT_BACKEND
from sunroom.sandbox.backends.choice import JUPYTER, choose_backend
from sunroom.service.problems import validation_message

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.network.policy import Network
    from sunroom.sandbox.backend import Backend
    from sunroom.store import EventStore

__all__ = ["LOOPBACK", "MAX_HEADER_BYTES", "NetworkSpec", "ServiceConfig", "default_db_path"]

MAX_HEADER_BYTES: Final = 16 * 1024
"""Largest request head (request line and headers) the server reads: 431 beyond."""

LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})
"""Hosts that need no ``expose`` flag."""


class NetworkSpec(TypedDict, total=False):
    """A request's own network allowlist, as data: its hosts and its byte cap."""

    allow: list[str]
    max_bytes: int | None


def default_db_path() -> Path:
    """``$SUNROOM_DB``, else ``$XDG_STATE_HOME/sunroom/sunroom.db`` (``~/.local/state``)."""
    explicit = os.environ.get("SUNROOM_DB")
    if explicit and "://" not in explicit:  # a URL is a store_url (ServiceConfig.from_env)
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "sunroom" / "sunroom.db"


STORE_SCHEMES: Final = ("postgresql", "postgres")
"""URL schemes of a store elsewhere (``--db``/``SUNROOM_DB``); ``sqlite:///PATH`` is a path."""


def split_db(value: str) -> tuple[Path | None, str | None]:
    """``--db``/``SUNROOM_DB`` as (SQLite path, None) or (None, PostgreSQL URL).

    A plain path or ``sqlite:///PATH`` is a SQLite file; ``postgresql://`` (or
    ``postgres://``) a PostgreSQL store. Any other URL is refused (UsageError) naming its scheme
    only, never the rest (it may hold a password).
    """
    if "://" not in value:
        return Path(value), None
    scheme = value.split("://", 1)[0].lower()
    if scheme == "sqlite":
        path = value.split("://", 1)[1]
        if not path.startswith("/") or path == "/":
            raise UsageError(
                "a sqlite:// store URL must name an absolute path: sqlite:////abs/path"
            )
        return Path(path), None
    if scheme in STORE_SCHEMES:
        return None, value
    raise UsageError(
        f"the store URL scheme {scheme!r} is not supported: give a SQLite path (or "
        "sqlite:///PATH) or a postgresql:// URL"
    )


def redact_url(url: str) -> str:
    """*url* with any password replaced by ``***`` (for logs and messages)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


class ServiceConfig(pydantic.BaseModel):
    """How the service runs. Immutable; build with :meth:`from_env` to read ``SUNROOM_*``.

    Attributes:
        host / port: where uvicorn listens (port 0: any free port).
        expose: required to bind anything but loopback.
        token: the bearer token every route but ``/healthz`` needs (generated when empty);
            never shown by ``repr`` or in an error.
        db_path: the SQLite store (when ``store_url`` is None).
        store_url: a PostgreSQL store (``postgresql://user:password@host:5432/db``), shared by
            every replica; ``--db``/``SUNROOM_DB`` set either (:func:`split_db`). Never shown
            by ``repr`` or in an error: it may hold a password.
        advertise_url: this replica's internal base URL (``http://10.0.0.5:8765``), which other
            replicas of the same store forward writes of its sessions and kernels to
            (``--advertise-url``, ``SUNROOM_ADVERTISE_URL``; docs/deploy.md). None: this server
            takes part in no cluster (it neither forwards nor is forwarded to).
        drain_grace_s: on SIGTERM, how long runs in progress may go on to finish their turn
            before they are stopped and their leases released (``--drain-grace-s``,
            ``SUNROOM_DRAIN_GRACE_S``).
        placement_sample: how many replicas a new session or kernel samples to pick the least
            loaded (power of d choices).
        backend: the kernel backend of sessions and of kernels that do not name one.
        kernel_name / sandbox: the kernelspec and sandbox of ``jupyter`` kernels that do not
            name one (``sunroom serve --kernel-name``, ``SUNROOM_KERNEL_NAME``; defaults
            ``python3`` and ``bwrap``); see :meth:`kernel_backend`.
        model / base_url: the default model of sessions that do not name one.
        allowed_base_urls: base URLs a session request may name besides ``base_url``. The
            server's API keys go with every model call, so a request may only point a model
            at an endpoint the operator listed (``SUNROOM_ALLOWED_BASE_URLS``, comma-separated).
        max_body_bytes: largest request body (413 beyond), checked while reading.
        max_file_bytes: largest file a ``PUT .../files/{path}`` may upload (413 beyond, and
            nothing is written), checked while the body streams in; separate from
            ``max_body_bytes`` (``SUNROOM_MAX_FILE_BYTES``; default 1 GiB). The upload must
            also arrive within ``read_timeout_s``.
        max_sessions / max_kernels: live sessions / raw kernels per server (429 beyond). A
            session is live while it holds a kernel here; an idle one is released (its kernel
            stopped, its slot freed) after ``session_idle_s``, or at once, least recently used
            first, when a new or resumed session would otherwise pass ``max_sessions``. A
            released session stays in the store and resumes from its log on its next message,
            as after a crash (``KernelRestarted``, ``state_lost``). ``sunroom serve
            --max-sessions``.
        session_idle_s: how long a session may stay idle (no run, no message being accepted,
            no approval waiting, no SSE reader) before it is released (default 600 s; ``sunroom
            serve --session-idle-s``, ``SUNROOM_SESSION_IDLE_S``). A request for its kernel
            (files) or approvals starts its idle time again.
        max_kernel_requests: kernel requests (``POST /kernels`` and executes) in flight or
            queued at once, over all raw kernels (1 to 65,536); one more is answered 429 with
            ``Retry-After: 1`` before its body is read. The default, 256, is twice
            ``max_kernels``: every kernel may run a cell and have one more waiting.
        sse_batch: events one SSE read takes from the store at a time (the bounded buffer).
        sse_send_timeout_s: a client that does not take an event within this is disconnected.
        sse_keepalive_s: a comment line is sent after this much silence.
        lease_s: how long a session's ownership lasts without renewal (a crashed server's
            sessions are resumed by another process after it).
        resume_orphans: resume sessions a dead server left running (checked every
            ``lease_s / 2``).
        functions: ``module:attribute`` host functions offered to every session and kernel.
        templates: name → setup code of the kernel templates (docs/fork.md) that
            ``POST /kernels`` and ``POST /sessions`` may name with ``"template"``; each is
            started on first use, with this server's backend and the default limits.
        mcp_servers: the MCP servers (docs/mcp.md) that ``POST /kernels`` and ``POST
            /sessions`` may bind by name with ``"mcp": [...]``, in the ``mcpServers`` shape of
            MCP client configs (``sunroom serve --mcp FILE``); each kernel or session starts
            its own connections. Their ``env`` and ``headers`` stay on this host.
        networks: name → network policy (``sunroom.Network.to_json()`` shape, ``inject``
            headers included: they stay on this host) that ``POST /kernels`` and ``POST
            /sessions`` may name with ``"network": NAME`` (``sunroom serve --network
            NAME=FILE``; docs/network.md).
        client_network: let requests send their own allowlist (``"network": {"allow":
            [...]}``: hosts only, no injected headers, no private addresses); off by default,
            so a client reaches only what the operator named.
        allowed_hosts: ``Host`` header names (without port) requests may carry, besides the
            loopback names and ``host`` (against DNS rebinding; ``SUNROOM_ALLOWED_HOSTS``,
            comma-separated; ``*`` allows any).
        read_timeout_s: a request's head and body must arrive within this from its first byte
            (408 and the connection closed otherwise; ``SUNROOM_READ_TIMEOUT_S``: a big file
            upload must arrive whole within it).
        max_connections / max_connections_per_client: open connections in total / from one
            client address (the connection is answered 503 and closed beyond;
            ``SUNROOM_MAX_CONNECTIONS``, ``SUNROOM_MAX_CONNECTIONS_PER_CLIENT``). The address
            is the TCP peer's: ``X-Forwarded-For`` does not change it (there is no trusted-proxy
            setting for it), so behind a reverse proxy every client shares the proxy's cap.
        e2b_pool: warm kernels the E2B-compatible API (docs/integrations.md) keeps started for
            its next sandboxes (``sunroom serve --e2b-pool``, ``SUNROOM_E2B_POOL``; 0, the
            default, starts each sandbox's kernel on demand). Each warm kernel is handed out once.
        e2b_max_timeout_s: the longest lifetime an E2B sandbox may ask for (seconds; its
            ``timeout``, 300 when it names none).
        metrics_public: serve ``GET /metrics`` (Prometheus' text format, docs/observability.md)
            without the bearer token, for a scraper that has none (``sunroom serve
            --metrics-public``, ``SUNROOM_METRICS_PUBLIC=1``). Off by default: the metrics
            then need the token like every route but ``/healthz``. They carry counts, route
            templates, host function and model names, never a request's data or a secret.
        ui: serve the web view at ``/`` (docs/service.md, "The web view"; ``sunroom serve
            --no-ui`` or ``SUNROOM_UI=0`` turns it off: ``/`` and ``/ui/*`` then answer 401
            or 404 and no cookie is accepted).
        ui_session_s: how long a web view login lasts (its cookie's lifetime; default 12 h).
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = pydantic.Field(default=8765, ge=0, le=65535)
    expose: bool = False
    token: str = pydantic.Field(default="", repr=False)
    db_path: Path = pydantic.Field(default_factory=default_db_path)
    backend: str = DEFAULT_BACKEND
    kernel_name: str | None = pydantic.Field(default=None, min_length=1)
    sandbox: Literal["bwrap", "docker", "none"] | None = None
    model: str | None = None
    base_url: str | None = None
    allowed_base_urls: tuple[str, ...] = ()
    max_body_bytes: int = pydantic.Field(default=1024 * 1024, gt=0)
    max_file_bytes: int = pydantic.Field(default=1024**3, gt=0)
    max_sessions: int = pydantic.Field(default=64, gt=0)
    max_kernels: int = pydantic.Field(default=128, gt=0)
    session_idle_s: float = pydantic.Field(default=600.0, gt=0, allow_inf_nan=False)
    max_kernel_requests: int = pydantic.Field(default=256, ge=1, le=65536)
    sse_batch: int = pydantic.Field(default=256, gt=0)
    sse_send_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    sse_keepalive_s: float = pydantic.Field(default=15.0, gt=0)
    lease_s: float = pydantic.Field(default=15.0, gt=0)
    resume_orphans: bool = True
    functions: tuple[str, ...] = ()
    templates: dict[str, str] = pydantic.Field(default_factory=dict)
    mcp_servers: dict[str, dict[str, object]] = pydantic.Field(default_factory=dict, repr=False)
    networks: dict[str, dict[str, object]] = pydantic.Field(default_factory=dict, repr=False)
    client_network: bool = False
    allowed_hosts: tuple[str, ...] = ()
    read_timeout_s: float = pydantic.Field(default=10.0, gt=0, le=3600)
    max_connections: int = pydantic.Field(default=1024, gt=0)
    max_connections_per_client: int = pydantic.Field(default=256, gt=0)
    e2b_pool: int = pydantic.Field(default=0, ge=0, le=64)
    e2b_max_timeout_s: int = pydantic.Field(default=3600, gt=0, le=86400)
    metrics_public: bool = False
    store_url: str | None = pydantic.Field(default=None, repr=False)
    advertise_url: str | None = pydantic.Field(default=None, pattern=r"^https?://[^/\s]+$")
    drain_grace_s: float = pydantic.Field(default=20.0, ge=0, le=3600, allow_inf_nan=False)
    placement_sample: int = pydantic.Field(default=2, ge=1, le=16)
    ui: bool = True
    ui_session_s: float = pydantic.Field(default=43200.0, gt=0, le=30 * 86400, allow_inf_nan=False)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _db(cls, data: object) -> object:
        """``db`` (a path or store URL, from ``--db``/``SUNROOM_DB``) into its field."""
        if isinstance(data, dict) and "db" in data:
            data = dict(data)
            db = data.pop("db")
            if db is not None:
                path, url = split_db(str(db))
                data["db_path" if path is not None else "store_url"] = path or url
        return data

    @pydantic.model_validator(mode="after")
    def _check(self) -> ServiceConfig:
        for name in self.templates:
            if not name.isidentifier():
                raise ValueError(f"template name {name!r} must be a Python identifier")
        if self.mcp_servers:
            from sunroom.mcp.servers import from_config

            try:
                servers = from_config({"mcpServers": self.mcp_servers})
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            renamed = [s.name for s in servers if s.name not in self.mcp_servers]
            if renamed:
                raise ValueError(f"MCP server name {renamed[0]!r} must be a Python identifier")
        for name, policy in self.networks.items():
            if not name.isidentifier():
                raise ValueError(f"network name {name!r} must be a Python identifier")
            from sunroom.network.policy import Network

            try:
                Network.from_json(policy)
            except UsageError as exc:
                raise ValueError(f"network {name!r}: {exc}") from None
        if self.host not in LOOPBACK and not self.expose:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: pass --expose (expose=True) to "
                "serve on it"
            )
        if self.token and len(self.token) < 16:
            raise ValueError("the token (SUNROOM_TOKEN) must be at least 16 characters")
        return self

    def mcp(self, names: Sequence[str]) -> list[McpServer]:
        """The configured MCP servers *names* (in that order); UsageError for an unknown one."""
        if not names:
            return []
        from sunroom.mcp.servers import from_config

        unknown = [n for n in names if n not in self.mcp_servers]
        if unknown:
            known = ", ".join(sorted(self.mcp_servers)) or "none"
            raise UsageError(f"unknown MCP server {unknown[0]!r}; this server has: {known}")
        if len(set(names)) != len(names):
            raise UsageError("an MCP server is named twice")
        return from_config({"mcpServers": {n: self.mcp_servers[n] for n in names}})

    def network(self, spec: str | NetworkSpec | None) -> Network | None:
        """The policy a request names (a configured name, or its own allowlist) or None.

        Raises UsageError for an unknown name, and for a request's own allowlist unless
        ``client_network`` is on (it then gets the hosts and a byte cap, nothing else).
        """
        if spec is None:
            return None
        from sunroom.network.policy import Network

        if isinstance(spec, str):
            if spec not in self.networks:
                known = ", ".join(sorted(self.networks)) or "none"
                raise UsageError(f"unknown network {spec!r}; this server has: {known}")
            return Network.from_json(self.networks[spec])
        if not self.client_network:
            known = ", ".join(sorted(self.networks)) or "none"
            raise UsageError(
                "this server does not let clients choose network hosts (sunroom serve "
                f"--client-network); name one of its networks instead: {known}"
            )
        return Network(allow=tuple(spec.get("allow") or ()), max_bytes=spec.get("max_bytes"))

    def kernel_backend(
        self,
        backend: str | None = None,
        *,
        kernel_name: str | None = None,
        sandbox: str | None = None,
    ) -> str | Backend:
        """The backend a request names (None: this server's), for ``AsyncKernel(backend=...)``.

        A ``jupyter`` kernel that names no kernel or sandbox gets this server's
        ``kernel_name`` / ``sandbox``. Raises UsageError (see
        :func:`sunroom.sandbox.backends.choice.choose_backend`: an unknown backend or kernel name, a
        kernel name or sandbox with another backend).
        """
        chosen = backend or self.backend
        if chosen == JUPYTER:
            kernel_name = kernel_name or self.kernel_name
            sandbox = sandbox or self.sandbox
        return choose_backend(chosen, kernel_name=kernel_name, sandbox=sandbox)

    def base_url_allowed(self, url: str) -> bool:
        """Whether a session request may send this server's model calls (and keys) to *url*."""
        norm = url.rstrip("/")
        allowed = {u.rstrip("/") for u in self.allowed_base_urls}
        if self.base_url is not None:
            allowed.add(self.base_url.rstrip("/"))
        return norm in allowed

    def host_allowed(self, host: str) -> bool:
        """Whether a request's ``Host`` header (with or without a port) is allowed."""
        name = host.strip().lower()
        if name.startswith("["):  # [::1]:8765
            name = name[1 : name.find("]")] if "]" in name else name
        elif name.count(":") == 1:
            name = name.partition(":")[0]
        allowed = LOOPBACK | {h.lower() for h in self.allowed_hosts}
        if self.host not in ("0.0.0.0", "::"):
            allowed |= {self.host.lower()}
        return "*" in allowed or name.rstrip(".") in allowed

    def new_store(self) -> EventStore:
        """The configured store, not opened yet (``async with config.new_store() as store``).

        A PostgreSQL store needs the ``postgres`` extra (UsageError naming it otherwise).
        """
        from sunroom.store.open import open_store

        return open_store(self.store_url or str(self.db_path))

    def store_label(self) -> str:
        """Where the store is, for a person: the SQLite path, or the URL without its password."""
        if self.store_url is None:
            return str(self.db_path)
        return redact_url(self.store_url)

    def with_token(self) -> ServiceConfig:
        """The same config, with a freshly generated token when it has none."""
        if self.token:
            return self
        return self.model_copy(update={"token": secrets.token_urlsafe(32)})

    @classmethod
    def from_env(cls, **overrides: object) -> ServiceConfig:
        """Settings from the environment, then *overrides* (None values are ignored).

        Reads ``SUNROOM_TOKEN``, ``SUNROOM_MODEL``, ``SUNROOM_BASE_URL``, ``SUNROOM_DB``,
        ``SUNROOM_BACKEND``, ``SUNROOM_KERNEL_NAME``, ``SUNROOM_MAX_FILE_BYTES``,
        ``SUNROOM_READ_TIMEOUT_S``, ``SUNROOM_SESSION_IDLE_S``, ``SUNROOM_MAX_CONNECTIONS``,
        ``SUNROOM_MAX_CONNECTIONS_PER_CLIENT``, ``SUNROOM_E2B_POOL``, ``SUNROOM_METRICS_PUBLIC``
        and ``SUNROOM_UI`` (``1``/``0``, ``true``/``false``), ``SUNROOM_ADVERTISE_URL``,
        ``SUNROOM_DRAIN_GRACE_S``, ``SUNROOM_MAX_KERNELS``,
        ``SUNROOM_ALLOWED_BASE_URLS``, ``SUNROOM_ALLOWED_HOSTS`` and ``SUNROOM_FUNCTIONS`` (the
        last three comma-separated).
        Raises UsageError with one line naming each bad setting (never its value: the token is
        a secret).
        """
        env = os.environ
        values: dict[str, object] = {}
        for field, var in (
            ("token", "SUNROOM_TOKEN"),
            ("model", "SUNROOM_MODEL"),
            ("base_url", "SUNROOM_BASE_URL"),
            ("db", "SUNROOM_DB"),
            ("advertise_url", "SUNROOM_ADVERTISE_URL"),
            ("drain_grace_s", "SUNROOM_DRAIN_GRACE_S"),
            ("max_kernels", "SUNROOM_MAX_KERNELS"),
            ("backend", "SUNROOM_BACKEND"),
            ("kernel_name", "SUNROOM_KERNEL_NAME"),
            ("max_file_bytes", "SUNROOM_MAX_FILE_BYTES"),
            ("read_timeout_s", "SUNROOM_READ_TIMEOUT_S"),
            ("session_idle_s", "SUNROOM_SESSION_IDLE_S"),
            ("max_connections", "SUNROOM_MAX_CONNECTIONS"),
            ("max_connections_per_client", "SUNROOM_MAX_CONNECTIONS_PER_CLIENT"),
            ("e2b_pool", "SUNROOM_E2B_POOL"),
            ("metrics_public", "SUNROOM_METRICS_PUBLIC"),
            ("ui", "SUNROOM_UI"),
        ):
            if env.get(var):
                values[field] = env[var]
        if env.get("SUNROOM_ALLOWED_BASE_URLS"):
            values["allowed_base_urls"] = tuple(
                u.strip() for u in env["SUNROOM_ALLOWED_BASE_URLS"].split(",") if u.strip()
            )
        if env.get("SUNROOM_ALLOWED_HOSTS"):
            values["allowed_hosts"] = tuple(
                h.strip() for h in env["SUNROOM_ALLOWED_HOSTS"].split(",") if h.strip()
            )
        if env.get("SUNROOM_FUNCTIONS"):
            values["functions"] = tuple(
                f.strip() for f in env["SUNROOM_FUNCTIONS"].split(",") if f.strip()
            )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "db_path" in overrides and overrides["db_path"] is not None:
            values.pop("db", None)  # an explicit path wins over SUNROOM_DB
        try:
            return cls.model_validate(values)
        except pydantic.ValidationError as exc:
            raise UsageError(f"invalid setting: {validation_message(exc)}") from None
