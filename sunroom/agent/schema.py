"""Output types: what ``submit`` and ``predict`` validate against, on the host.

JSON Schema is the one description of a type that crosses a boundary. An output is either

* a JSON Schema (a dict from a client, or from the kernel for ``predict(output=...)``):
  :class:`JsonSchema`, validated with the ``jsonschema`` package, so every keyword is enforced
  (``minimum``, ``pattern``, ``enum``, ``const``, ``minLength``, ``minItems``, ``required``,
  ``additionalProperties``, ``anyOf``/``oneOf``, ``$ref``/``$defs`` ...); or
* a Python type (a pydantic model, a dataclass, ``int``, ``list[str]`` ...): :class:`TypeCheck`,
  validated with pydantic, which is the type's own definition (its JSON Schema is pydantic's).

Both report a failure as :class:`ValueError` whose message is one sentence per problem, naming
the path that failed (``output.items[2].age: -5 is less than the minimum of 0``), never a raw
validator dump. Only local references (``#/$defs/...``) are allowed: a schema never makes the
host fetch anything, and its regular expressions run in linear time (:mod:`sunroom.agent.patterns`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, final

import jsonschema
import pydantic
import referencing
from jsonschema.exceptions import ValidationError, best_match, relevance

from sunroom.agent.patterns import LinearValidator, check_patterns, linear_time
from sunroom.errors import UsageError

__all__ = [
    "JsonSchema",
    "OutputCheck",
    "TypeCheck",
    "inline_refs",
    "output_check",
    "parse_json_reply",
    "structured",
]

MAX_PROBLEMS: Final = 5
"""Problems named in one message; the rest are counted."""

_SCANNED_ERRORS: Final = 50
_REPR_LIMIT: Final = 60
_MAX_SCHEMA_DEPTH: Final = 64

T = TypeVar("T")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _path(root: str, parts: Iterable[object]) -> str:
    out = root
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def _sentences(problems: Sequence[str]) -> str:
    shown = list(dict.fromkeys(problems))[:MAX_PROBLEMS]
    text = "; ".join(shown)
    more = len(set(problems)) - len(shown)
    return text + (f"; and {more} more" if more > 0 else "")


def _describe(error: ValidationError, root: str) -> str:
    """One sentence: the path, then the validator's message with a short value in it."""
    message = error.message
    try:
        full = repr(error.instance)
    except Exception:  # an instance whose repr fails: the message is all there is
        full = ""
    if full and len(full) > _REPR_LIMIT and message.startswith(full):
        message = _short(error.instance) + message[len(full) :]
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{_path(root, error.absolute_path)}: {message}"


def _json_problems(errors: Iterable[ValidationError], root: str) -> list[str]:
    scanned = sorted(itertools.islice(errors, _SCANNED_ERRORS), key=relevance, reverse=True)
    # best_match descends into anyOf/oneOf to the error that most likely says what is wrong
    return [_describe(best_match([e]), root) for e in scanned]


def _walk_refs(node: object, depth: int = 0) -> Iterable[str]:
    if depth > _MAX_SCHEMA_DEPTH:
        raise UsageError("the JSON Schema is nested too deeply")
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            else:
                yield from _walk_refs(value, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_refs(item, depth + 1)


@final
@dataclasses.dataclass(frozen=True, eq=False)
class JsonSchema:
    """A checked JSON Schema and its validator (draft 2020-12 unless ``$schema`` says another).

    Build it with :meth:`parse`. ``name`` is what prompts call the type: the schema's
    ``title``, or its compact JSON when short.
    """

    schema: Mapping[str, object]
    name: str
    _validator: LinearValidator = dataclasses.field(repr=False)

    @classmethod
    def parse(cls, schema: object, *, what: str = "output") -> JsonSchema:
        """Check *schema* against its meta-schema and build its validator.

        *what* names it in messages. Raises UsageError (one sentence) for a schema that is not
        a JSON object, not valid JSON, invalid against its meta-schema, or that refers to
        anything but itself (``$ref`` must start with ``#``).
        """
        if isinstance(schema, JsonSchema):
            return schema
        if not isinstance(schema, Mapping):
            raise UsageError(
                f"{what}: a JSON Schema must be an object, got {type(schema).__name__}"
            )
        try:
            plain = json.loads(json.dumps(schema, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{what}: the JSON Schema is not plain JSON ({exc})") from None
        for ref in _walk_refs(plain):
            if not ref.startswith("#"):
                raise UsageError(
                    f"{what}: $ref {ref!r} is remote; only local references (#/$defs/...) are "
                    "allowed"
                )
        validator_cls = jsonschema.validators.validator_for(plain, default=_DEFAULT)
        problems = _json_problems(validator_cls(validator_cls.META_SCHEMA).iter_errors(plain), what)
        if problems:
            raise UsageError(f"invalid JSON Schema: {_sentences(problems)}")
        check_patterns(plain, what=what)  # kernels send schemas: no backtracking on the host
        linear_cls = linear_time(validator_cls)
        validator = linear_cls(
            plain,
            registry=referencing.Registry(),  # no retrieval: refs resolve inside the schema
            format_checker=linear_cls.FORMAT_CHECKER,
        )
        title = plain.get("title")
        if isinstance(title, str) and title:
            name = title
        else:
            compact = json.dumps(plain, separators=(", ", ": "))
            name = compact if len(compact) <= 120 else "the JSON Schema in submit's docstring"
        return cls(schema=plain, name=name, _validator=validator)

    def json_schema(self) -> dict[str, object]:
        """The schema (a copy)."""
        copied: dict[str, object] = json.loads(json.dumps(self.schema))
        return copied

    def validate(self, value: T, *, root: str) -> T:
        """Return *value* unchanged if it matches; else raise ValueError naming each problem.

        *root* names the value in the message (``output``, ``reply``).
        """
        try:
            problems = _json_problems(self._validator.iter_errors(value), root)
        except referencing.exceptions.Unresolvable as exc:
            raise ValueError(
                f"{root}: the schema's reference {exc.ref!r} does not resolve"
            ) from None
        if problems:
            raise ValueError(_sentences(problems))
        return value


@final
@dataclasses.dataclass(frozen=True, eq=False)
class TypeCheck:
    """A Python type validated by pydantic (the type's own definition)."""

    type: object
    name: str
    adapter: pydantic.TypeAdapter[object] = dataclasses.field(repr=False)

    @classmethod
    def of(cls, tp: object) -> TypeCheck:
        """Raises UsageError when pydantic cannot validate *tp*."""
        try:
            adapter = _adapter(tp)
        except (
            pydantic.PydanticSchemaGenerationError,
            pydantic.PydanticUserError,
            TypeError,
        ) as exc:
            raise UsageError(f"output={tp!r} is not a type pydantic can validate: {exc}") from exc
        name = getattr(tp, "__name__", None)
        return cls(type=tp, name=name if isinstance(name, str) else repr(tp), adapter=adapter)

    def json_schema(self) -> dict[str, object]:
        """Pydantic's JSON Schema of the type."""
        return self.adapter.json_schema()

    def validate(self, value: object, *, root: str) -> object:
        """Return *value* validated as the type; else raise ValueError naming each problem."""
        if isinstance(value, pydantic.BaseModel):
            value = value.model_dump()
        try:
            return self.adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            problems = [
                f"{_path(root, err['loc'])}: {err['msg']} (got {_short(err.get('input'))})"
                for err in exc.errors(include_url=False)
            ]
            raise ValueError(_sentences(problems)) from None

    def dump(self, value: object) -> object:
        """A validated value as plain JSON-ready data."""
        return self.adapter.dump_python(value, mode="json")


def _adapter(tp: Any) -> pydantic.TypeAdapter[object]:  # type: ignore[explicit-any]  # pydantic wants a TypeForm: list[int] as a value is none
    """Pydantic's adapter of *tp* (its errors propagate)."""
    return pydantic.TypeAdapter(tp)


def inline_refs(schema: Mapping[str, object]) -> dict[str, object]:
    """*schema* with every local ``$ref`` replaced by its target, without ``$defs``.

    For display where the schema is embedded in another document (the kernel's ``submit``
    signature): a recursive reference becomes ``{}`` (any value). A definition without a
    ``title`` gets its name as title, so its mirror is named after it. Never used to validate.
    """
    defs = {**_object(schema.get("definitions")), **_object(schema.get("$defs"))}

    def walk(node: object, expanding: frozenset[str], depth: int) -> object:
        if isinstance(node, Mapping):
            return walk_object(node, expanding, depth)
        if depth > _MAX_SCHEMA_DEPTH:
            return {}
        if isinstance(node, list):
            return [walk(item, expanding, depth + 1) for item in node]
        return node

    def walk_object(
        node: Mapping[str, object], expanding: frozenset[str], depth: int
    ) -> dict[str, object]:
        if depth > _MAX_SCHEMA_DEPTH:
            return {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if ref not in (f"#/$defs/{name}", f"#/definitions/{name}") or name not in defs:
                return {}
            if name in expanding:
                return {}
            found = defs[name]
            target: dict[str, object] = dict(found) if isinstance(found, Mapping) else {}
            target.setdefault("title", name)
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return walk_object({**target, **siblings}, expanding | {name}, depth + 1)
        return {
            k: walk(v, expanding, depth + 1)
            for k, v in node.items()
            if k not in ("$defs", "definitions")
        }

    return walk_object(schema, frozenset(), 0)


def _object(value: object) -> Mapping[str, object]:
    """*value* when it is a mapping (``$defs`` of a schema), else an empty one."""
    return value if isinstance(value, Mapping) else {}


OutputCheck = JsonSchema | TypeCheck
"""What an output is checked with."""

_DEFAULT: Final = jsonschema.Draft202012Validator


def output_check(output: object, *, what: str = "output") -> OutputCheck | None:
    """The check for an ``output=``: None (anything), a JSON Schema (a mapping) or a type.

    Raises UsageError for an invalid schema or a type pydantic cannot validate.
    """
    if output is None:
        return None
    if isinstance(output, JsonSchema | TypeCheck):
        return output
    if isinstance(output, Mapping):
        return JsonSchema.parse(output, what=what)
    return TypeCheck.of(output)


def structured(check: OutputCheck) -> tuple[dict[str, object], bool]:
    """A JSON Schema for structured output, and whether it wraps the type as ``value``.

    Vendors want an object at the root, so anything else is asked for as
    ``{"value": <schema>}`` (its ``$defs`` move to the wrapper's root, where its references
    point).
    """
    schema = check.json_schema()
    if schema.get("type") == "object":
        return schema, False
    hoisted: dict[str, object] = {
        k: schema.pop(k) for k in ("$defs", "definitions", "$schema") if k in schema
    }
    wrapper: dict[str, object] = {
        "type": "object",
        "properties": {"value": schema},
        "required": ["value"],
        "additionalProperties": False,
        **hoisted,
    }
    return wrapper, True


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n\s*```\s*$", re.DOTALL)


def parse_json_reply(text: str) -> object:
    """Parse a reply that should be one JSON value (a ```json fence around it is accepted).

    Raises ValueError when it is not JSON.
    """
    match = _FENCE.match(text)
    body = match.group(1) if match else text.strip()
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        shown = body if len(body) <= 200 else body[:200] + "..."
        raise ValueError(f"the reply is not JSON ({exc.msg}): {shown!r}") from None
