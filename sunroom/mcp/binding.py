"""An MCP tool as a host function: :func:`tool_function`.

The tool's ``inputSchema`` becomes a Python signature whose parameters carry their JSON Schema
(``Annotated[Any, WithJsonSchema(...)]``), so the one JSON Schema → kernel source path of
:mod:`sunroom.sandbox.codegen` renders them, exactly as for host functions: nested objects as
dataclasses, enums, arrays, optionals and defaults. Required properties come first, then the
optional ones; an optional property without a default shows as ``= None`` and is left out of
the call when it is None. Property and tool names that are not Python identifiers are mapped to
ones that are (``from`` → ``from_``, ``get-issue`` → ``get_issue``) and back.

Arguments are validated on the host against the tool's schema (``jsonschema``) before the server
sees them. The result is the tool's structured content, typed by its ``outputSchema`` (a schema
that only wraps ``{"result": ...}``, as SDK servers make for plain return values, is unwrapped),
or else its content parts (see :mod:`sunroom.prelude.mcp`). ``isError`` raises
:class:`~sunroom.errors.McpToolError` with the server's message.
"""

from __future__ import annotations

import base64
import inspect
import json
import keyword
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Final

import jsonschema
import pydantic
from mcp import types as mcp_types

from sunroom.errors import HostFunctionArgumentError, HostFunctionError, McpToolError
from sunroom.mcp.servers import McpServer
from sunroom.sandbox.codegen import MCP_CONTENT
from sunroom.sandbox.functions import HostFunction

__all__ = ["python_name", "tool_function"]

_log = logging.getLogger(__name__)

Caller = Callable[[str, dict[str, object]], Awaitable[mcp_types.CallToolResult]]

_MAX_DEPTH: Final = 32
_CONTENT: Final = Annotated[Any, pydantic.WithJsonSchema({"x-sunroom-python": MCP_CONTENT})]


def python_name(text: str, taken: set[str]) -> str:
    """A public identifier for *text* not in *taken* (which it is then added to)."""
    name = re.sub(r"\W", "_", text).lstrip("_") or "arg"
    if name[0].isdigit():
        name = f"n{name}"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        name += "_"
    base, n = name, 2
    while name in taken:
        name = f"{base}_{n}"
        n += 1
    taken.add(name)
    return name


def _inline(node: Any, root: Mapping[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """*node* with local ``$ref``s replaced by what they name (a cycle becomes ``{}``: Any)."""
    if isinstance(node, list):
        return [_inline(v, root, seen) for v in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        target: Any = None
        for prefix, key in (("#/$defs/", "$defs"), ("#/definitions/", "definitions")):
            if ref.startswith(prefix):
                target = (root.get(key) or {}).get(ref[len(prefix) :])
        if target is None or ref in seen or len(seen) >= _MAX_DEPTH:
            return {k: _inline(v, root, seen) for k, v in node.items() if k != "$ref"}
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, root, (*seen, ref))
    return {k: _inline(v, root, seen) for k, v in node.items() if k not in ("$defs", "definitions")}


def _output(tool: mcp_types.Tool) -> tuple[Any, bool, dict[str, Any]]:
    """The return annotation, whether the result is unwrapped, and the return's schema.

    Structured results are unwrapped from ``{"result": ...}`` when the schema only wraps.
    """
    schema = tool.output_schema
    if not isinstance(schema, Mapping):
        return _CONTENT, False, {"x-sunroom-python": MCP_CONTENT}
    flat = _inline(schema, schema)
    props = flat.get("properties")
    wrapped = (
        isinstance(props, Mapping)
        and list(props) == ["result"]
        and flat.get("required") == ["result"]
        and str(flat.get("title", "")).endswith("Output")
    )
    if wrapped:
        flat = props["result"]
    flat = {k: v for k, v in flat.items() if k != "title" or not wrapped}
    return Annotated[Any, pydantic.WithJsonSchema(flat)], wrapped, flat


def _validator(tool: mcp_types.Tool, qualname: str) -> jsonschema.protocols.Validator | None:
    schema = tool.input_schema
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except jsonschema.SchemaError as exc:
        _log.warning("%s(): its input schema is invalid, arguments go unchecked: %s", qualname, exc)
        return None


def _describe(tool: mcp_types.Tool, server: McpServer) -> str:
    text = (tool.description or "").strip()
    note = f"MCP tool {tool.name!r} of the server {server.name!r}."
    hints = tool.annotations
    if hints is not None:
        flags = [
            word
            for word, on in (
                ("read-only", hints.read_only_hint),
                ("destructive", hints.destructive_hint),
                ("idempotent", hints.idempotent_hint),
            )
            if on
        ]
        if flags:
            note += f" Declared {', '.join(flags)}."
    return f"{text}\n\n{note}" if text else note


def tool_function(server: McpServer, tool: mcp_types.Tool, attr: str, call: Caller) -> HostFunction:
    """Host function ``<server>.<attr>`` calling *tool* through *call*."""
    qualname = f"{server.name}.{attr}"
    schema = tool.input_schema if isinstance(tool.input_schema, Mapping) else {}
    props: Mapping[str, object] = schema.get("properties") or {}
    required = [k for k in props if k in set(schema.get("required") or [])]
    optional = [k for k in props if k not in required]
    taken: set[str] = set()
    to_json: dict[str, str] = {}
    drop_none: set[str] = set()
    params: list[inspect.Parameter] = []
    annotations: dict[str, object] = {}
    kernel_props: dict[str, object] = {}
    for key in [*required, *optional]:
        py = python_name(key, taken)
        to_json[py] = key
        sub = _inline(props[key], schema)
        if not isinstance(sub, Mapping):
            sub = {}
        default: object = inspect.Parameter.empty
        if key not in required:
            if "default" in sub:
                default = sub["default"]
            else:
                default = None
                drop_none.add(py)
                sub = {"anyOf": [sub, {"type": "null"}]}
        kernel_props[py] = dict(sub)
        annotation = Annotated[Any, pydantic.WithJsonSchema(dict(sub))]
        annotations[py] = annotation
        params.append(
            inspect.Parameter(
                py, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation
            )
        )
    returns, unwrap, returns_schema = _output(tool)
    annotations["return"] = returns
    # built at the first call: checking a schema costs ~1 ms
    validator: list[jsonschema.protocols.Validator | None] = []
    structured = tool.output_schema is not None

    async def call_tool(**kwargs: Any) -> object:  # JSON arguments, checked by the schema
        arguments = {to_json[k]: v for k, v in kwargs.items() if not (k in drop_none and v is None)}
        if not validator:
            validator.append(_validator(tool, qualname))
        if validator[0] is not None:
            error = jsonschema.exceptions.best_match(validator[0].iter_errors(arguments))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path)
                at = f" at {where!r}" if where else ""
                raise HostFunctionArgumentError(f"{qualname}(): {error.message}{at}")
        result = await call(tool.name, arguments)
        return _result(server, qualname, result, structured=structured, unwrap=unwrap)

    call_tool.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    call_tool.__annotations__ = annotations
    call_tool.__name__ = call_tool.__qualname__ = attr
    return HostFunction(
        fn=call_tool,
        name=qualname,
        description=_describe(tool, server),
        timeout_s=server.timeout_s,
        max_concurrency=server.max_concurrency,
        budget=server.budget,
        parameters_schema={
            "type": "object",
            "properties": kernel_props,
            "required": [py for py, key in to_json.items() if key in required],
        },
        returns_schema=returns_schema,
    )


def _result(
    server: McpServer,
    qualname: str,
    result: mcp_types.CallToolResult,
    *,
    structured: bool,
    unwrap: bool,
) -> object:
    parts: list[object] = []
    size = 0
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            parts.append(item.text)
            size += len(item.text)
        elif isinstance(item, mcp_types.ImageContent | mcp_types.AudioContent):
            data = base64.b64decode(item.data)
            kind = "image" if isinstance(item, mcp_types.ImageContent) else "audio"
            parts.append({"type": kind, "data": data, "mime_type": item.mime_type})
            size += len(data)
        elif isinstance(item, mcp_types.EmbeddedResource):
            res = item.resource
            if isinstance(res, mcp_types.TextResourceContents):
                parts.append(
                    {
                        "type": "resource",
                        "uri": str(res.uri),
                        "mime_type": res.mime_type,
                        "text": res.text,
                    }
                )
                size += len(res.text)
            else:
                blob = base64.b64decode(res.blob)
                parts.append(
                    {
                        "type": "resource",
                        "uri": str(res.uri),
                        "mime_type": res.mime_type,
                        "blob": blob,
                    }
                )
                size += len(blob)
        elif isinstance(item, mcp_types.ResourceLink):
            parts.append({"type": "resource", "uri": str(item.uri), "mime_type": item.mime_type})
    data = result.structured_content
    if data is not None:
        size = max(size, len(json.dumps(data, default=str)))
    if size > server.max_result_bytes:
        raise HostFunctionError(
            f"{qualname}() returned {size:,} bytes, over the {server.max_result_bytes:,}-byte cap"
            f" on results from the MCP server {server.name!r} (max_result_bytes)"
        )
    if result.is_error:
        text = "\n".join(p for p in parts if isinstance(p, str)).strip()
        for secret in server.secrets():
            text = text.replace(secret, "***")
        raise McpToolError(f"{qualname}() failed: {text or 'the tool reported an error'}")
    if structured and data is not None:
        return data.get("result") if unwrap and isinstance(data, Mapping) else data
    texts = [p for p in parts if isinstance(p, str)]
    if len(texts) == len(parts):
        return "\n".join(texts)
    return parts[0] if len(parts) == 1 else parts
