"""``submit``: the host function that hands back a run's answer.

The value is validated on the host against the session's ``output`` type (any pydantic model,
dataclass or type; ``None`` accepts anything). An invalid value raises ``ValueError`` inside the
kernel whose message is the per-field diff, so the code or the model can fix it. The first valid
value wins and is recorded *on the host at call time*: nothing the cell does afterwards (catching
``BaseException``, raising, looping) can take it back. A later submit raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import Any, Union, final

import pydantic

from sunroom.agent import events as ev
from sunroom.agent.calls import Publish, Redact
from sunroom.agent.schema import explain
from sunroom.errors import UsageError
from sunroom.sandbox.functions import HostFunction, host_function

__all__ = ["Submission", "type_name"]


def type_name(tp: Any) -> str:
    """A readable name of an output type."""
    if tp is None:
        return "any value"
    name = getattr(tp, "__name__", None)
    return name if isinstance(name, str) else repr(tp)


@final
class Submission:
    """Holds the one accepted answer of a run; :meth:`function` is the ``submit`` host function.

    Args:
        output: the type a value must satisfy (None: any value).
        publish: the session's event publisher.
        redact: the session's redactor (for rejection messages).

    Raises UsageError if *output* is not a type pydantic can validate.
    """

    def __init__(self, *, output: Any, publish: Publish, redact: Redact) -> None:
        self.output_type = output
        self._publish = publish
        self._redact = redact
        self.accepted = False
        self.value: Any = None
        try:
            self._adapter: pydantic.TypeAdapter[Any] | None = (
                None if output is None else pydantic.TypeAdapter(output)
            )
        except (
            pydantic.PydanticSchemaGenerationError,
            pydantic.PydanticUserError,
            TypeError,
        ) as exc:
            raise UsageError(
                f"output={output!r} is not a type pydantic can validate: {exc}"
            ) from exc

    def reset(self) -> None:
        """Forget the accepted value (a new run starts)."""
        self.accepted = False
        self.value = None

    def function(self) -> HostFunction:
        """The ``submit`` host function.

        Its signature names the output type, so the kernel gets a dataclass mirror of it
        (``submit(Answer(...))``).
        """

        async def submit(value: Any) -> str:
            """Hand back the final answer; it must match the output type. Call it once."""
            return self.submit(value)

        shown: Any = Any if self.output_type is None else Union[self.output_type, Any]  # noqa: UP007
        submit.__annotations__ = {"value": shown, "return": str}
        built: HostFunction = host_function(submit)
        return built

    def submit(self, value: Any) -> str:
        """Validate and record *value*; raise ValueError (invalid) or RuntimeError (repeated)."""
        if self.accepted:
            reason = "submit() was already called with a valid value; only the first one counts"
            self._publish(ev.SubmitRejected, reason=reason)
            raise RuntimeError(reason)
        if isinstance(value, pydantic.BaseModel):
            value = value.model_dump()
        checked = value
        if self._adapter is not None:
            try:
                checked = self._adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                title = f"submit(): the value does not match {type_name(self.output_type)}:"
                reason = self._redact(explain(exc, title=title))
                self._publish(ev.SubmitRejected, reason=reason)
                raise ValueError(reason) from None
        self.accepted = True
        self.value = checked
        self._publish(ev.SubmitAccepted, output=checked)
        return "accepted: the run ends when this cell finishes"
