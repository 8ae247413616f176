"""Fake models for tests and demos: scripted, computed, or read from a JSON file.

:class:`ScriptedModel`, :class:`FunctionModel` and :class:`ScriptFileModel` (the
``scripted:PATH`` provider spec) are real :class:`~sunroom.providers.Model` implementations
(no network, no key), record every request they get in ``requests``, and stream by replaying
their replies as events. A reply of the first two can be given as:

* a ``str``: a text reply (finish reason ``stop``);
* an :class:`~sunroom.providers.AssistantMessage`: finish reason ``tool_use`` when it has
  tool calls, else ``stop``;
* a :class:`~sunroom.providers.Response`: returned as is;
* an exception instance: raised by that call (for example a ``RateLimitedError``);
* a list of stream events ending with :class:`~sunroom.providers.Done`: streamed exactly as
  given (``complete`` returns the ``Done`` response).

Usage of str/message replies is the local estimate (prompt from the request, output from the
reply), so budgets see non-zero counts; cost is computed when a ``price`` is given.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeAlias, Unpack, final

from sunroom.errors import ClosedError, UsageError

from .assembly import events_from_response, with_cost
from .config import ModelOptions
from .events import Done, StreamEvent
from .messages import AssistantMessage, SystemMessage, TextPart, ThinkingPart, ToolCall
from .pricing import Price
from .response import Response, Usage
from .seam import Model
from .settings import Request
from .tokens import estimate_text_tokens, estimate_tokens

__all__ = [
    "EXECUTE_CODE",
    "FunctionModel",
    "Reply",
    "ScriptExhaustedError",
    "ScriptFileModel",
    "ScriptedModel",
]

EXECUTE_CODE = "execute_code"
"""The agent's code tool; a script's ``{"code": ...}`` reply calls it when it is offered."""

Reply: TypeAlias = str | AssistantMessage | Response | BaseException | Sequence[StreamEvent]
"""One scripted reply (see the module docstring)."""


class ScriptExhaustedError(UsageError):
    """A :class:`ScriptedModel` was called more times than it has replies."""


class _FakeBase(Model):
    def __init__(self, *, name: str, price: Price | None, chunk_size: int | None) -> None:
        self.name = name
        self.price = price
        self.chunk_size = chunk_size
        self.requests: list[Request] = []
        self.closed = False

    def _record(self, request: Request) -> None:
        if self.closed:
            raise ClosedError(f"{type(self).__name__} {self.name!r} is closed")
        self.requests.append(request)

    def _response(self, request: Request, reply: Reply) -> Response | Sequence[StreamEvent]:
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Response):
            return reply
        if isinstance(reply, str):
            reply = AssistantMessage(reply)
        if not isinstance(reply, AssistantMessage):
            if not reply or not isinstance(reply[-1], Done):
                raise UsageError("a scripted stream must end with a Done event")
            return reply
        output = 0
        for part in reply.content:
            if isinstance(part, TextPart | ThinkingPart):
                output += estimate_text_tokens(part.text)
            else:
                output += estimate_text_tokens(part.name + json.dumps(dict(part.arguments)))
        usage = Usage(input_tokens=estimate_tokens(request), output_tokens=output)
        response = Response(
            message=reply,
            finish_reason="tool_use" if reply.tool_calls else "stop",
            usage=usage,
            model=self.name,
        )
        cost = self.price.cost_micro_usd(usage) if self.price is not None else None
        return with_cost(response, cost)

    async def _reply(self, request: Request) -> Response | Sequence[StreamEvent]:
        raise NotImplementedError

    async def complete(self, request: Request) -> Response:
        """Return the next reply (see the module docstring); raise it if it is an error."""
        result = await self._reply(request)
        if isinstance(result, Response):
            return result
        done = result[-1]
        assert isinstance(done, Done)
        return done.response

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Yield the next reply as events (``chunk_size`` characters per delta)."""
        result = await self._reply(request)
        if isinstance(result, Response):
            for event in events_from_response(result, chunk_size=self.chunk_size):
                yield event
        else:
            for event in result:
                yield event

    async def aclose(self) -> None:
        """Mark the model closed; later calls raise ClosedError."""
        self.closed = True


@final
class ScriptedModel(_FakeBase):
    """A model that answers with a fixed list of replies, one per call, in order.

    Args:
        replies: The script (see the module docstring for the accepted forms).
        name: The model name reported in responses.
        price: When given, responses carry a cost computed from their usage.
        chunk_size: Characters per delta when streaming a non-event reply.

    Raises ScriptExhaustedError (a UsageError) when called after the last reply.
    """

    def __init__(
        self,
        replies: Iterable[Reply],
        *,
        name: str = "scripted",
        price: Price | None = None,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(name=name, price=price, chunk_size=chunk_size)
        self.replies: list[Reply] = list(replies)
        self._next = 0

    @property
    def remaining(self) -> int:
        """Replies not yet used."""
        return len(self.replies) - self._next

    async def _reply(self, request: Request) -> Response | Sequence[StreamEvent]:
        self._record(request)
        if self._next >= len(self.replies):
            raise ScriptExhaustedError(
                f"ScriptedModel {self.name!r} has no reply left for call "
                f"{len(self.requests)} (it had {len(self.replies)}); add replies to its script"
            )
        reply = self.replies[self._next]
        self._next += 1
        return self._response(request, reply)


ReplyFunction: TypeAlias = Callable[[Request], Reply | Awaitable[Reply]]


@final
class FunctionModel(_FakeBase):
    """A model whose reply is computed by ``function(request)``, sync or async.

    The function returns any reply form of the module docstring (raising works too), e.g.
    ``FunctionModel(lambda req: req.messages[-1].text.upper())``.
    """

    def __init__(
        self,
        function: ReplyFunction,
        *,
        name: str = "function",
        price: Price | None = None,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(name=name, price=price, chunk_size=chunk_size)
        self.function = function

    async def _reply(self, request: Request) -> Response | Sequence[StreamEvent]:
        self._record(request)
        reply = self.function(request)
        if inspect.isawaitable(reply):
            reply = await reply
        return self._response(request, reply)


@final
class ScriptFileModel(_FakeBase):
    """A scripted model read from a JSON file: the ``scripted:PATH`` provider spec.

    For demos and tests that need no key and no network, e.g. ``sunroom run --model
    scripted:replies.json`` or ``{"model": "scripted:/srv/replies.json"}``. The file is a list
    of replies, or ``{"replies": [...], "sub_reply": "ok", "delay_s": 0}``. A reply is a
    string (a text answer) or ``{"code": "...", "text": "..."}``: a call of the
    ``execute_code`` tool when the request offers it, else the text followed by a fenced
    ```` ```python ```` block (``code_mode`` fenced).

    The agent's turn *n* (the number of assistant messages already in its request) gets reply
    *n*; past the end the last reply repeats, and a resumed session continues where its
    transcript left off. The agent is whoever sent the first request: any request with another
    system message (``predict``, ``predict_many``, a context summary) gets ``sub_reply``.
    ``delay_s`` makes every call take that long (a model's latency).

    *api_key* and *base_url* are accepted, as for every provider, and ignored; of the
    :class:`~sunroom.providers.ModelOptions` only ``price`` is used.

    Raises UsageError (one line) when the file cannot be read or is not a script.
    """

    def __init__(
        self,
        path: str | Path,
        /,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        **options: Unpack[ModelOptions],
    ) -> None:
        super().__init__(name="scripted", price=options.get("price"), chunk_size=None)
        self.path = Path(path)
        data = _load_script(self.path)
        items = data.get("replies") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            raise UsageError(f"the script {str(path)!r} needs a non-empty list of replies")
        self.replies: list[str | tuple[str, str]] = [
            _script_reply(item, i, path) for i, item in enumerate(items)
        ]
        extra: dict[str, object] = data if isinstance(data, dict) else {}
        self.sub_reply = str(extra.get("sub_reply", "ok"))
        delay = extra.get("delay_s", 0)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise UsageError(f"the script {str(path)!r}: delay_s must be a number of seconds")
        self.delay_s = float(delay)
        self._agent_system: str | None = None

    def _is_agent(self, request: Request) -> bool:
        system = next((m.text for m in request.messages if isinstance(m, SystemMessage)), "")
        if self._agent_system is None:
            self._agent_system = system
        return any(t.name == EXECUTE_CODE for t in request.tools) or system == self._agent_system

    async def _reply(self, request: Request) -> Response | Sequence[StreamEvent]:
        self._record(request)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        if not self._is_agent(request):
            return self._response(request, self.sub_reply)
        turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
        reply = self.replies[min(turn, len(self.replies) - 1)]
        if isinstance(reply, str):
            return self._response(request, reply)
        text, code = reply
        if any(t.name == EXECUTE_CODE for t in request.tools):
            parts: list[str | ToolCall] = [text] if text else []
            parts.append(ToolCall(f"call_{turn}", EXECUTE_CODE, {"code": code}))
            return self._response(request, AssistantMessage(parts))
        fenced = f"```python\n{code}\n```"
        return self._response(request, f"{text}\n\n{fenced}" if text else fenced)


def _load_script(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"cannot read the script {str(path)!r}: {reason}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"the script {str(path)!r} is not JSON: {exc}") from None


def _script_reply(item: object, index: int, path: str | Path) -> str | tuple[str, str]:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("code"), str):
        return str(item.get("text") or ""), item["code"]
    raise UsageError(
        f'the script {str(path)!r}: reply {index} must be a string or {{"code": ..., "text": ...}}'
    )
