"""Fake models for tests: :class:`ScriptedModel` and :class:`FunctionModel`.

Both are real :class:`~sunroom.providers.Model` implementations (no network), record every
request they get in ``requests``, and stream by replaying their replies as events. A reply
can be given as:

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

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias, final

from sunroom.errors import ClosedError, UsageError

from .assembly import events_from_response, with_cost
from .events import Done, StreamEvent
from .messages import AssistantMessage, TextPart, ThinkingPart
from .pricing import Price
from .response import Response, Usage
from .seam import Model
from .settings import Request
from .tokens import estimate_text_tokens, estimate_tokens

__all__ = ["FunctionModel", "Reply", "ScriptExhaustedError", "ScriptedModel"]

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
