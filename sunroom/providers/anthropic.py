"""Anthropic Messages API adapter (``anthropic:`` models), on the official async SDK.

Thinking blocks (with their signatures) and redacted thinking come back as
:class:`~sunroom.providers.ThinkingPart` and are replayed verbatim; prompt-cache reads and
writes are reported in :class:`~sunroom.providers.Usage`. ``temperature`` and every
``Settings.extra_body`` key (``thinking``, ``cache_control``, ``metadata`` ...) are sent in
the request body as given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Unpack, final

from sunroom.errors import ProviderError

from . import _errors
from ._base import VendorModel
from .assembly import ResponseBuilder
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
    from anthropic import AsyncAnthropic
    from anthropic.types import RawContentBlockDeltaEvent, RawContentBlockStartEvent

__all__ = ["AnthropicModel"]

PROVIDER = "anthropic"
DEFAULT_MAX_TOKENS = 8192

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def _user_block(part: TextPart | ImagePart) -> dict[str, object]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if part.url is not None:
        return {"type": "image", "source": {"type": "url", "url": part.url}}
    source = {"type": "base64", "media_type": part.media_type, "data": part.base64()}
    return {"type": "image", "source": source}


def _assistant_block(part: AssistantPart) -> dict[str, object] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": dict(part.arguments)}
    origin = part.origin
    if origin is None or origin.provider != PROVIDER or origin.signature is None:
        return None  # another vendor's reasoning cannot be replayed here
    if part.redacted:
        return {"type": "redacted_thinking", "data": origin.signature}
    return {"type": "thinking", "thinking": part.text, "signature": origin.signature}


def encode_messages(request: Request) -> tuple[str | None, list[dict[str, object]]]:
    """Return ``(system, messages)`` in the Messages API shape."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            system.append(message.text)
        elif isinstance(message, UserMessage):
            blocks = [_user_block(p) for p in message.content]
            if out and out[-1]["role"] == "user":  # e.g. images after tool results: one turn
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})
        elif isinstance(message, AssistantMessage):
            blocks = [b for p in message.content if (b := _assistant_block(p)) is not None]
            if blocks:
                out.append({"role": "assistant", "content": blocks})
        elif isinstance(message, ToolResultMessage):
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.is_error,
            }
            last = out[-1] if out else None
            if last and last["role"] == "user" and last["content"][-1]["type"] == "tool_result":
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
    return ("\n\n".join(system) if system else None), out


def _tool_choice(choice: str) -> dict[str, object]:
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def encode_request(name: str, request: Request, settings: Settings) -> dict[str, Any]:
    """Return the keyword arguments for ``client.messages.create``."""
    system, messages = encode_messages(request)
    kwargs: dict[str, object] = {
        "model": name,
        "messages": messages,
        "max_tokens": settings.max_output_tokens or DEFAULT_MAX_TOKENS,
    }
    if system is not None:
        kwargs["system"] = system
    if request.tools:
        tools = []
        for tool in request.tools:
            spec: dict[str, object] = {
                "name": tool.name,
                "description": tool.description,
                "input_schema": dict(tool.parameters),
            }
            if tool.strict:
                spec["strict"] = True
            tools.append(spec)
        kwargs["tools"] = tools
    if settings.tool_choice is not None:
        kwargs["tool_choice"] = _tool_choice(settings.tool_choice)
    if request.output_schema is not None:
        schema = dict(request.output_schema.schema)
        kwargs["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    if settings.stop:
        kwargs["stop_sequences"] = list(settings.stop)
    extra: dict[str, object] = {}
    if settings.temperature is not None:
        extra["temperature"] = settings.temperature
    if settings.extra_body:
        extra.update(settings.extra_body)
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def decode_usage(usage: Any) -> Usage:
    """Normalize an Anthropic usage object (input there excludes cache reads and writes)."""
    read = usage.cache_read_input_tokens or 0
    write = usage.cache_creation_input_tokens or 0
    creation = getattr(usage, "cache_creation", None)
    write_1h = (creation.ephemeral_1h_input_tokens or 0) if creation is not None else 0
    details = getattr(usage, "output_tokens_details", None)
    return Usage(
        input_tokens=(usage.input_tokens or 0) + read + write,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write_1h,
        reasoning_tokens=details.thinking_tokens if details is not None else 0,
    )


def decode_message(message: Any) -> Response:
    """Convert an SDK ``Message`` to a :class:`Response` (cost unset)."""
    parts: list[AssistantPart] = []
    for block in message.content:
        kind = block.type
        if kind == "text":
            parts.append(TextPart(block.text))
        elif kind == "thinking":
            parts.append(ThinkingPart(block.thinking, Origin(PROVIDER, signature=block.signature)))
        elif kind == "redacted_thinking":
            parts.append(ThinkingPart("", Origin(PROVIDER, signature=block.data), redacted=True))
        elif kind == "tool_use":
            parts.append(ToolCall(block.id, block.name, dict(block.input or {})))
    stop = message.stop_reason
    return Response(
        message=AssistantMessage(parts),
        finish_reason=_FINISH.get(stop or "", "stop"),
        usage=decode_usage(message.usage),
        model=message.model,
        id=message.id,
        raw_finish_reason=stop,
    )


@final
class AnthropicModel(VendorModel["AsyncAnthropic"]):
    """A Claude model through the Anthropic Messages API.

    Args:
        name: The model id, e.g. ``"claude-sonnet-4-5"``.
        api_key: Defaults to ``$ANTHROPIC_API_KEY``; a missing key raises
            :class:`~sunroom.errors.AuthenticationError` here, not at the first call.
        base_url: Another endpoint speaking the Messages API (a proxy, llama.cpp's server).
        **options: See :class:`~sunroom.providers.ModelOptions`.

    ``Settings.max_output_tokens`` defaults to 8192 (the API requires a value). Close the
    model with :meth:`aclose`.
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
            sdk="anthropic",
            family="anthropic",
            provider=PROVIDER,
            api_key=api_key,
            env=("ANTHROPIC_API_KEY",),
        )
        if not key:
            raise missing_key("ANTHROPIC_API_KEY", provider=PROVIDER)
        super().__init__(
            name, api_key=key, base_url=base_url, price_family=PROVIDER, options=options
        )

    def _make_client(self) -> AsyncAnthropic:
        from anthropic import AsyncAnthropic

        return AsyncAnthropic(
            api_key=self.config.api_key,
            base_url=self.config.base_url,
            default_headers=dict(self.config.headers) or None,
            timeout=self.config.timeout,
            max_retries=0,
        )

    async def _close_client(self, client: AsyncAnthropic) -> None:
        await client.close()

    async def _complete_once(
        self, client: AsyncAnthropic, request: Request, settings: Settings, limit: float | None
    ) -> Response:
        kwargs = encode_request(self.name, request, settings)
        message = await client.messages.create(**kwargs, timeout=limit)
        return decode_message(message)

    async def _open_stream(
        self, client: AsyncAnthropic, request: Request, settings: Settings, limit: float | None
    ) -> object:
        kwargs = encode_request(self.name, request, settings)
        return await client.messages.create(**kwargs, stream=True, timeout=limit)

    async def _close_stream(self, opened: Any) -> None:
        await opened.close()

    async def _read_stream(
        self, opened: Any, builder: ResponseBuilder
    ) -> AsyncIterator[StreamEvent]:
        model, msg_id, stop = "", None, None
        usage: object = None
        out: StreamEvent | None
        async for event in opened:
            kind = event.type
            if kind == "content_block_delta":
                out = _on_delta(event, builder)
                if out is not None:
                    yield out
            elif kind == "content_block_start":
                out = _on_block_start(event, builder)
                if out is not None:
                    yield out
            elif kind == "content_block_stop":
                done = builder.tool_end(event.index)
                if done is not None:
                    yield done
            elif kind == "message_start":
                message = event.message
                model, msg_id, usage = message.model, message.id, message.usage
                builder.usage = decode_usage(usage)
                yield UsageUpdate(builder.usage)
            elif kind == "message_delta":
                stop = event.delta.stop_reason or stop
                usage = _merge_usage(usage, event.usage)
                builder.usage = decode_usage(usage)
                yield UsageUpdate(builder.usage)
            elif kind == "message_stop":
                for key in builder.open_tools():
                    closed = builder.tool_end(key)
                    if closed is not None:
                        yield closed
                finish = _FINISH.get(stop or "", "stop")
                yield Done(builder.build(finish, model=model, id=msg_id, raw_finish_reason=stop))
                return

    async def count_tokens(self, request: Request) -> int:
        """Ask the vendor's ``/v1/messages/count_tokens`` endpoint; retried like a call."""
        kwargs = encode_request(self.name, request, self.settings.merged(request.settings))
        for key in ("max_tokens", "stop_sequences", "extra_body"):
            kwargs.pop(key, None)

        async def count(client: AsyncAnthropic, limit: float | None) -> int:
            result = await client.messages.count_tokens(**kwargs, timeout=limit)
            return int(result.input_tokens)

        return await self._count_with_retry(count)

    def _translate(self, exc: BaseException) -> ProviderError | None:
        import anthropic

        if isinstance(exc, anthropic.APIStatusError):
            body = exc.body
            return _errors.from_status(
                PROVIDER,
                exc.status_code,
                str(_errors.nested(body, "error", "message") or exc.message),
                body=body,
                kind=_errors.nested(body, "error", "type"),
                retry_after=_errors.retry_after_seconds(exc.response.headers),
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return _errors.timeout(PROVIDER)
        if isinstance(exc, anthropic.APIConnectionError):
            return _errors.connection(PROVIDER, str(exc))
        transport = _errors.from_transport(PROVIDER, exc)
        if transport is not None:
            return transport
        if isinstance(exc, anthropic.AnthropicError):
            return ProviderError(f"{PROVIDER}: {exc}", provider=PROVIDER)
        return None


def _merge_usage(start: Any, delta: Any) -> Any:
    """Overlay a ``message_delta`` usage (cumulative counts) on the ``message_start`` one."""
    if start is None:
        return delta
    merged = start.model_copy()
    for field in (
        "output_tokens",
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens_details",
    ):
        value = getattr(delta, field, None)
        if value is not None:
            setattr(merged, field, value)
    return merged


def _on_delta(event: RawContentBlockDeltaEvent, builder: ResponseBuilder) -> StreamEvent | None:
    """A part of a content block: text, tool arguments, thinking, or thinking's signature."""
    delta = event.delta
    if delta.type == "text_delta":
        return builder.text(event.index, delta.text)
    if delta.type == "input_json_delta":
        return builder.tool_args(event.index, delta.partial_json)
    if delta.type == "thinking_delta":
        return builder.thinking(event.index, delta.thinking)
    if delta.type == "signature_delta":
        builder.set_origin(event.index, Origin(PROVIDER, signature=delta.signature))
    return None


def _on_block_start(
    event: RawContentBlockStartEvent, builder: ResponseBuilder
) -> StreamEvent | None:
    """The start of a content block: text, thinking (maybe redacted) or a tool call."""
    block = event.content_block
    if block.type == "text":
        return builder.text(event.index, block.text)
    if block.type == "thinking":
        origin = Origin(PROVIDER, signature=block.signature or None)
        return builder.thinking(event.index, block.thinking, origin)
    if block.type == "redacted_thinking":
        origin = Origin(PROVIDER, signature=block.data)
        return builder.thinking(event.index, "", origin, redacted=True)
    if block.type == "tool_use":
        return builder.tool_start(event.index, block.id, block.name)
    return None
