"""Google Gemini adapter (``gemini:`` models), on ``google-genai``'s async client.

Uses the Gemini Developer API (``generateContent`` / ``streamGenerateContent``, API version
``v1beta`` by default). Thought signatures on text and function-call parts are kept in
:class:`~sunroom.providers.Origin` and returned with the parts, as Gemini requires for
multi-turn function calling. Gemini sends each function call whole, never as partial
arguments. Gemini's API has no call ids; calls without one get ``gemini_call_<n>``, which
the API accepts back. ``Settings.extra_body`` is merged recursively into the request body
(e.g. ``{"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}``).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Unpack, final

from sunroom.errors import AuthenticationError, ProviderError

from . import _errors
from ._base import VendorModel
from .assembly import ResponseBuilder
from .config import ModelOptions, missing_key, sdk_and_key
from .events import Done, StreamEvent, UsageUpdate
from .messages import (
    AssistantMessage,
    AssistantPart,
    Origin,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from .response import FinishReason, Response, Usage
from .settings import Request, Settings

if TYPE_CHECKING:
    from google.genai import Client

__all__ = ["GeminiModel"]

PROVIDER = "gemini"
_ids = itertools.count(1)

_FINISH: dict[str, FinishReason] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "LANGUAGE": "error",
    "MALFORMED_FUNCTION_CALL": "error",
    "UNEXPECTED_TOOL_CALL": "error",
    "TOO_MANY_TOOL_CALLS": "error",
    "MISSING_THOUGHT_SIGNATURE": "error",
    "MALFORMED_RESPONSE": "error",
    "OTHER": "error",
}


def _sig(origin: Origin | None) -> bytes | None:
    if origin is None or origin.provider != PROVIDER or origin.signature is None:
        return None
    return base64.b64decode(origin.signature)


def _with_sig(part: dict[str, object], origin: Origin | None) -> dict[str, object]:
    signature = _sig(origin)
    if signature is not None:
        part["thought_signature"] = signature
    return part


def _model_part(part: AssistantPart) -> dict[str, object] | None:
    if isinstance(part, TextPart):
        return _with_sig({"text": part.text}, part.origin) if part.text else None
    if isinstance(part, ToolCall):
        call = {"id": part.id, "name": part.name, "args": dict(part.arguments)}
        return _with_sig({"function_call": call}, part.origin)
    if _sig(part.origin) is None:
        return None  # thoughts from elsewhere, or unsigned, are not replayed
    return _with_sig({"text": part.text, "thought": True}, part.origin)


def encode_contents(request: Request) -> tuple[str | None, list[Any]]:
    """Return ``(system_instruction, contents)`` for ``generate_content``.

    The contents are plain dicts; typed ``list[Any]`` because google-genai's parameter type
    changes with the packages installed beside it (Pillow adds its ``Image``).
    """
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in request.messages:
        if isinstance(message, SystemMessage):
            system.append(message.text)
        elif isinstance(message, UserMessage):
            parts: list[dict[str, object]] = []
            for p in message.content:
                if isinstance(p, TextPart):
                    parts.append({"text": p.text})
                elif p.url is not None:
                    parts.append({"file_data": {"file_uri": p.url, "mime_type": p.media_type}})
                else:
                    parts.append({"inline_data": {"mime_type": p.media_type, "data": p.data}})
            contents.append({"role": "user", "parts": parts})
        elif isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                names[call.id] = call.name
            model_parts = [m for p in message.content if (m := _model_part(p)) is not None]
            if model_parts:
                contents.append({"role": "model", "parts": model_parts})
        elif isinstance(message, ToolResultMessage):
            key = "error" if message.is_error else "output"
            name = message.name or names.get(message.tool_call_id, "")
            part = {
                "function_response": {
                    "id": message.tool_call_id,
                    "name": name,
                    "response": {key: message.content},
                }
            }
            last = contents[-1] if contents else None
            if last and last["role"] == "user" and "function_response" in last["parts"][-1]:
                last["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
    return ("\n\n".join(system) if system else None), contents


def encode_config(
    request: Request, settings: Settings, limit: float | None, system: str | None
) -> dict[str, object] | None:
    """Return the ``GenerateContentConfig`` (as a dict) for a request; ``None`` when empty.

    Tools are declarations, never Python callables, so google-genai's automatic function
    calling never runs and is not configured (any config costs google-genai a slow
    field-by-field conversion).
    """
    config: dict[str, object] = {}
    if system is not None:
        config["system_instruction"] = system
    if settings.temperature is not None:
        config["temperature"] = settings.temperature
    if settings.max_output_tokens is not None:
        config["max_output_tokens"] = settings.max_output_tokens
    if settings.stop:
        config["stop_sequences"] = list(settings.stop)
    if request.tools:
        declarations = [
            {
                "name": t.name,
                "description": t.description,
                "parameters_json_schema": dict(t.parameters),
            }
            for t in request.tools
        ]
        config["tools"] = [{"function_declarations": declarations}]
    choice = settings.tool_choice
    if choice is not None:
        mode = {"auto": "AUTO", "required": "ANY", "none": "NONE"}.get(choice, "ANY")
        calling: dict[str, object] = {"mode": mode}
        if mode == "ANY" and choice != "required":
            calling["allowed_function_names"] = [choice]
        config["tool_config"] = {"function_calling_config": calling}
    if request.output_schema is not None:
        config["response_mime_type"] = "application/json"
        config["response_json_schema"] = dict(request.output_schema.schema)
    http: dict[str, object] = {}
    if limit is not None:
        http["timeout"] = max(int(limit * 1000), 1)
    if settings.extra_body:
        http["extra_body"] = dict(settings.extra_body)
    if http:
        config["http_options"] = http
    return config or None


def decode_usage(meta: Any) -> Usage:
    """Normalize ``usageMetadata`` (prompt includes cached; thoughts are billed as output)."""
    if meta is None:
        return Usage()
    thoughts = meta.thoughts_token_count or 0
    return Usage(
        input_tokens=(meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0),
        output_tokens=(meta.candidates_token_count or 0) + thoughts,
        cache_read_tokens=meta.cached_content_token_count or 0,
        reasoning_tokens=thoughts,
    )


def _origin(part: Any) -> Origin | None:
    signature = part.thought_signature
    if signature is None:
        return None
    return Origin(PROVIDER, signature=base64.b64encode(signature).decode("ascii"))


def _call(part: Any) -> ToolCall:
    call = part.function_call
    call_id = call.id or f"gemini_call_{next(_ids)}"
    return ToolCall(call_id, call.name or "", dict(call.args or {}), None, _origin(part))


def _finish(candidate: Any, has_tools: bool) -> tuple[FinishReason, str | None]:
    raw = getattr(candidate.finish_reason, "value", candidate.finish_reason)
    finish = _FINISH.get(raw or "", "stop")
    if finish == "stop" and has_tools:
        finish = "tool_use"
    return finish, raw


def decode_response(response: Any) -> Response:
    """Convert a ``GenerateContentResponse`` to a :class:`Response` (cost unset)."""
    usage = decode_usage(response.usage_metadata)
    model, rid = response.model_version or "", response.response_id
    if not response.candidates:
        feedback = response.prompt_feedback
        reason = getattr(getattr(feedback, "block_reason", None), "value", None)
        finish: FinishReason = "content_filter" if reason else "error"
        return Response(AssistantMessage(()), finish, usage, None, model, rid, reason)
    candidate = response.candidates[0]
    parts: list[AssistantPart] = []
    for part in (candidate.content.parts if candidate.content else None) or ():
        if part.function_call is not None:
            parts.append(_call(part))
        elif part.text is not None:
            if part.thought:
                parts.append(ThinkingPart(part.text, _origin(part)))
            elif part.text or part.thought_signature:
                parts.append(TextPart(part.text, _origin(part)))
    message = AssistantMessage(parts)
    finish, raw = _finish(candidate, bool(message.tool_calls))
    return Response(message, finish, usage, None, model, rid, raw)


_RETRY_DELAY = re.compile(r"^([\d.]+)s$")


def _retry_delay(details: object) -> float | None:
    for item in _errors.nested(details, "error", "details") or ():
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("RetryInfo"):
            match = _RETRY_DELAY.match(str(item.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def _bad_key(details: object) -> bool:
    """Google answers a bad API key with 400 INVALID_ARGUMENT and reason API_KEY_INVALID."""
    for item in _errors.nested(details, "error", "details") or ():
        if isinstance(item, dict) and item.get("reason") == "API_KEY_INVALID":
            return True
    return False


@final
class GeminiModel(VendorModel["Client"]):
    """A Gemini model through the Gemini Developer API.

    Args:
        name: The model id, e.g. ``"gemini-2.5-flash"``.
        api_key: Defaults to ``$GEMINI_API_KEY`` then ``$GOOGLE_API_KEY``; a missing key
            raises :class:`~sunroom.errors.AuthenticationError` here.
        base_url: Another endpoint speaking the Gemini API (a proxy).
        api_version: The API version path segment (default ``"v1beta"``).
        **options: See :class:`~sunroom.providers.ModelOptions`.

    Close the model with :meth:`aclose`.
    """

    provider = PROVIDER

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_version: str = "v1beta",
        **options: Unpack[ModelOptions],
    ) -> None:
        key = sdk_and_key(
            sdk="google.genai",
            family="gemini",
            provider=PROVIDER,
            api_key=api_key,
            env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        )
        if not key:
            raise missing_key("GEMINI_API_KEY", provider=PROVIDER)
        self.api_version = api_version
        super().__init__(
            name, api_key=key, base_url=base_url, price_family=PROVIDER, options=options
        )

    def _make_client(self) -> Client:
        from google.genai import Client, types

        http = types.HttpOptions(
            base_url=self.config.base_url,
            api_version=self.api_version,
            headers=dict(self.config.headers) or None,
            timeout=int(self.config.timeout * 1000),
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        return Client(api_key=self.config.api_key, vertexai=False, http_options=http)

    async def _close_client(self, client: Client) -> None:
        await client.aio.aclose()
        client.close()

    async def _complete_once(
        self, client: Client, request: Request, settings: Settings, limit: float | None
    ) -> Response:
        system, encoded = encode_contents(request)
        contents: Any = encoded  # the SDK's union of content types; plain dicts are one
        # The attempt's limit is enforced around this call; a per-request HTTP timeout here
        # would only make google-genai rebuild its request options (measurably slower).
        config: Any = encode_config(request, settings, None, system)
        response = await client.aio.models.generate_content(
            model=self.name, contents=contents, config=config
        )
        return decode_response(response)

    async def _open_stream(
        self, client: Client, request: Request, settings: Settings, limit: float | None
    ) -> object:
        system, encoded = encode_contents(request)
        contents: Any = encoded  # the SDK's union of content types; plain dicts are one
        config: Any = encode_config(request, settings, limit, system)
        return await client.aio.models.generate_content_stream(
            model=self.name, contents=contents, config=config
        )

    async def _close_stream(self, opened: Any) -> None:
        await opened.aclose()

    async def _read_stream(
        self, opened: Any, builder: ResponseBuilder
    ) -> AsyncIterator[StreamEvent]:
        finish: FinishReason | None = None
        raw: str | None = None
        model, rid = "", None
        slot = 0
        kind = ""
        out: StreamEvent | None
        async for chunk in opened:
            model, rid = chunk.model_version or model, chunk.response_id or rid
            if chunk.usage_metadata is not None:
                usage = decode_usage(chunk.usage_metadata)
                if usage != builder.usage:
                    builder.usage = usage
                    yield UsageUpdate(usage)
            if not chunk.candidates:
                continue
            candidate = chunk.candidates[0]
            for part in (candidate.content.parts if candidate.content else None) or ():
                origin = _origin(part)
                if part.function_call is not None:
                    slot, kind = slot + 1, "tool"
                    call = _call(part)
                    yield builder.tool_start(slot, call.id, call.name, origin)
                    raw_args = _json(call.arguments)
                    if (out := builder.tool_args(slot, raw_args)) is not None:
                        yield out
                    if (out := builder.tool_end(slot)) is not None:
                        yield out
                elif part.text is not None:
                    new_kind = "thinking" if part.thought else "text"
                    if new_kind != kind:
                        slot, kind = slot + 1, new_kind
                    if part.thought:
                        out = builder.thinking(slot, part.text, origin)
                    else:
                        out = builder.text(slot, part.text, origin)
                    if out is not None:
                        yield out
            if candidate.finish_reason is not None:
                finish, raw = _finish(candidate, builder.tool_count > 0)
        if finish is None:
            return  # no finish reason: the stream was cut (the caller raises)
        yield Done(builder.build(finish, model=model, id=rid, raw_finish_reason=raw))

    async def count_tokens(self, request: Request) -> int:
        """Ask the vendor's ``countTokens`` for the contents; retried like a call.

        The Gemini Developer API counts contents only: system instruction and tools are
        estimated locally and added.
        """
        from .tokens import estimate_text_tokens, estimate_tokens

        system, encoded = encode_contents(request)

        contents: Any = encoded  # the SDK's union of content types; plain dicts are one
        extra = estimate_tokens(Request((), tools=request.tools))
        extra += estimate_text_tokens(system or "")

        async def count(client: Client, limit: float | None) -> int:
            config: Any = {"http_options": {"timeout": int((limit or 600) * 1000)}}
            result = await client.aio.models.count_tokens(
                model=self.name, contents=contents, config=config
            )
            return int(result.total_tokens or 0) + extra

        return await self._count_with_retry(count)

    def _translate(self, exc: BaseException) -> ProviderError | None:
        from google.genai import errors

        if isinstance(exc, errors.APIError):
            if _bad_key(exc.details):
                return AuthenticationError(
                    f"{PROVIDER}: {exc.code} {exc.status}: {exc.message}",
                    provider=PROVIDER,
                    status_code=exc.code,
                    body=exc.details,
                )
            return _errors.from_status(
                PROVIDER,
                exc.code,
                str(exc.message or exc),
                body=exc.details,
                kind=exc.status,
                retry_after=_retry_delay(exc.details),
            )
        transport = _errors.from_transport(PROVIDER, exc)
        if transport is not None:
            return transport
        aiohttp = _aiohttp()
        if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
            return _errors.connection(PROVIDER, f"{type(exc).__name__}: {exc}")
        return None


def _json(arguments: Any) -> str:
    return json.dumps(dict(arguments), separators=(",", ":"))


def _aiohttp() -> Any:
    return sys.modules.get("aiohttp")
