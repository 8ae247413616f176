"""The MCP servers of one kernel and their tools as host functions: :class:`Toolset`.

A kernel (or session) given ``mcp=[...]`` owns a toolset. :meth:`Toolset.bind` connects the
servers (``start="eager"`` ones at kernel start, ``"lazy"`` ones before the first cell runs),
lists their tools and turns each into a host function ``<server>.<tool>`` (see
:mod:`sunroom.mcp.binding`); the kernel installs them as one module per server. A server whose
tool list changes (``notifications/tools/list_changed``) is listed again and its module
re-installed before the next cell. Copies of a forked kernel share the toolset: it closes with
the last kernel that holds it. It is the sandbox's :class:`sunroom.sandbox.toolset.Toolset`:
the kernel knows it only through that protocol (:mod:`sunroom.mcp` installs the factory that
makes one of ``mcp=`` servers).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Sequence

from sunroom.errors import UsageError
from sunroom.mcp.binding import python_name, tool_function
from sunroom.mcp.connection import Connection
from sunroom.mcp.servers import HttpServer, McpServer, StdioServer
from sunroom.sandbox.codegen import def_name, generate
from sunroom.sandbox.functions import RESERVED, HostFunction

__all__ = ["Toolset"]

Wrap = Callable[[HostFunction], HostFunction]


@dataclasses.dataclass
class _Bound:
    connection: Connection
    functions: tuple[HostFunction, ...] = ()
    instructions: str = ""
    stale: bool = True


class Toolset:
    """Connections to *servers* and their tools as host functions (each passed through *wrap*).

    Server names must be distinct identifiers that are not builtins. Nothing connects until
    :meth:`bind`. The toolset is closed by :meth:`aclose` once every holder released it.
    """

    def __init__(self, servers: Iterable[McpServer], *, wrap: Wrap | None = None) -> None:
        self.servers: tuple[McpServer, ...] = tuple(servers)
        for server in self.servers:
            if not isinstance(server, StdioServer | HttpServer):
                raise UsageError(
                    "mcp= takes servers made by sunroom.mcp.stdio() or sunroom.mcp.http()"
                )
            if server.name in RESERVED:
                raise UsageError(f"MCP server name {server.name!r} is a builtin; pass name=")
        names = [s.name for s in self.servers]
        if len(set(names)) != len(names):
            raise UsageError("two MCP servers have the same name; pass name= to tell them apart")
        self._wrap = wrap
        self._bound = {
            s.name: _Bound(Connection(s, on_tools_changed=self._marker(s.name)))
            for s in self.servers
        }
        self._holders = 1
        self._lock = asyncio.Lock()
        self._closed = False

    def then(self, wrap: Wrap) -> Toolset:
        """Pass every tool function through *wrap* too, after the wrap given so far; self.

        Only before :meth:`bind` (a session adds its hooks and events to a service's ledger).
        """
        if any(b.functions for b in self._bound.values()):
            raise UsageError("a toolset's wrapping is set before its servers are bound")
        inner = self._wrap
        self._wrap = wrap if inner is None else (lambda hf: wrap(inner(hf)))
        return self

    def _marker(self, name: str) -> Callable[[], None]:
        def mark() -> None:
            self._bound[name].stale = True

        return mark

    # -- binding ---------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether a server still has to be bound (lazy, or its tool list changed)."""
        return any(b.stale for b in self._bound.values())

    async def connect(self) -> None:
        """Start (or reach) every server now, without listing tools (e.g. to warm them up)."""
        await asyncio.gather(*(b.connection.connect() for b in self._bound.values()))

    async def bind(self, *, lazy: bool = False) -> bool:
        """Connect and list the servers that need it; whether any functions changed.

        At kernel start (``lazy=False``) the lazy servers are left for later; before a cell
        (``lazy=True``) every stale server is bound. Servers connect concurrently. A server that
        fails raises :class:`~sunroom.errors.McpServerError`; before a cell it is then left
        unbound (the cell that tried gets the error, later cells run without that module).
        """
        async with self._lock:
            todo = [
                name
                for name, b in self._bound.items()
                if b.stale and (lazy or b.connection.server.start == "eager" or b.functions)
            ]
            if not todo:
                return False
            outcomes = await asyncio.gather(
                *(self._bind_one(name) for name in todo), return_exceptions=True
            )
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                if not lazy:
                    raise failures[0]
                # before a cell: that cell gets the error; later cells run without the server
                for name in todo:
                    self._bound[name].stale = False
                raise failures[0]
            return True

    async def _bind_one(self, name: str) -> None:
        bound = self._bound[name]
        bound.stale = False  # a change notified while listing marks it again
        tools = await bound.connection.tools()
        taken: set[str] = set()
        made = []
        for tool in sorted(tools, key=lambda t: t.name):
            attr = python_name(tool.name, taken)
            hf = tool_function(bound.connection.server, tool, attr, bound.connection.call)
            made.append(self._wrap(hf) if self._wrap is not None else hf)
        bound.functions = tuple(made)

    @property
    def functions(self) -> tuple[HostFunction, ...]:
        """Every bound tool, as host functions named ``<server>.<tool>``."""
        return tuple(hf for b in self._bound.values() for hf in b.functions)

    def module_docs(self) -> dict[str, str]:
        """The docstring of each server's module in the kernel."""
        docs = {}
        for name, bound in self._bound.items():
            server = bound.connection.server
            where = server.url if isinstance(server, HttpServer) else server.command
            docs[name] = f"Tools of the MCP server {name!r} ({where}), called on the host."
        return docs

    def describe(self) -> str:
        """The bound modules and their signatures, compactly, for a system prompt."""
        hfs = self.functions
        if not hfs:
            return ""
        tree = ast.parse(generate(hfs, module_docs=self.module_docs()).source)
        by_def = {def_name(hf.name): hf.name for hf in hfs}
        lines: list[str] = []
        current = ""
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                if not lines:
                    lines.append("# types the tools take and return")
                text = ast.unparse(node).replace("@_dc.dataclass", "@dataclass")
                lines.append(text.replace("_dc.field", "field").replace("_t.", ""))
            elif isinstance(node, ast.FunctionDef) and node.name in by_def:
                module, attr = by_def[node.name].split(".")
                if module != current:
                    lines.append(f"# module {module} (MCP server)")
                    current = module
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                node.body = [ast.Expr(ast.Constant(...))]
                node.name = f"{module}.{attr}"
                head = ast.unparse(node).split("\n", 1)[0].removeprefix("def ").rstrip(":")
                head = head.replace("_t.", "").replace("_DEFAULT", "...")
                head = head.replace("-> _mcp.Content", "-> str | Image | Resource | list")
                summary = f"  # {doc[0]}" if doc and not doc[0].startswith("MCP tool ") else ""
                lines.append(f"{head}{summary}")
        return "\n".join(lines)

    def server_names(self) -> Sequence[str]:
        """The module names, in order."""
        return list(self._bound)

    def restarts(self) -> dict[str, int]:
        """How often each server was started again after it exited."""
        return {name: b.connection.restarts for name, b in self._bound.items()}

    # -- holders ---------------------------------------------------------------------------

    def hold(self) -> None:
        """One more kernel (a forked copy) uses the toolset."""
        self._holders += 1

    async def aclose(self) -> None:
        """Release one holder; the last one closes every connection (stdio servers stop)."""
        self._holders -= 1
        if self._holders > 0 or self._closed:
            return
        self._closed = True
        await asyncio.gather(
            *(b.connection.aclose() for b in self._bound.values()), return_exceptions=False
        )
