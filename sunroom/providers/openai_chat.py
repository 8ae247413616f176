"""OpenAI Chat Completions adapter (``openai-compatible:`` models), on the official SDK.

For local and hosted servers that speak Chat Completions: vLLM, llama.cpp's
``llama-server``, Ollama (``/v1``), LM Studio, OpenRouter ... Point ``base_url`` at the
server's ``/v1``. Tool calls work when the server supports them. Reasoning that such servers
return as ``reasoning_content`` (DeepSeek-style) becomes a
:class:`~sunroom.providers.ThinkingPart`; it is not sent back.

Without ``base_url`` this talks to OpenAI itself and is priced from the ``openai`` table;
with one, prices come only from what you configure (``price=`` or a custom table under
``"openai-compatible:<model>"``), otherwise cost is ``None``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Unpack, final

from sunroom.errors import ProviderError

from ._base import VendorModel
from .assembly import ResponseBuilder, parse_arguments
from .config import ModelOptions, sdk_and_key
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
from .openai_responses import image_url, make_openai_client, translate_openai
from .response import FinishReason, Response, Usage
from .settings import Request, Settings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OpenAIChatModel"]

PROVIDER = "openai-compatible"

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
    "content_filter": "content_filter",
}


def _user_content(message: UserMessage) -> str | list[dict[str, object]]:
    if len(message.content) == 1 and isinstance(message.content[0], TextPart):
        return message.content[0].text
    return [
        {"type": "text", "text": p.text}
        if isinstance(p, TextPart)
        else {"type": "image_url", "image_url": {"url": image_url(p)}}
        for p in message.content
    ]


def encode_messages(request: Request) -> list[dict[str, object]]:
    """Return the Chat Completions ``messages`` list."""
    out: list[dict[str, object]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.text})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message)})
        elif isinstance(message, AssistantMessage):
            entry: dict[str, object] = {"role": "assistant", "content": message.text or None}
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": c.raw_arguments or json.dumps(dict(c.arguments)),
                    },
                }
                for c in message.tool_calls
            ]
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
        elif isinstance(message, ToolResultMessage):
            content = f"Error: {message.content}" if message.is_error else message.content
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": content})
    return out


def encode_request(
    name: str, request: Request, settings: Settings, *, official: bool, stream: bool
) -> dict[str, object]:
    """Return the keyword arguments for ``client.chat.completions.create``.

    ``official`` (no ``base_url``) uses ``max_completion_tokens``; other servers get the
    more widely supported ``max_tokens``.
    """
    kwargs: dict[str, object] = {"model": name, "messages": encode_messages(request)}
    if request.tools:
        tools = []
        for t in request.tools:
            function: dict[str, object] = {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            }
            if t.strict:
                function["strict"] = True
            tools.append({"type": "function", "function": function})
        kwargs["tools"] = tools
    choice = settings.tool_choice
    if choice is not None:
        known = choice in ("auto", "required", "none")
        kwargs["tool_choice"] = (
            choice if known else {"type": "function", "function": {"name": choice}}
        )
    if request.output_schema is not None:
        out = request.output_schema
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": out.name, "schema": dict(out.schema), "strict": out.strict},
        }
    if settings.max_output_tokens is not None:
        key = "max_completion_tokens" if official else "max_tokens"
        kwargs[key] = settings.max_output_tokens
    if settings.temperature is not None:
        kwargs["temperature"] = settings.temperature
    if settings.stop:
        kwargs["stop"] = list(settings.stop)
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    if settings.extra_body:
        kwargs["extra_body"] = dict(settings.extra_body)
    return kwargs


def decode_usage(usage: Any) -> Usage:
    """Normalize Chat Completions usage (prompt includes cached; completion includes reasoning)."""
    if usage is None:
        return Usage()
    cached = getattr(usage.prompt_tokens_details, "cached_tokens", 0) or 0
    reasoning = getattr(usage.completion_tokens_details, "reasoning_tokens", 0) or 0
    return Usage(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )


def _reasoning(obj: object) -> str | None:
    extra = getattr(obj, "model_extra", None) or {}
    value = extra.get("reasoning_content") or extra.get("reasoning")
    return value if isinstance(value, str) else None


def decode_completion(completion: Any) -> Response:
    """Convert an SDK ``ChatCompletion`` to a :class:`Response` (cost unset)."""
    if not completion.choices:
        raise ProviderError(f"{PROVIDER}: the reply has no choices", provider=PROVIDER)
    choice = completion.choices[0]
    message = choice.message
    parts: list[AssistantPart] = []
    if reasoning := _reasoning(message):
        parts.append(ThinkingPart(reasoning, Origin(PROVIDER)))
    if message.content:
        parts.append(TextPart(message.content))
    elif message.refusal:
        parts.append(TextPart(message.refusal))
    for i, call in enumerate(message.tool_calls or ()):
        arguments, raw = parse_arguments(call.function.arguments)
        parts.append(ToolCall(call.id or f"call_{i}", call.function.name, arguments, raw))
    raw_reason = choice.finish_reason
    finish = _FINISH.get(raw_reason or "", "stop")
    if message.refusal and not message.content:
        finish = "content_filter"
    return Response(
        message=AssistantMessage(parts),
        finish_reason=finish,
        usage=decode_usage(completion.usage),
        model=completion.model or "",
        id=completion.id,
        raw_finish_reason=raw_reason,
    )


@final
class OpenAIChatModel(VendorModel["AsyncOpenAI"]):
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    Args:
        name: The model name the server knows (``"llama3.2:3b"``, ``"Qwen/Qwen3-8B"``).
        api_key: Defaults to ``$OPENAI_API_KEY``; local servers usually need none, so a
            placeholder is sent when neither is set.
        base_url: The server's OpenAI base, e.g. ``http://127.0.0.1:8000/v1`` (vLLM),
            ``http://127.0.0.1:8080/v1`` (llama.cpp), ``http://127.0.0.1:11434/v1``
            (Ollama). ``None`` means OpenAI itself.
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
        found = sdk_and_key(
            sdk="openai",
            family="openai-compatible",
            provider=PROVIDER,
            api_key=api_key,
            env=("OPENAI_API_KEY",),
        )
        key = found or "no-key"  # local servers (llama.cpp, Ollama, vLLM) need none
        family = "openai" if base_url is None else "openai-compatible"
        super().__init__(name, api_key=key, base_url=base_url, price_family=family, options=options)

    def _make_client(self) -> AsyncOpenAI:
        return make_openai_client(self)

    async def _close_client(self, client: AsyncOpenAI) -> None:
        await client.close()

    def _kwargs(self, request: Request, settings: Settings, *, stream: bool) -> dict[str, Any]:
        official = self.config.base_url is None
        return encode_request(self.name, request, settings, official=official, stream=stream)

    async def _complete_once(
        self, client: AsyncOpenAI, request: Request, settings: Settings, limit: float | None
    ) -> Response:
        kwargs = self._kwargs(request, settings, stream=False)
        return decode_completion(await client.chat.completions.create(**kwargs, timeout=limit))

    async def _open_stream(
        self, client: AsyncOpenAI, request: Request, settings: Settings, limit: float | None
    ) -> object:
        kwargs = self._kwargs(request, settings, stream=True)
        return await client.chat.completions.create(**kwargs, stream=True, timeout=limit)

    async def _close_stream(self, opened: Any) -> None:
        await opened.close()

    async def _read_stream(
        self, opened: Any, builder: ResponseBuilder
    ) -> AsyncIterator[StreamEvent]:
        finish: str | None = None
        model, chunk_id = "", None
        out: StreamEvent | None
        async for chunk in opened:
            model, chunk_id = chunk.model or model, chunk.id or chunk_id
            if chunk.usage is not None:
                builder.usage = decode_usage(chunk.usage)
                yield UsageUpdate(builder.usage)
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                delta = choice.delta
                reasoning = _reasoning(delta)
                origin = Origin(PROVIDER)
                if reasoning and (out := builder.thinking("thinking", reasoning, origin)):
                    yield out
                if delta.content and (out := builder.text("text", delta.content)) is not None:
                    yield out
                for call in delta.tool_calls or ():
                    key = ("tool", call.index)
                    function = call.function
                    if not builder.has_tool(key):
                        name = (function.name if function else None) or ""
                        yield builder.tool_start(key, call.id or f"call_{call.index}", name)
                    arguments = function.arguments if function else None
                    if arguments and (out := builder.tool_args(key, arguments)) is not None:
                        yield out
                if choice.finish_reason:
                    finish = choice.finish_reason
                    for open_key in builder.open_tools():
                        if (out := builder.tool_end(open_key)) is not None:
                            yield out
        if finish is None:
            return  # no finish reason: the stream was cut (the caller raises)
        reason = _FINISH.get(finish, "stop")
        yield Done(builder.build(reason, model=model, id=chunk_id, raw_finish_reason=finish))

    def _translate(self, exc: BaseException) -> ProviderError | None:
        return translate_openai(PROVIDER, exc)
