"""OpenAI Responses API adapter (``openai:`` models), on the official async SDK.

Reasoning items come back as :class:`~sunroom.providers.ThinkingPart` (summary text, item
id and encrypted content) and are replayed in place with the ids of the items that follow
them, as the API requires. To keep reasoning across turns without server-side storage,
pass ``extra_body={"store": False, "include": ["reasoning.encrypted_content"]}``.

The Responses API has no stop sequences: ``Settings.stop`` raises
:class:`~sunroom.errors.UsageError` here (use ``openai-compatible:`` for them).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Unpack, final

from sunroom.errors import ProviderError, UsageError

from . import _errors
from ._base import VendorModel
from .assembly import ResponseBuilder, parse_arguments
from .config import ModelOptions, missing_key, sdk_and_key
from .events import Done, StreamEvent, UsageUpdate
from .messages import (
    AssistantMessage,
    AssistantPart,
    ImagePart,
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
    from openai import AsyncOpenAI

__all__ = ["OpenAIResponsesModel"]

PROVIDER = "openai"


def image_url(part: ImagePart) -> str:
    """The URL of an image part, inline images as a ``data:`` URL."""
    return part.url if part.url is not None else f"data:{part.media_type};base64,{part.base64()}"


def _assistant_items(message: AssistantMessage) -> list[dict[str, object]]:
    items: list[dict[str, Any]] = []
    for part in message.content:
        origin = part.origin if part.origin and part.origin.provider == PROVIDER else None
        if isinstance(part, ThinkingPart):
            if origin is None or origin.item_id is None:
                continue  # reasoning from elsewhere cannot be replayed
            summary = [{"type": "summary_text", "text": part.text}] if part.text else []
            item: dict[str, object] = {
                "type": "reasoning",
                "id": origin.item_id,
                "summary": summary,
            }
            if origin.signature is not None:
                item["encrypted_content"] = origin.signature
            items.append(item)
        elif isinstance(part, TextPart):
            item_id = origin.item_id if origin else None
            content = {"type": "output_text", "text": part.text, "annotations": []}
            last = items[-1] if items else None
            if item_id and last and last.get("type") == "message" and last.get("id") == item_id:
                last["content"].append(content)
                continue
            message_item: dict[str, object] = {
                "type": "message",
                "role": "assistant",
                "content": [content],
                "status": "completed",
            }
            if item_id:
                message_item["id"] = item_id
            items.append(message_item)
        else:
            call: dict[str, object] = {
                "type": "function_call",
                "call_id": part.id,
                "name": part.name,
                "arguments": part.raw_arguments or json.dumps(dict(part.arguments)),
            }
            if origin and origin.item_id:
                call["id"] = origin.item_id
            items.append(call)
    return items


def encode_input(request: Request) -> tuple[str | None, list[dict[str, object]]]:
    """Return ``(instructions, input items)`` for the Responses API."""
    system: list[str] = []
    items: list[dict[str, object]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            system.append(message.text)
        elif isinstance(message, UserMessage):
            content = [
                {"type": "input_text", "text": p.text}
                if isinstance(p, TextPart)
                else {"type": "input_image", "image_url": image_url(p), "detail": "auto"}
                for p in message.content
            ]
            items.append({"role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            items.extend(_assistant_items(message))
        elif isinstance(message, ToolResultMessage):
            output = f"Error: {message.content}" if message.is_error else message.content
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            )
    return ("\n\n".join(system) if system else None), items


def encode_request(name: str, request: Request, settings: Settings) -> dict[str, Any]:
    """Return the keyword arguments for ``client.responses.create``."""
    if settings.stop:
        raise UsageError("the OpenAI Responses API has no stop sequences; use openai-compatible:")
    instructions, items = encode_input(request)
    kwargs: dict[str, object] = {"model": name, "input": items}
    if instructions is not None:
        kwargs["instructions"] = instructions
    if request.tools:
        kwargs["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
                "strict": t.strict,
            }
            for t in request.tools
        ]
    choice = settings.tool_choice
    if choice is not None:
        known = choice in ("auto", "required", "none")
        kwargs["tool_choice"] = choice if known else {"type": "function", "name": choice}
    if request.output_schema is not None:
        out = request.output_schema
        kwargs["text"] = {
            "format": {
                "type": "json_schema",
                "name": out.name,
                "schema": dict(out.schema),
                "strict": out.strict,
            }
        }
    if settings.max_output_tokens is not None:
        kwargs["max_output_tokens"] = settings.max_output_tokens
    if settings.temperature is not None:
        kwargs["temperature"] = settings.temperature
    if settings.extra_body:
        kwargs["extra_body"] = dict(settings.extra_body)
    return kwargs


def decode_usage(usage: Any) -> Usage:
    """Normalize Responses usage (input includes cached; output includes reasoning)."""
    if usage is None:
        return Usage()
    cached = getattr(usage.input_tokens_details, "cached_tokens", 0) or 0
    reasoning = getattr(usage.output_tokens_details, "reasoning_tokens", 0) or 0
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )


def _reasoning_text(item: Any) -> str:
    summary = item.summary or []
    texts = [s.text for s in summary]
    if not texts and getattr(item, "content", None):
        texts = [c.text for c in item.content]
    return "\n\n".join(texts)


def _finish(response: Any, has_tools: bool) -> tuple[FinishReason, str | None]:
    status = response.status
    if status == "failed":
        error = response.error
        raise _errors.from_status(
            PROVIDER,
            None,
            getattr(error, "message", "the response failed"),
            body=error.model_dump() if error is not None else None,
            kind=getattr(error, "code", None),
        )
    if status == "incomplete":
        reason = getattr(response.incomplete_details, "reason", None)
        if reason == "content_filter":
            return "content_filter", reason
        return "length", reason
    return ("tool_use" if has_tools else "stop"), status


def decode_response(response: Any) -> Response:
    """Convert an SDK ``Response`` to a :class:`Response` (cost unset)."""
    parts: list[AssistantPart] = []
    refused = False
    for item in response.output:
        if item.type == "reasoning":
            origin = Origin(PROVIDER, item_id=item.id, signature=item.encrypted_content)
            parts.append(ThinkingPart(_reasoning_text(item), origin))
        elif item.type == "message":
            origin = Origin(PROVIDER, item_id=item.id)
            for content in item.content:
                if content.type == "output_text":
                    parts.append(TextPart(content.text, origin))
                elif content.type == "refusal":
                    refused = True
                    parts.append(TextPart(content.refusal, origin))
        elif item.type == "function_call":
            arguments, raw = parse_arguments(item.arguments)
            origin = Origin(PROVIDER, item_id=item.id)
            parts.append(ToolCall(item.call_id, item.name, arguments, raw, origin))
    message = AssistantMessage(parts)
    finish, raw_reason = _finish(response, bool(message.tool_calls))
    return Response(
        message=message,
        finish_reason="content_filter" if refused else finish,
        usage=decode_usage(response.usage),
        model=response.model,
        id=response.id,
        raw_finish_reason=raw_reason,
    )


def translate_openai(provider: str, exc: BaseException) -> ProviderError | None:
    """Map an ``openai`` SDK (or transport) exception; shared with the Chat adapter."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        error = body.get("error", body) if isinstance(body, dict) else None
        message = _errors.nested(error, "message") if isinstance(error, dict) else None
        return _errors.from_status(
            provider,
            exc.status_code,
            str(message or exc.message),
            body=body,
            kind=_errors.nested(error, "type") if isinstance(error, dict) else None,
            code=_errors.nested(error, "code") if isinstance(error, dict) else None,
            retry_after=_errors.retry_after_seconds(exc.response.headers),
        )
    if isinstance(exc, openai.APITimeoutError):
        return _errors.timeout(provider)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return _errors.connection(
            provider, f"{type(cause).__name__}: {cause}" if cause else str(exc)
        )
    if isinstance(exc, openai.APIError) and isinstance(exc.body, dict):
        # An error sent inside a 200 event stream.
        body = exc.body
        return _errors.from_status(
            provider,
            None,
            str(body.get("message") or exc.message),
            body=body,
            kind=body.get("type"),
            code=body.get("code"),
        )
    transport = _errors.from_transport(provider, exc)
    if transport is not None:
        return transport
    if isinstance(exc, openai.OpenAIError):
        return ProviderError(f"{provider}: {exc}", provider=provider)
    return None


def make_openai_client(model: VendorModel[Any]) -> AsyncOpenAI:
    """Build the ``AsyncOpenAI`` client of an adapter (SDK retries off)."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        api_key=model.config.api_key,
        base_url=model.config.base_url,
        default_headers=dict(model.config.headers) or None,
        timeout=model.config.timeout,
        max_retries=0,
    )


@final
class OpenAIResponsesModel(VendorModel["AsyncOpenAI"]):
    """An OpenAI model through the Responses API.

    Args:
        name: The model id, e.g. ``"gpt-5"``.
        api_key: Defaults to ``$OPENAI_API_KEY``; a missing key raises
            :class:`~sunroom.errors.AuthenticationError` here.
        base_url: Another endpoint speaking the Responses API (a proxy, llama.cpp's server);
            it must include the version prefix, e.g. ``http://127.0.0.1:8080/v1``.
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
        **options: Unpack[ModelOptions],
    ) -> None:
        key = sdk_and_key(
            sdk="openai",
            family="openai",
            provider=PROVIDER,
            api_key=api_key,
            env=("OPENAI_API_KEY",),
        )
        if not key:
            raise missing_key("OPENAI_API_KEY", provider=PROVIDER)
        super().__init__(
            name, api_key=key, base_url=base_url, price_family=PROVIDER, options=options
        )

    def _make_client(self) -> AsyncOpenAI:
        return make_openai_client(self)

    async def _close_client(self, client: AsyncOpenAI) -> None:
        await client.close()

    async def _complete_once(
        self, client: AsyncOpenAI, request: Request, settings: Settings, limit: float | None
    ) -> Response:
        kwargs = encode_request(self.name, request, settings)
        return decode_response(await client.responses.create(**kwargs, timeout=limit))

    async def _open_stream(
        self, client: AsyncOpenAI, request: Request, settings: Settings, limit: float | None
    ) -> object:
        kwargs = encode_request(self.name, request, settings)
        return await client.responses.create(**kwargs, stream=True, timeout=limit)

    async def _close_stream(self, opened: Any) -> None:
        await opened.close()

    async def _read_stream(
        self, opened: Any, builder: ResponseBuilder
    ) -> AsyncIterator[StreamEvent]:
        out: StreamEvent | None
        async for event in opened:
            kind = event.type
            if kind == "response.output_text.delta":
                origin = Origin(PROVIDER, item_id=event.item_id)
                out = builder.text((event.output_index, event.content_index), event.delta, origin)
            elif kind == "response.function_call_arguments.delta":
                out = builder.tool_args(event.output_index, event.delta)
            elif kind in (
                "response.reasoning_summary_text.delta",
                "response.reasoning_text.delta",
            ):
                out = builder.thinking(event.output_index, event.delta)
            elif kind == "response.refusal.delta":
                origin = Origin(PROVIDER, item_id=event.item_id)
                out = builder.text((event.output_index, event.content_index), event.delta, origin)
            elif kind == "response.output_item.added":
                out = _item_added(builder, event.output_index, event.item)
            elif kind == "response.output_item.done":
                out = _item_done(builder, event.output_index, event.item)
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                response = event.response
                builder.usage = decode_usage(response.usage)
                yield UsageUpdate(builder.usage)
                for key in builder.open_tools():
                    closed = builder.tool_end(key)
                    if closed is not None:
                        yield closed
                finish, raw = _finish(response, builder.tool_count > 0)
                yield Done(
                    builder.build(
                        finish, model=response.model, id=response.id, raw_finish_reason=raw
                    )
                )
                return
            elif kind == "error":
                raise _errors.from_status(
                    PROVIDER, None, event.message, body=event.model_dump(), kind=event.code
                )
            else:
                out = None
            if out is not None:
                yield out

    async def count_tokens(self, request: Request) -> int:
        """Ask the vendor's ``/v1/responses/input_tokens`` endpoint; retried like a call."""
        kwargs = encode_request(self.name, request, self.settings.merged(request.settings))
        for key in ("max_output_tokens", "temperature", "extra_body"):
            kwargs.pop(key, None)

        async def count(client: AsyncOpenAI, limit: float | None) -> int:
            result = await client.responses.input_tokens.count(**kwargs, timeout=limit)
            return int(result.input_tokens)

        return await self._count_with_retry(count)

    def _translate(self, exc: BaseException) -> ProviderError | None:
        return translate_openai(PROVIDER, exc)


def _item_added(builder: ResponseBuilder, index: int, item: Any) -> StreamEvent | None:
    if item.type == "function_call":
        return builder.tool_start(index, item.call_id, item.name, Origin(PROVIDER, item_id=item.id))
    if item.type == "reasoning":
        origin = Origin(PROVIDER, item_id=item.id, signature=item.encrypted_content)
        return builder.thinking(index, "", origin)
    return None


def _item_done(builder: ResponseBuilder, index: int, item: Any) -> StreamEvent | None:
    if item.type == "function_call":
        if not builder.has_tool(index):
            builder.tool_start(index, item.call_id, item.name, Origin(PROVIDER, item_id=item.id))
        if not builder.has_arguments(index) and item.arguments:
            builder.tool_args(index, item.arguments)
        return builder.tool_end(index)
    if item.type == "reasoning":
        origin = Origin(PROVIDER, item_id=item.id, signature=item.encrypted_content)
        if builder.origin_of(index) is None:
            builder.thinking(index, _reasoning_text(item), origin)
        else:
            builder.set_origin(index, origin)
    return None
