"""``submit``: the host function that hands back a run's answer.

The value is validated on the host (the kernel is never the authority) against the session's
``output``: a JSON Schema (a dict, validated with ``jsonschema``: every keyword is enforced), or
a Python type (a pydantic model, dataclass or type, validated with pydantic); ``None`` accepts
anything. An invalid value raises ``ValueError`` inside the kernel whose message names each
path that failed (``submit(): output.count: -1 is less than the minimum of 0``), so the code or
the model can fix it. The first valid value wins and is recorded *on the host at call time*:
nothing the cell does afterwards (catching ``BaseException``, raising, looping) can take it
back. A later submit raises ``RuntimeError``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Union, final

import pydantic

from sunroom.agent import events as ev
from sunroom.agent.calls import Publish, Redact
from sunroom.agent.schema import JsonSchema, inline_refs, output_check
from sunroom.sandbox.functions import HostFunction, host_function

__all__ = ["Submission", "type_name"]

_DOC = "Hand back the final answer; it must match the output type. Call it once."


def type_name(tp: object) -> str:
    """A readable name of an output (a type, a JSON Schema or None)."""
    if tp is None:
        return "any value"
    check = output_check(tp)
    assert check is not None
    return check.name


@final
class Submission:
    """Holds the one accepted answer of a run; :meth:`function` is the ``submit`` host function.

    Args:
        output: what a value must satisfy: a JSON Schema (a mapping), a type pydantic
            validates, or None (any value).
        publish: the session's event publisher.
        redact: the session's redactor (for rejection messages).

    Raises UsageError if *output* is an invalid JSON Schema or a type pydantic cannot validate.
    """

    def __init__(self, *, output: object, publish: Publish, redact: Redact) -> None:
        self.output_type = output
        self._check = output_check(output)
        self._publish = publish
        self._redact = redact
        self.accepted = False
        self.value: object = None

    def reset(self) -> None:
        """Forget the accepted value (a new run starts)."""
        self.accepted = False
        self.value = None

    def function(self) -> HostFunction:
        """The ``submit`` host function.

        Its signature carries the output's JSON Schema, so the kernel gets the output type's
        dataclass mirror (``submit(Answer(...))``) with its constraints; for a JSON Schema
        output the docstring shows the schema itself.
        """

        async def submit(value: Any) -> str:  # type: ignore[explicit-any]  # a wire contract (annotations set below)
            return self.submit(value)

        check = self._check
        shown: object
        if check is None:
            shown = Any
            doc = _DOC
        elif isinstance(check, JsonSchema):
            shape = inline_refs(check.schema)  # pydantic embeds it: no refs into it
            if shape.get("type") == "object":
                shape.setdefault("title", "Output")
            either = {"anyOf": [shape, {}]}
            shown = Annotated[Any, pydantic.WithJsonSchema(either)]
            doc = (
                "Hand back the final answer; it must match this JSON Schema (checked on the "
                f"host). Call it once.\n\n{json.dumps(check.schema, ensure_ascii=False)}"
            )
        else:
            shown = Union[check.type, Any]  # noqa: UP007 - built from a runtime type
            doc = _DOC
        submit.__annotations__ = {"value": shown, "return": str}
        submit.__doc__ = doc
        built: HostFunction = host_function(submit)
        return built

    def submit(self, value: object) -> str:
        """Validate and record *value*; raise ValueError (invalid) or RuntimeError (repeated)."""
        if self.accepted:
            reason = "submit() was already called with a valid value; only the first one counts"
            self._publish(ev.SubmitRejected, reason=reason)
            raise RuntimeError(reason)
        checked = value.model_dump() if isinstance(value, pydantic.BaseModel) else value
        if self._check is not None:
            try:
                checked = self._check.validate(checked, root="output")
            except ValueError as exc:
                reason = self._redact(f"submit(): {exc}")
                self._publish(ev.SubmitRejected, reason=reason)
                raise ValueError(reason) from None
        self.accepted = True
        self.value = checked
        self._publish(ev.SubmitAccepted, output=checked)
        return "accepted: the run ends when this cell finishes"
