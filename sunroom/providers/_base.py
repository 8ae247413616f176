"""The shared machinery of the vendor adapters: retries, breaker, timeouts, cost, closing.

A vendor adapter subclasses :class:`VendorModel` and supplies the vendor-specific parts:
building the SDK client, one attempt of a call, opening and reading a stream, and
``_translate``, the one place where that vendor's exceptions become sunroom errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Generic, TypeVar

from sunroom.errors import (
    ClosedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    UsageError,
)

from .assembly import ResponseBuilder, with_cost
from .config import ClientConfig, ModelOptions
from .events import Done, StreamEvent
from .pricing import DEFAULT_PRICES
from .response import Response
from .retry import CircuitBreaker, Clock, RetryPolicy, call_with_retry
from .seam import Model
from .settings import Request, Settings

ClientT = TypeVar("ClientT")
T = TypeVar("T")


class VendorModel(Model, Generic[ClientT]):
    """Base of the SDK-backed adapters. Not for direct use."""

    #: Adapter family, used in errors and origins ("anthropic", "openai", ...).
    provider: str = ""

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None,
        base_url: str | None,
        price_family: str,
        options: ModelOptions,
    ) -> None:
        self.name = name
        self.config = ClientConfig(
            api_key=api_key,
            base_url=base_url,
            headers=dict(options.get("headers", {})),
            timeout=options.get("timeout", 600.0),
        )
        self.settings = options.get("settings", Settings())
        self.retry = options.get("retry", RetryPolicy())
        self.clock = options.get("clock", Clock())
        self.breaker = options.get("breaker") or CircuitBreaker(clock=self.clock)
        self._price = options.get("price")
        self._prices = options.get("prices", DEFAULT_PRICES)
        self._price_family = price_family
        self._client: ClientT | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, config={self.config!r})"

    # --- vendor hooks --------------------------------------------------------------------

    @abstractmethod
    def _make_client(self) -> ClientT:
        """Build the SDK client (with the SDK's own retries off)."""

    @abstractmethod
    async def _close_client(self, client: ClientT) -> None:
        """Close the SDK client and its pool."""

    @abstractmethod
    async def _complete_once(
        self, client: ClientT, request: Request, settings: Settings, limit: float | None
    ) -> Response:
        """One attempt of a whole-reply call (cost not yet set)."""

    @abstractmethod
    async def _open_stream(
        self, client: ClientT, request: Request, settings: Settings, limit: float | None
    ) -> object:
        """Start a streamed call; return once the reply's headers arrived."""

    @abstractmethod
    def _read_stream(self, opened: object, builder: ResponseBuilder) -> AsyncIterator[StreamEvent]:
        """Yield events from an opened stream, ending with ``Done`` (cost not yet set)."""

    @abstractmethod
    async def _close_stream(self, opened: object) -> None:
        """Release an opened stream's connection."""

    @abstractmethod
    def _translate(self, exc: BaseException) -> ProviderError | None:
        """Map a vendor or transport exception to a sunroom error (``None``: not ours)."""

    # --- shared machinery ----------------------------------------------------------------

    def _client_for_call(self) -> ClientT:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            # Pooled connections belong to the loop that opened them.
            raise UsageError(
                f"{self!r} was first used on another event loop; build one model per event "
                "loop (and close it there)"
            )
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, ProviderError):
            return exc
        if isinstance(exc, TimeoutError):
            return ProviderTimeoutError(
                "no reply within the timeout", provider=self.provider, body=None
            )
        translated = self._translate(exc)
        return exc if translated is None else translated

    async def _guard(self, make: Callable[[], Awaitable[T]], limit: float | None) -> T:
        """Run one attempt within ``limit`` seconds; translate what it raises (the boundary)."""
        try:
            async with asyncio.timeout(limit):
                return await make()
        except Exception as exc:
            error = self._error(exc)
            if error is exc:
                raise
            raise error from exc

    def _with_cost(self, response: Response) -> Response:
        price = self._price
        if price is None:
            for name in (response.model, self.name):
                if name and (price := self._prices.lookup(self._price_family, name)):
                    break
        return with_cost(response, None if price is None else price.cost_micro_usd(response.usage))

    def _effective(self, request: Request) -> tuple[Settings, float]:
        settings = self.settings.merged(request.settings)
        return settings, settings.timeout or self.config.timeout

    async def _retrying(
        self,
        attempt: Callable[[float | None], Awaitable[T]],
        limit: float,
        *,
        record_success: bool = True,
    ) -> T:
        return await call_with_retry(
            attempt,
            policy=self.retry,
            breaker=self.breaker,
            clock=self.clock,
            limit=limit,
            provider=self.provider,
            record_success=record_success,
        )

    async def complete(self, request: Request) -> Response:
        """Send ``request`` and return the reply, retrying per the policy.

        Raises:
            ProviderError: the translated vendor error after retries (see sunroom.errors).
            ClosedError: the model was closed.
        """
        client = self._client_for_call()
        settings, timeout = self._effective(request)

        async def attempt(t: float | None) -> Response:
            return await self._guard(lambda: self._complete_once(client, request, settings, t), t)

        return self._with_cost(await self._retrying(attempt, timeout))

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """Stream the reply as events ending with ``Done``; see :meth:`Model.stream`."""
        client = self._client_for_call()
        settings, timeout = self._effective(request)

        async def attempt(t: float | None) -> object:
            return await self._guard(lambda: self._open_stream(client, request, settings, t), t)

        opened = await self._retrying(attempt, timeout, record_success=False)
        done = False
        try:
            async for event in self._read_stream(opened, ResponseBuilder()):
                if type(event) is Done:
                    done = True
                    self.breaker.record(None, probe=False)
                    yield Done(self._with_cost(event.response))
                    return
                yield event
        except Exception as exc:
            error = self._error(exc)
            self.breaker.record(error, probe=False)
            if error is exc:
                raise
            raise error from exc
        finally:
            with contextlib.suppress(Exception):  # the stream's outcome is already decided
                await self._close_stream(opened)
        if not done:
            error = ProviderConnectionError(
                "the stream ended before the reply was complete", provider=self.provider
            )
            self.breaker.record(error, probe=False)
            raise error

    async def _count_with_retry(
        self, count: Callable[[ClientT, float | None], Awaitable[int]]
    ) -> int:
        client = self._client_for_call()

        async def attempt(t: float | None) -> int:
            return await self._guard(lambda: count(client, t), t)

        return await self._retrying(attempt, self.config.timeout)

    async def aclose(self) -> None:
        """Close the HTTP pool; idempotent. Later calls raise ClosedError.

        Call it on the event loop the model was used on.
        """
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await self._close_client(client)


def drop_none(mapping: Mapping[str, object]) -> dict[str, object]:
    """Return ``mapping`` without its ``None`` values."""
    return {k: v for k, v in mapping.items() if v is not None}
