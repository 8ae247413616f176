"""``predict`` and ``predict_many``: sub-model calls made from code in the kernel.

Each call is one request to the sub-model with a fresh context: the instructions as the system
message and the input (text, or data rendered as JSON) as the user message, both redacted.
With ``output=`` (a JSON Schema from the kernel: :func:`sunroom.prelude.schema.schema_of` of the
type the code named, or a schema the code wrote) the request asks for structured output, and
the reply is parsed and validated on the host against that schema with ``jsonschema``; the
kernel rebuilds it as the type it named. ``predict_many`` runs items concurrently under a bound
and returns results in input order; a failed item is an error marker in its slot. A spent
budget fails the whole call (``BudgetExceededError`` in the kernel). ``recursive=True`` runs the
sub-call as a nested RLM session while the depth limit allows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, final

from sunroom.agent import events as ev
from sunroom.agent.calls import CURRENT_CALL, ModelGate, Publish, Redact, spending
from sunroom.agent.previews import json_preview
from sunroom.agent.schema import JsonSchema, OutputCheck, parse_json_reply, structured
from sunroom.agent.shim import ERROR_MARKER
from sunroom.errors import BudgetExceededError, UsageError
from sunroom.providers import Model, OutputSchema, Request, SystemMessage, UserMessage
from sunroom.sandbox.functions import HostFunction, host_function

__all__ = ["Nested", "Predictor", "TreeLink", "render_input"]

T = TypeVar("T")

Nested = Callable[[str, object, JsonSchema | None, "TreeLink"], Awaitable[object]]
"""``nested(instructions, input, output, tree) -> value``: runs a sub-session (recursion);
*output* is a :class:`~sunroom.agent.schema.JsonSchema` or None, *tree* where the sub-session's
own sub-calls go in the recursion tree."""


@final
@dataclass(frozen=True, slots=True)
class TreeLink:
    """Where a session's sub-calls are reported: its root session's recursion tree.

    Attributes:
        publish: the root session's publisher (``SubCallEnded`` events go to its log).
        parent: the node that runs this session (None: this is the root session).
        depth: the depth of this session's sub-calls (1 for the root session's).
    """

    publish: Publish
    parent: str | None = None
    depth: int = 1


_JSON_NOTE: Final = (
    "\n\nReply with exactly one JSON value that matches the given schema, and nothing else."
)


def render_input(value: object) -> str:
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
        tree: where each sub-call is reported as a ``SubCallEnded`` event (default: *publish*,
            as the root of the tree).
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
        tree: TreeLink | None = None,
    ) -> None:
        if concurrency <= 0:
            raise UsageError("predict concurrency must be positive")
        self._model = model
        self._gate = gate
        self._publish = publish
        self._redact = redact
        self._concurrency = concurrency
        self._nested = nested
        self._tree = tree or TreeLink(publish)

    def functions(self) -> list[HostFunction]:
        """The two host functions, ready for a kernel."""
        return [
            host_function(self.predict, name="predict"),
            host_function(self.predict_many, name="predict_many"),
        ]

    async def predict(  # type: ignore[explicit-any]  # a wire contract (kernel code, schema)
        self,
        instructions: str,
        input: Any = None,  # noqa: A002 - the name the kernel sees
        *,
        output: dict[str, Any] | None = None,
        recursive: bool = False,
    ) -> Any:
        """Ask the sub-model once; return its text, or data matching the *output* JSON Schema.

        Raises ValueError for an invalid schema or a reply that does not match it.
        """
        check = _schema(output)
        return await self._one(instructions, input, check, recursive=recursive, index=0)

    async def predict_many(  # type: ignore[explicit-any]  # a wire contract (kernel code, schema)
        self,
        instructions: str,
        inputs: list[Any],
        *,
        output: dict[str, Any] | None = None,
        recursive: bool = False,
    ) -> list[Any]:
        """predict() over every input concurrently; failed items are error markers in place.

        Raises ValueError for an invalid *output* schema, BudgetExceededError when the budget
        is spent.
        """
        check = _schema(output)
        total = len(inputs)
        call_id = CURRENT_CALL.get()
        gate = asyncio.Semaphore(self._concurrency)
        counts = {"done": 0, "failed": 0}

        async def item(index: int, value: object) -> object:
            async with gate:
                try:
                    return await self._one(
                        instructions, value, check, recursive=recursive, index=index, many=True
                    )
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

        results = await asyncio.gather(*(item(i, v) for i, v in enumerate(inputs)))
        for row in results:
            failure = row.get(ERROR_MARKER) if isinstance(row, dict) else None
            if failure is not None and failure["type"] == BudgetExceededError.__name__:
                raise BudgetExceededError(failure["message"])
        return results

    async def _one(
        self,
        instructions: str,
        value: object,
        check: JsonSchema | None,
        *,
        recursive: bool,
        index: int,
        many: bool = False,
    ) -> object:
        """One sub-call, reported as a ``SubCallEnded`` node of the recursion tree."""
        tree = self._tree
        call_id = CURRENT_CALL.get()
        node = f"{call_id}.{index}"
        started = time.perf_counter()
        shown_input = ""
        shown_output = ""
        error: str | None = None
        with spending() as spend:
            try:
                if recursive:
                    shown_input = ev.preview(self._redact(render_input(value)))
                    if self._nested is None:
                        raise RecursionError(
                            "predict(recursive=True): the session's max_depth allows no "
                            "deeper session"
                        )
                    link = TreeLink(tree.publish, parent=node, depth=tree.depth + 1)
                    result = await self._nested(instructions, value, check, link)
                    answer = result if check is None else _validated(check, result)
                else:
                    user_text = self._redact(render_input(value))
                    shown_input = ev.preview(user_text)
                    answer = await self._complete(instructions, user_text, check)
                shown_output = ev.preview(self._redact(json_preview(answer)))
                return answer
            except asyncio.CancelledError:
                error = "cancelled"
                raise
            except Exception as exc:
                error = ev.preview(self._redact(f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                tree.publish(
                    ev.SubCallEnded,
                    node=node,
                    parent=tree.parent,
                    call_id=call_id,
                    index=index,
                    name="predict_many" if many else "predict",
                    depth=tree.depth,
                    recursive=recursive,
                    model=self._model.name,
                    duration_s=time.perf_counter() - started,
                    input_tokens=spend.input_tokens,
                    output_tokens=spend.output_tokens,
                    cost_micro_usd=spend.cost_micro_usd,
                    error=error,
                    input=shown_input,
                    output=shown_output,
                )

    async def _complete(
        self, instructions: str, user_text: str, check: JsonSchema | None
    ) -> object:
        """Ask the sub-model once (*user_text* already redacted); its checked answer."""
        schema: OutputSchema | None = None
        wrapped = False
        system = instructions
        if check is not None:
            json_schema, wrapped = structured(check)
            schema = OutputSchema(json_schema, name=_schema_name(check))
            system += _JSON_NOTE
        request = Request(
            [SystemMessage(self._redact(system)), UserMessage(user_text)],
            output_schema=schema,
        )
        response = await self._gate.complete(self._model, request, sub_call=True)
        if response.finish_reason == "length":
            raise ValueError("the sub-model's reply was cut off by its output-token limit")
        if check is None:
            return response.text
        data = parse_json_reply(response.text)
        if wrapped and isinstance(data, dict) and "value" in data:
            data = data["value"]
        return _validated(check, data)


def _schema(output: Mapping[str, object] | None) -> JsonSchema | None:
    """The kernel's *output* schema, checked; ValueError (for the kernel) when it is invalid."""
    if output is None:
        return None
    try:
        return JsonSchema.parse(output, what="predict(output=...)")
    except UsageError as exc:
        raise ValueError(str(exc)) from None


def _schema_name(check: OutputCheck) -> str:
    title = check.json_schema().get("title")
    return title if isinstance(title, str) and title.isidentifier() else "output"


def _validated(check: JsonSchema, data: T) -> T:
    """*data* if it matches *check*; else ValueError naming each path that failed."""
    try:
        return check.validate(data, root="reply")
    except ValueError as exc:
        raise ValueError(f"the sub-model's reply does not match the output schema: {exc}") from None
