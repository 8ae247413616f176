"""Connection configuration for vendor adapters; its repr never shows secrets."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict, final

from sunroom.errors import AuthenticationError, UsageError

from .pricing import Price, PriceTable
from .retry import CircuitBreaker, Clock, RetryPolicy
from .settings import Settings

__all__ = ["ClientConfig", "ModelOptions", "api_key_from_env", "missing_key", "sdk_and_key"]

_HIDDEN = "<hidden>"


@final
@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where and how an adapter connects.

    Attributes:
        api_key: The key sent to the vendor; never shown by ``repr``.
        base_url: The endpoint; ``None`` for the vendor's own.
        headers: Extra HTTP headers (values never shown by ``repr``).
        timeout: Default seconds per attempt when ``Settings.timeout`` is unset.
    """

    api_key: str | None = None
    base_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0

    def __repr__(self) -> str:
        key = None if self.api_key is None else _HIDDEN
        headers = {name: _HIDDEN for name in self.headers}
        return (
            f"ClientConfig(api_key={key!r}, base_url={self.base_url!r}, "
            f"headers={headers!r}, timeout={self.timeout!r})"
        )

    __str__ = __repr__


def api_key_from_env(*names: str) -> str | None:
    """Return the first non-empty environment variable among ``names``, or ``None``."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def sdk_and_key(
    *, sdk: str, family: str, provider: str, api_key: str | None, env: tuple[str, ...]
) -> str | None:
    """Check the vendor SDK *sdk* is installed and find the API key (argument, then *env*).

    Raises UsageError naming the install command when the SDK is missing. Returns None when no
    key was found; adapters that need one raise :func:`missing_key`.
    """
    try:
        importlib.import_module(sdk)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UsageError(f"{family} models need: pip install 'sunroom[providers]'") from exc
    return api_key or api_key_from_env(*env)


def missing_key(env: str, *, provider: str) -> AuthenticationError:
    """The error for an adapter built without a key: raised at build time, not first call."""
    return AuthenticationError(
        f"no API key for {provider}: set {env} (or pass api_key=)", provider=provider, key_env=env
    )


class ModelOptions(TypedDict, total=False):
    """Options every vendor adapter accepts (all keyword-only, all optional).

    Keys:
        headers: Extra HTTP headers for every request.
        settings: Default :class:`Settings`; a request's own settings override them.
        retry: The :class:`RetryPolicy` (default: 4 attempts, 300 s deadline).
        breaker: The :class:`CircuitBreaker` (default: a fresh one per model).
        clock: The :class:`Clock` for retries and the breaker (tests pass a fake).
        price: This model's :class:`Price`, overriding the table.
        prices: The :class:`PriceTable` to look the model up in (default the built-in one).
        timeout: Default seconds per attempt (600).
    """

    headers: Mapping[str, str]
    settings: Settings
    retry: RetryPolicy
    breaker: CircuitBreaker
    clock: Clock
    price: Price
    prices: PriceTable
    timeout: float
