"""The typed shapes of the messages a kernel sends the host, as the checkers return them.

Each checker in :mod:`sunroom.rpc.schema` rebuilds a kernel's message from the keys it knows,
with exactly these types: the checker is what makes the shape true, so a value typed with one
of these has been checked (or was built by the kernel side, which writes the same shapes).

Standard library only, like the rest of :mod:`sunroom.rpc`: the kernel image carries it, and
the kernel side may build its replies with the same types.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict

__all__ = [
    "CallParams",
    "CellErrorReply",
    "DisplayData",
    "DisplayItemReply",
    "ExecuteReply",
    "HelloParams",
    "Json",
    "PackageListingReply",
    "PackageRow",
    "StreamParams",
    "VariableRow",
]

Json: TypeAlias = "None | bool | int | float | str | list[Json] | dict[str, Json]"
"""Plain JSON data: None, bool, int, float, str, lists and str-keyed maps of them."""

DisplayData: TypeAlias = "str | bytes | Json"
"""One mime type's value: bytes for images, JSON for ``application/json``, str otherwise."""


class HelloParams(TypedDict, total=False):
    """The kernel's first notification; the launcher checks that every key is there."""

    protocol: int
    pid: int
    python: str
    nonce: str


class ForkedParams(TypedDict):
    """A copy the kernel has just forked, named before the fork's answer (its own pid)."""

    pid: int


class StreamParams(TypedDict):
    """Output a cell wrote to one of its streams."""

    name: Literal["stdout", "stderr"]
    text: str


class CallParams(TypedDict):
    """A host function call from the kernel: the function's name and its keyword arguments."""

    name: str
    args: dict[str, object]


class CellErrorReply(TypedDict):
    """The exception a cell raised."""

    type: str
    message: str
    traceback: str


class DisplayItemReply(TypedDict):
    """One rich output of a cell: its data by mime type (``text/plain`` always) and metadata."""

    output_type: Literal["display_data"]
    data: dict[str, DisplayData]
    metadata: dict[str, Json]


class ExecuteReply(TypedDict):
    """The result of ``execute``: a cell's streams, value, error, timing and rich outputs."""

    stdout: str
    stderr: str
    value: str | None
    error: CellErrorReply | None
    duration_s: float
    truncated_bytes: int
    outputs: list[DisplayItemReply]
    dropped_outputs: int


class VariableRow(TypedDict):
    """One row of the ``variables`` result: a name in the namespace, its type and repr."""

    name: str
    type: str
    repr: str


class PackageRow(TypedDict):
    """One row of an ``install_packages`` or ``list_packages`` result."""

    name: str
    version: str
    site: bool


class PackageListingReply(TypedDict):
    """The result of ``list_packages``: the installed packages and the package sources."""

    packages: list[PackageRow]
    sources: list[str]
