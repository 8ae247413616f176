"""What to ask a model: :class:`Request`, its :class:`Settings` and an :class:`OutputSchema`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, final

from sunroom.errors import UsageError

from .messages import Message, ToolSpec

__all__ = ["OutputSchema", "Request", "Settings"]


@final
@dataclass(frozen=True, slots=True)
class Settings:
    """Generation settings; ``None`` means "the model's default".

    Attributes:
        temperature: Sampling temperature.
        max_output_tokens: Cap on generated tokens (a reply cut here ends with ``length``).
        timeout: Seconds to wait for a reply: the whole reply for :meth:`Model.complete`,
            the first event and each gap between events for :meth:`Model.stream`. It bounds
            one attempt; the retry policy's deadline bounds all of them.
        stop: Stop sequences.
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or the name of one tool to force.
        extra_body: Vendor-specific body fields, merged into the request untouched (for
            example Anthropic ``thinking`` or OpenAI ``reasoning``).
    """

    temperature: float | None = None
    max_output_tokens: int | None = None
    timeout: float | None = None
    stop: tuple[str, ...] = ()
    tool_choice: str | None = None
    extra_body: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        stop: object = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(self.stop))
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError("Settings.timeout must be positive")
        if self.max_output_tokens is not None and self.max_output_tokens <= 0:
            raise UsageError("Settings.max_output_tokens must be positive")

    def merged(self, override: Settings) -> Settings:
        """Return these settings with every field ``override`` sets taking precedence.

        ``extra_body`` mappings are merged key by key (``override`` wins).
        """
        changes: dict[str, Any] = {}
        for name in ("temperature", "max_output_tokens", "timeout", "tool_choice"):
            value = getattr(override, name)
            if value is not None:
                changes[name] = value
        if override.stop:
            changes["stop"] = override.stop
        if override.extra_body:
            changes["extra_body"] = {**(self.extra_body or {}), **override.extra_body}
        return replace(self, **changes) if changes else self


@final
@dataclass(frozen=True, slots=True)
class OutputSchema:
    """Ask for a reply that is one JSON value matching ``schema`` (structured output).

    The JSON arrives as the reply's text; parse and validate it yourself (``json.loads``,
    pydantic). ``strict`` asks vendors that support it to enforce the schema exactly; the
    schema must then meet the vendor's strict-mode rules (OpenAI: every property required,
    ``additionalProperties: false``).
    """

    schema: Mapping[str, Any]
    name: str = "output"
    strict: bool = False


@final
@dataclass(frozen=True, slots=True, init=False)
class Request:
    """One call to a model: a transcript, tools, an optional output schema and settings.

    ``messages`` and ``tools`` accept any iterable and are stored as tuples.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    output_schema: OutputSchema | None = None
    settings: Settings = field(default_factory=Settings)

    def __init__(
        self,
        messages: Iterable[Message],
        *,
        tools: Iterable[ToolSpec] = (),
        output_schema: OutputSchema | None = None,
        settings: Settings | None = None,
    ) -> None:
        object.__setattr__(self, "messages", tuple(messages))
        object.__setattr__(self, "tools", tuple(tools))
        object.__setattr__(self, "output_schema", output_schema)
        object.__setattr__(self, "settings", settings or Settings())
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise UsageError(f"duplicate tool names in {names}")
