"""The E2B facade's JSON bodies as pydantic models, with E2B's own field names.

They describe what the facade answers (``/openapi.json`` names them; the facade builds its
answers itself): the control plane's sandboxes (``templateID``, ``sandboxID``, ``clientID``,
``envdVersion``, ``envdAccessToken``, ``trafficAccessToken``, ``startedAt``, ``endAt``,
``cpuCount``, ``memoryMB``, ``diskSizeMB``, ``state``, ``metadata``) and its errors
``{"code", "message"}``; the code interpreter's contexts ``{"id", "language", "cwd"}`` and the
lines of its ``/execute`` stream; envd's written files, its Connect RPC messages (protobuf JSON,
camelCase) and their errors ``{"code": "not_found", "message"}``. Request bodies are the
routes' own models (:mod:`~sunroom.service.e2b.control`,
:mod:`~sunroom.service.e2b.interpreter`) but for envd's RPC requests, which are here.

Answers admit fields they do not name (E2B adds fields; a client must ignore them).
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal

import pydantic

__all__ = [
    "CodeContext",
    "CodeContexts",
    "ConnectError",
    "CreatedSandbox",
    "E2BError",
    "EndOfExecutionLine",
    "EntryInfo",
    "EntryOut",
    "ErrorLine",
    "ExecuteLine",
    "ExecutionCountLine",
    "HealthOK",
    "KeepaliveLine",
    "ListDirOut",
    "ListDirRequest",
    "ListedSandbox",
    "ListedSandboxes",
    "Nothing",
    "Null",
    "OutputLine",
    "PathRequest",
    "ResultLine",
    "SandboxDetail",
    "WrittenFile",
    "WrittenFiles",
]


class _Answer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


# -- the control plane (E2B's REST API) --------------------------------------------------------


class E2BError(_Answer):
    """An error of the control plane or of envd's file routes: ``{"code", "message"}``."""

    code: int = pydantic.Field(description="The HTTP status")
    message: str = pydantic.Field(description="One sentence")


class CreatedSandbox(_Answer):
    """E2B's ``Sandbox``: what create and connect answer, the sandbox's tokens included."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    envdAccessToken: str = pydantic.Field(
        description="The sandbox's own token for its routes (X-Access-Token)"
    )
    trafficAccessToken: str = pydantic.Field(
        description="The sandbox's traffic token (E2B-Traffic-Access-Token)"
    )


class ListedSandbox(_Answer):
    """E2B's ``ListedSandbox`` (no tokens)."""

    templateID: str
    sandboxID: str
    clientID: str
    startedAt: datetime.datetime
    endAt: datetime.datetime = pydantic.Field(description="When the sandbox's timeout kills it")
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: Literal["running", "paused"] = pydantic.Field(description="Always running here")
    envdVersion: str
    metadata: dict[str, str]


class ListedSandboxes(pydantic.RootModel[list[ListedSandbox]]):
    """A page of sandboxes (the next page's ``nextToken`` in the ``x-next-token`` header)."""


class SandboxDetail(ListedSandbox):
    """E2B's ``SandboxDetail``: a listed sandbox with its envd token."""

    envdAccessToken: str
    allowInternetAccess: bool | None = pydantic.Field(
        default=None, description="False: sandboxes here have no network"
    )


# -- the code interpreter (a sandbox's port 49999) ---------------------------------------------


class CodeContext(_Answer):
    """A code context: a namespace of its own (a kernel of its own here)."""

    id: str
    language: str
    cwd: str


class CodeContexts(pydantic.RootModel[list[CodeContext]]):
    """A sandbox's code contexts, the default one included."""


class Null(pydantic.RootModel[None]):
    """JSON ``null``: a context restarted or removed."""


class HealthOK(pydantic.RootModel[Literal["OK"]]):
    """The code interpreter's health: the JSON string ``"OK"``."""


class OutputLine(_Answer):
    """What the cell wrote, as it wrote it (whole lines; a partial one after a pause)."""

    type: Literal["stdout", "stderr"]
    text: str
    timestamp: int = pydantic.Field(description="Unix time in nanoseconds")


class ResultLine(_Answer):
    """A display item or the main result (the cell's trailing value), by MIME type.

    The MIME types E2B names have fields of their own; the others are in ``extra``. Binary
    ones (``png``, ``jpeg``, ``pdf``) are base64.
    """

    model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["result"]
    is_main_result: bool
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json_: Any = pydantic.Field(default=None, alias="json")
    javascript: str | None = None
    data: Any = None
    chart: Any = None
    extra: dict[str, Any] | None = None


class ErrorLine(_Answer):
    """The cell raised: the exception's class name, its message and its traceback."""

    type: Literal["error"]
    name: str
    value: str
    traceback: str


class ExecutionCountLine(_Answer):
    """The context's execution count after this cell (every execution counts)."""

    type: Literal["number_of_executions"]
    execution_count: int


class KeepaliveLine(_Answer):
    """Sent after a few seconds without output, so a proxy keeps the stream open."""

    type: Literal["keepalive"]


class EndOfExecutionLine(_Answer):
    """The last line of an execution that ran to its end."""

    type: Literal["end_of_execution"]


class ExecuteLine(
    pydantic.RootModel[
        Annotated[
            OutputLine
            | ResultLine
            | ErrorLine
            | ExecutionCountLine
            | KeepaliveLine
            | EndOfExecutionLine,
            pydantic.Field(discriminator="type"),
        ]
    ]
):
    """One line of ``POST /execute``'s newline-delimited JSON, told apart by ``type``."""


# -- envd (a sandbox's files) ------------------------------------------------------------------


class WrittenFile(_Answer):
    """A file ``POST /files`` wrote."""

    name: str
    type: Literal["file"]
    path: str


class WrittenFiles(pydantic.RootModel[list[WrittenFile]]):
    """The files ``POST /files`` wrote, in the order of the request."""


class PathRequest(pydantic.BaseModel):
    """The body of ``Stat`` and ``Remove``."""

    path: str


class ListDirRequest(pydantic.BaseModel):
    """The body of ``ListDir``."""

    path: str
    depth: int = pydantic.Field(
        default=0, ge=0, description="Levels to list (0 and 1: its own entries)"
    )


class EntryInfo(_Answer):
    """envd's ``EntryInfo`` in protobuf JSON (a field at its default value may be left out)."""

    name: str | None = None
    type: (
        Literal[
            "FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK"
        ]
        | None
    ) = None
    path: str | None = None
    size: int | str | None = pydantic.Field(
        default=None, description="Bytes (int64: protobuf JSON may write it as a string)"
    )
    mode: int | None = None
    permissions: str | None = None
    owner: str | None = None
    group: str | None = None
    modifiedTime: datetime.datetime | None = None
    symlinkTarget: str | None = None
    isSymlink: bool | None = None
    metadata: dict[str, str] | None = None


class ListDirOut(_Answer):
    """``ListDir``'s answer."""

    entries: list[EntryInfo] = pydantic.Field(default_factory=list)


class EntryOut(_Answer):
    """``Stat``'s answer."""

    entry: EntryInfo | None = None


class Nothing(_Answer):
    """``Remove``'s answer: ``{}``."""


class ConnectError(_Answer):
    """A Connect RPC's error: its Connect code (``not_found``, ``unimplemented`` ...)."""

    code: str
    message: str
