"""Describing MCP servers to bind into kernels: :func:`stdio`, :func:`http`, :func:`from_config`.

A description is a frozen value: nothing starts until a kernel or session that holds it starts
(or, with ``start="lazy"``, until the first cell that uses the server). Credentials (a stdio
server's ``env``, an HTTP server's ``headers``) stay on the host: they go to the server process or
its HTTP requests only, never into the kernel, its prompt, events or error messages (their values
are redacted from anything the server prints that sunroom repeats).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, final

from sunroom.errors import UsageError

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_TIMEOUT_S",
    "HttpServer",
    "McpServer",
    "StdioServer",
    "from_config",
    "http",
    "stdio",
]

DEFAULT_TIMEOUT_S: Final = 60.0
"""How long one tool call may run before the kernel gets ``HostFunctionTimeout``."""

DEFAULT_CONNECT_TIMEOUT_S: Final = 30.0
"""How long starting a server and listing its tools may take."""

DEFAULT_MAX_RESULT_BYTES: Final = 8 << 20
"""The largest tool result (text plus binary parts, as decoded) passed into the kernel."""

Start: TypeAlias = Literal["eager", "lazy"]
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Common:
    name: str
    """The module name the server's tools are bound under in the kernel."""
    start: Start = "eager"
    """``"eager"``: connect when the kernel starts; ``"lazy"``: at the first cell that uses it."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_concurrency: int | None = None
    """Tool calls to this server running at once per kernel (None: no limit)."""
    budget: int | None = None
    """Calls allowed to each of its tools per kernel lifetime (None: no limit)."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or keyword.iskeyword(self.name):
            raise UsageError(f"MCP server name {self.name!r} must be a Python identifier")
        if self.name.startswith("_"):
            raise UsageError(f"MCP server name {self.name!r} must not start with an underscore")
        if self.start not in ("eager", "lazy"):
            raise UsageError(f"start must be 'eager' or 'lazy', got {self.start!r}")
        for field in ("timeout_s", "connect_timeout_s", "max_result_bytes", "budget"):
            if getattr(self, field) is not None and getattr(self, field) <= 0:
                raise UsageError(f"MCP server {self.name!r}: {field} must be positive")

    def secrets(self) -> tuple[str, ...]:
        """Values that must never be repeated to the kernel or in messages."""
        return ()


@final
@dataclasses.dataclass(frozen=True, kw_only=True)
class StdioServer(_Common):
    """A server sunroom starts as a host process and speaks to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment for the server process (over a minimal default environment)."""
    cwd: str | None = None

    def secrets(self) -> tuple[str, ...]:
        """The env values (credentials by assumption)."""
        return tuple(v for v in self.env.values() if len(v) >= 4)

    def __repr__(self) -> str:  # env values are credentials
        return f"StdioServer(name={self.name!r}, command={self.command!r}, args={self.args!r})"


@final
@dataclasses.dataclass(frozen=True, kw_only=True)
class HttpServer(_Common):
    """A running server reached over streamable HTTP (or the older SSE transport)."""

    url: str
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    transport: Literal["streamable-http", "sse"] = "streamable-http"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.url.startswith(("http://", "https://")):
            raise UsageError(f"MCP server {self.name!r}: url must start with http:// or https://")
        if self.transport not in ("streamable-http", "sse"):
            raise UsageError(
                f"transport must be 'streamable-http' or 'sse', got {self.transport!r}"
            )

    def secrets(self) -> tuple[str, ...]:
        """The header values, and the token of an ``Authorization: Bearer`` one."""
        out = []
        for value in self.headers.values():
            out.append(value)
            if " " in value:  # "Bearer <token>": the token alone must not leak either
                out.append(value.split(" ", 1)[1])
        return tuple(v for v in out if len(v) >= 4)

    def __repr__(self) -> str:  # header values are credentials
        return f"HttpServer(name={self.name!r}, url={self.url!r}, transport={self.transport!r})"


McpServer: TypeAlias = StdioServer | HttpServer


def _default_name(text: str) -> str:
    base = text.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"^(mcp[-_]server[-_]|server[-_])|([-_]mcp|[-_]server)$", "", base.lower())
    name = re.sub(r"[^a-z0-9_]", "_", base).strip("_") or "server"
    return "_".join(["mcp", name]) if name[0].isdigit() or keyword.iskeyword(name) else name


def stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    name: str | None = None,
    start: Start = "eager",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    max_concurrency: int | None = None,
    budget: int | None = None,
) -> StdioServer:
    """A server started as ``command *args`` on the host (name: from the command, if not given).

    The server's process gets a minimal environment plus *env*; it runs with the host user's
    rights, outside any sandbox (it is the user's tool, like a host function).
    """
    if isinstance(args, str):
        raise UsageError("args must be a list of strings, not one string")
    return StdioServer(
        name=name or _default_name(args[-1] if command in _LAUNCHERS and args else command),
        command=command,
        args=tuple(args),
        env=dict(env or {}),
        cwd=cwd,
        start=start,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_result_bytes=max_result_bytes,
        max_concurrency=max_concurrency,
        budget=budget,
    )


_LAUNCHERS: Final = frozenset({"uvx", "npx", "python", "python3", "node", "pipx", "uv"})


def http(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
    transport: Literal["streamable-http", "sse"] = "streamable-http",
    start: Start = "eager",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    max_concurrency: int | None = None,
    budget: int | None = None,
) -> HttpServer:
    """A server at *url* (streamable HTTP by default; ``transport="sse"`` for the older one)."""
    host = url.split("://", 1)[-1].split("/", 1)[0].split("@")[-1].split(":")[0]
    return HttpServer(
        name=name or _default_name(host.split(".")[0] if host else "server"),
        url=url,
        headers=dict(headers or {}),
        transport=transport,
        start=start,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_result_bytes=max_result_bytes,
        max_concurrency=max_concurrency,
        budget=budget,
    )


def from_config(config: Mapping[str, object]) -> list[McpServer]:
    """Servers from the common ``{"mcpServers": {name: {...}}}`` client configuration.

    Each entry has ``command`` (+ ``args``, ``env``, ``cwd``) for a stdio server, or ``url``
    (+ ``headers``, ``type``/``transport`` of ``"http"``/``"streamable-http"``/``"sse"``) for
    a remote one; ``timeout_s``, ``start`` and ``max_result_bytes`` are sunroom's own keys.
    """
    servers = config.get("mcpServers", config) if isinstance(config, Mapping) else None
    if not isinstance(servers, Mapping):
        raise UsageError("an MCP config must be a JSON object of servers under 'mcpServers'")
    out: list[McpServer] = []
    for key, entry in servers.items():
        if not isinstance(entry, Mapping):
            raise UsageError(f"MCP server {key!r}: its entry must be a JSON object")
        name = re.sub(r"[^A-Za-z0-9_]", "_", str(key))
        extra: dict[str, Any] = {
            k: entry[k]
            for k in (
                "start",
                "timeout_s",
                "connect_timeout_s",
                "max_result_bytes",
                "max_concurrency",
                "budget",
            )
            if k in entry
        }
        try:
            if "command" in entry:
                out.append(
                    stdio(
                        str(entry["command"]),
                        [str(a) for a in entry.get("args", [])],
                        env={str(k): str(v) for k, v in dict(entry.get("env") or {}).items()},
                        cwd=entry.get("cwd"),
                        name=name,
                        **extra,
                    )
                )
            elif "url" in entry:
                kind = str(entry.get("transport", entry.get("type", "streamable-http")))
                transport: Literal["streamable-http", "sse"] = (
                    "sse" if kind == "sse" else "streamable-http"
                )
                out.append(
                    http(
                        str(entry["url"]),
                        headers={
                            str(k): str(v) for k, v in dict(entry.get("headers") or {}).items()
                        },
                        name=name,
                        transport=transport,
                        **extra,
                    )
                )
            else:
                raise UsageError(f"MCP server {key!r}: give 'command' (stdio) or 'url' (HTTP)")
        except TypeError as exc:
            raise UsageError(f"MCP server {key!r}: {exc}") from None
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise UsageError("two MCP servers in the config map to the same module name")
    return out
