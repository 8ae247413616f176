"""The one seam between sunroom and a language model: :class:`Model`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from types import TracebackType

from .assembly import events_from_response
from .events import StreamEvent
from .response import Response
from .settings import Request
from .tokens import estimate_tokens

__all__ = ["Model"]


class Model(ABC):
    """A language model: one required async method, :meth:`complete`.

    Build a model once and share it between sessions and tasks of one event loop; it is safe
    to call concurrently. Vendor adapters bind to the event loop of their first call (their
    pooled connections belong to it); using them from another loop raises
    :class:`~sunroom.errors.UsageError`. Close it with :meth:`aclose` (or ``async with``) to
    release its HTTP connection pool; calls after closing raise
    :class:`~sunroom.errors.ClosedError`.

    Subclass it to plug in any model: implement :meth:`complete`, and optionally
    :meth:`stream` (the default replays :meth:`complete` as events), :meth:`count_tokens`
    and :meth:`aclose`.
    """

    #: The model's name, as configured (``"claude-sonnet-4-5"``).
    name: str = ""

    #: Whether the model takes images in user messages; the agent sends a placeholder line
    #: for each displayed image instead when False.
    accepts_images: bool = True

    @abstractmethod
    async def complete(self, request: Request) -> Response:
        """Send ``request`` and return the whole reply.

        Raises:
            ProviderError: a subclass saying who must act (see :mod:`sunroom.errors`);
                retryable errors have already been retried per the model's policy.
            ClosedError: the model was closed.
        """

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Send ``request`` and yield the reply as typed events, ending with ``Done``.

        Iterate to the end, or close the iterator (``contextlib.aclosing``) when stopping
        early so the connection is released at once. Errors while the stream is being opened
        are retried like :meth:`complete`; an error after it has begun raises (a cut-off
        stream raises :class:`~sunroom.errors.ProviderConnectionError`).

        This default calls :meth:`complete` and replays the response as events.
        """
        response = await self.complete(request)
        for event in events_from_response(response):
            yield event

    async def count_tokens(self, request: Request) -> int:
        """Return the prompt tokens of ``request``.

        The default is the local :func:`~sunroom.providers.estimate_tokens`; vendor
        adapters ask the vendor's counting endpoint where it has one.
        """
        return estimate_tokens(request)

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release resources (the HTTP pool); idempotent."""

    async def __aenter__(self) -> Model:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
