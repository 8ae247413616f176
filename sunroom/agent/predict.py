"""``predict`` and ``predict_many``: sub-model calls made from code in the kernel.

Each call is one request to the sub-model with a fresh context: the instructions as the system
message and the input (text, or data rendered as JSON) as the user message, both redacted.
With ``output=`` (a type spec from the kernel, see :mod:`sunroom.agent.shim`) the request asks
for structured output, and the reply is parsed and validated on the host; the kernel rebuilds
it as the type it named. ``predict_many`` runs items concurrently under a bound and returns
results in input order; a failed item is an error marker in its slot. A spent budget fails the
whole call (``BudgetExceededError`` in the kernel). ``recursive=True`` runs the sub-call as a
nested RLM session while the depth limit allows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import pydantic

from sunroom.agent import events as ev
from sunroom.agent.calls import CURRENT_CALL, ModelGate, Publish, Redact
from sunroom.agent.schema import explain, parse_json_reply, structured, type_from_spec
from sunroom.agent.shim import ERROR_MARKER
from sunroom.errors import BudgetExceededError, UsageError
from sunroom.providers import Model, OutputSchema, Request, SystemMessage, UserMessage
from sunroom.sandbox.functions import HostFunction, host_function

__all__ = ["Nested", "Predictor", "render_input"]

Nested = Callable[[str, Any, Any], Awaitable[Any]]
"""``nested(instructions, input, output_type) -> value``: runs a sub-session (recursion)."""

_JSON_NOTE: Final = (
    "\n\nReply with exactly one JSON value that matches the given schema, and nothing else."
)


def render_input(value: Any) -> str:
    """The text a sub-model sees for *value*: strings as they are, other data as JSON."""
    if value is None:
        return "(no input)"
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False, default=str)


@final
class Predictor:
    """The host side of ``predict``/``predict_many`` for one session.

    Args:
        model: the sub-model.
        gate: the session's model gate (shared budget).
        publish: the session's event publisher.
        redact: the session's redactor.
        concurrency: most ``predict_many`` items in flight at once.
        nested: runs a recursive sub-session, or None when recursion is not allowed here.
    """

    def __init__(
        self,
        *,
        model: Model,
        gate: ModelGate,
        publish: Publish,
        redact: Redact,
        concurrency: int = 8,
        nested: Nested | None = None,
    ) -> None:
        if concurrency <= 0:
            raise UsageError("predict concurrency must be positive")
        self._model = model
        self._gate = gate
        self._publish = publish
        self._redact = redact
        self._concurrency = concurrency
        self._nested = nested

    def functions(self) -> list[HostFunction]:
        """The two host functions, ready for a kernel."""
        return [
            host_function(self.predict, name="predict"),
            host_function(self.predict_many, name="predict_many"),
        ]

    async def predict(
        self,
        instructions: str,
        input: Any = None,  # noqa: A002 - the name the kernel sees
        *,
        output: dict[str, Any] | None = None,
        recursive: bool = False,
    ) -> Any:
        """Ask the sub-model once; return its text, or data of the requested output type."""
        tp = None if output is None else type_from_spec(output)
        return await self._one(instructions, input, tp, recursive=recursive)

    async def predict_many(
        self,
        instructions: str,
        inputs: list[Any],
        *,
        output: dict[str, Any] | None = None,
        recursive: bool = False,
    ) -> list[Any]:
        """predict() over every input concurrently; failed items are error markers in place."""
        tp = None if output is None else type_from_spec(output)
        total = len(inputs)
        call_id = CURRENT_CALL.get()
        gate = asyncio.Semaphore(self._concurrency)
        counts = {"done": 0, "failed": 0}

        async def item(value: Any) -> Any:
            async with gate:
                try:
                    return await self._one(instructions, value, tp, recursive=recursive)
                except Exception as exc:
                    counts["failed"] += 1
                    message = self._redact(str(exc))
                    return {ERROR_MARKER: {"type": type(exc).__name__, "message": message}}
                finally:
                    counts["done"] += 1
                    self._publish(
                        ev.PredictProgress,
                        call_id=call_id,
                        done=counts["done"],
                        total=total,
                        failed=counts["failed"],
                    )

        results = await asyncio.gather(*(item(v) for v in inputs))
        for row in results:
            failure = row.get(ERROR_MARKER) if isinstance(row, dict) else None
            if failure is not None and failure["type"] == BudgetExceededError.__name__:
                raise BudgetExceededError(failure["message"])
        return results

    async def _one(self, instructions: str, value: Any, tp: Any, *, recursive: bool) -> Any:
        if recursive:
            if self._nested is None:
                raise RecursionError(
                    "predict(recursive=True): the session's max_depth allows no deeper session"
                )
            result = await self._nested(instructions, value, tp)
            return result if tp is None else _dump(tp, result)
        schema: OutputSchema | None = None
        wrapped = False
        system = instructions
        if tp is not None:
            json_schema, wrapped = structured(tp)
            schema = OutputSchema(json_schema, name=_schema_name(tp))
            system += _JSON_NOTE
        request = Request(
            [
                SystemMessage(self._redact(system)),
                UserMessage(self._redact(render_input(value))),
            ],
            output_schema=schema,
        )
        response = await self._gate.complete(self._model, request, sub_call=True)
        if response.finish_reason == "length":
            raise ValueError("the sub-model's reply was cut off by its output-token limit")
        if tp is None:
            return response.text
        data = parse_json_reply(response.text)
        if wrapped:
            data = {"value": data} if not (isinstance(data, dict) and "value" in data) else data
        return _dump(tp, data, wrapped=wrapped)


def _schema_name(tp: Any) -> str:
    name = getattr(tp, "__name__", "output")
    return name if isinstance(name, str) and name.isidentifier() else "output"


def _dump(tp: Any, data: Any, *, wrapped: bool = False) -> Any:
    """Validate *data* as *tp* and return it as plain JSON-ready data; ValueError if invalid."""
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(tp)
    try:
        if wrapped:
            value = adapter.validate_python(data["value"])
        elif isinstance(data, pydantic.BaseModel):
            value = adapter.validate_python(data.model_dump())
        else:
            value = adapter.validate_python(data)
    except pydantic.ValidationError as exc:
        raise ValueError(
            explain(exc, title="the sub-model's reply does not match the output type:")
        ) from None
    return adapter.dump_python(value, mode="json")
