"""Observe or veto what a session is about to do: :class:`Hooks` and :class:`Veto`.

A hook is an async callable run on the session's event loop *before* the action; it may take
as long as it needs (ask a human), and returns None to let the action run or a :class:`Veto`
to stop it. A vetoed cell is not run: the model is told ``vetoed: <reason>`` as the cell's
error. A vetoed host call raises ``PermissionError("<name>() was vetoed: <reason>")`` inside
the kernel. Both publish a :class:`~sunroom.agent.events.Vetoed` event. An exception raised by
a hook vetoes the action too, with the exception as the reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import ParamSpec, TypeAlias, final

__all__ = ["BeforeExecute", "BeforeHostCall", "Hooks", "Veto"]

P = ParamSpec("P")


@final
@dataclass(frozen=True, slots=True)
class Veto:
    """Refuse the action; ``reason`` is shown to the model and in the event."""

    reason: str = "refused by a hook"


BeforeExecute: TypeAlias = Callable[[str], Awaitable[Veto | None]]
"""``async def before_execute(code) -> Veto | None``."""

BeforeHostCall: TypeAlias = Callable[[str, Mapping[str, object]], Awaitable[Veto | None]]
"""``async def before_host_call(name, arguments) -> Veto | None`` (arguments as validated)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Hooks:
    """Callbacks run before a cell executes and before a host function runs.

    ``before_host_call`` sees every host function call from the kernel, ``predict`` and
    ``submit`` included, after its arguments were validated.
    """

    before_execute: BeforeExecute | None = None
    before_host_call: BeforeHostCall | None = None


async def ask(
    hook: Callable[P, Awaitable[Veto | None]] | None, *args: P.args, **kwargs: P.kwargs
) -> Veto | None:
    """Run *hook* (if any) and return its verdict; an exception is a veto naming it."""
    if hook is None:
        return None
    try:
        verdict = await hook(*args, **kwargs)
    except Exception as exc:  # a failing hook must not let the action through
        return Veto(f"the hook failed: {type(exc).__name__}: {exc}")
    checked: object = verdict
    if checked is not None and not isinstance(checked, Veto):
        return Veto(f"the hook returned {type(checked).__name__}, not Veto or None")
    return verdict
