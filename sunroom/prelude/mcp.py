"""MCP tools inside the kernel: the modules they are bound in, their results and errors.

The host binds each MCP server as a module (``github.search_issues(...)``); generated wrappers
(see :mod:`sunroom.sandbox.codegen`) are gathered into a module object by :func:`module`, bound
as a name in the namespace (not put in ``sys.modules``: a server named ``time`` must not shadow
the standard library's module). A tool without an output schema
returns its content parts: the text when every part is text, the one part when there is one,
else a list whose items are ``str`` (text), :class:`Image` / :class:`Audio` (an image shows as a
display item when it is a cell's value or passed to ``display``) and :class:`Resource`. A tool
that reports an error raises :class:`McpToolError` with the server's message; a server that
cannot be reached, or died during the call, raises :class:`McpServerError`. Standard library
only.
"""

from __future__ import annotations

import types

from sunroom.prelude.hostcall import HostFunctionError, register


class McpToolError(HostFunctionError):
    """The MCP tool ran and reported an error (``isError``); the message is the server's."""


class McpServerError(HostFunctionError):
    """The MCP server could not be reached, or exited during the call."""


register(McpToolError)
register(McpServerError)


class Image:
    """An image an MCP tool returned; ``display(img)`` (or a trailing ``img``) shows it."""

    def __init__(self, data: bytes, mime_type: str) -> None:
        self.data = data
        self.mime_type = mime_type

    def __repr__(self) -> str:
        return f"<Image {self.mime_type}, {len(self.data)} bytes>"

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> dict[str, object]:  # Jupyter's protocol
        return {self.mime_type: self.data}


class Audio:
    """Audio an MCP tool returned (``data`` bytes and its ``mime_type``)."""

    def __init__(self, data: bytes, mime_type: str) -> None:
        self.data = data
        self.mime_type = mime_type

    def __repr__(self) -> str:
        return f"<Audio {self.mime_type}, {len(self.data)} bytes>"


class Resource:
    """A resource an MCP tool returned: its ``uri`` with ``text`` or ``blob`` content, or a link."""

    def __init__(
        self, uri: str, mime_type: str | None, text: str | None, blob: bytes | None
    ) -> None:
        self.uri = uri
        self.mime_type = mime_type
        self.text = text
        self.blob = blob

    def __repr__(self) -> str:
        size = len(self.text) if self.text is not None else len(self.blob or b"")
        return f"<Resource {self.uri} ({self.mime_type or 'unknown type'}, {size})>"


def _part(item: object) -> object:
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "image":
        return Image(item["data"], item["mime_type"])
    if kind == "audio":
        return Audio(item["data"], item["mime_type"])
    if kind == "resource":
        return Resource(item["uri"], item.get("mime_type"), item.get("text"), item.get("blob"))
    return item


class Content:
    """The result of a tool without an output schema (a return annotation, never built)."""

    @staticmethod
    def __sunroom_from_wire__(value: object) -> object:
        """Text stays ``str``; a list of parts gets its images and resources as objects."""
        if isinstance(value, list):
            return [_part(v) for v in value]
        return _part(value)


def module(name: str, doc: str, functions: dict[str, types.FunctionType]) -> types.ModuleType:
    """A module object named *name* holding *functions* (renamed to their attribute names)."""
    mod = types.ModuleType(name, doc)
    for attr, fn in functions.items():
        fn.__name__ = attr
        fn.__qualname__ = attr
        fn.__module__ = name
        setattr(mod, attr, fn)
    mod.__all__ = list(functions)  # type: ignore[attr-defined]
    return mod
