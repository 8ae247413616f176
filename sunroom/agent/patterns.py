"""JSON Schema's regular expressions, matched in linear time (RE2), on the host.

A schema may come from hostile code: ``predict(output=...)`` inside a kernel sends one, and the
host validates the model's reply against it. Python's ``re`` backtracks, so a pattern like
``(a+)+$`` against a long reply would hold the host's event loop for minutes. So ``pattern``,
``patternProperties`` and ``additionalProperties`` (which consults ``patternProperties``) are
matched with RE2 (``google-re2``), whose time is linear in the input; :func:`check_patterns`
refuses, when a schema is parsed, a pattern RE2 cannot run (lookaround, backreferences), one
longer than :data:`MAX_PATTERN_CHARS`, and ``unevaluatedProperties`` beside
``patternProperties`` (the validator would match those with ``re``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import ClassVar, Final, Protocol, TypedDict

import jsonschema
import re2
from jsonschema import FormatChecker
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing.jsonschema import SchemaRegistry

from sunroom.errors import UsageError

__all__ = ["MAX_PATTERN_CHARS", "LinearValidator", "check_patterns", "linear_time"]

MAX_PATTERN_CHARS: Final = 1_000
"""The longest pattern a schema may hold."""

_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is our error to report, not a line on stderr


class _Regex(Protocol):
    def search(self, text: str, /) -> object: ...


class LinearValidator(Protocol):
    """A validator class built by :func:`linear_time`, as jsonschema runs it.

    Its stubs leave ``extend`` untyped and narrow an instance to JSON types; at run time any
    value is validated (a value of no JSON type matches no ``type``).
    """

    FORMAT_CHECKER: ClassVar[FormatChecker]

    def __init__(
        self,
        schema: Mapping[str, object],
        *,
        registry: SchemaRegistry,
        format_checker: FormatChecker | None,
    ) -> None: ...

    def iter_errors(self, instance: object) -> Iterator[ValidationError]:
        """Every way *instance* fails the schema."""

    def is_type(self, instance: object, type: str) -> bool:
        """Whether *instance* is of the JSON type *type*."""

    def descend(
        self,
        instance: object,
        schema: object,
        path: str | None = None,
        schema_path: str | None = None,
    ) -> Iterator[ValidationError]:
        """Every way *instance* fails *schema*, a part of the schema at *path*."""


class _ObjectKeywords(TypedDict, total=False):
    """The keywords of a (meta-schema-valid) schema that ``additionalProperties`` reads."""

    properties: Mapping[str, object]
    patternProperties: Mapping[str, object]


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> _Regex:
    return re2.compile(pattern, _OPTIONS)


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


def _patterns_in(node: object, depth: int = 0) -> Iterator[tuple[str, str]]:
    """Every ``(keyword, pattern)`` in *node* (a schema), at any depth (at most 64)."""
    if depth > 64:
        return
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield key, value
            elif key == "patternProperties" and isinstance(value, Mapping):
                for name in value:
                    yield key, str(name)
            yield from _patterns_in(value, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns_in(item, depth + 1)


def _uses(node: object, keyword: str, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if isinstance(node, Mapping):
        return keyword in node or any(_uses(v, keyword, depth + 1) for v in node.values())
    if isinstance(node, list):
        return any(_uses(v, keyword, depth + 1) for v in node)
    return False


def check_patterns(schema: Mapping[str, object], *, what: str) -> None:
    """Raise UsageError (one sentence) when *schema* holds a pattern this host will not run."""
    for keyword, pattern in _patterns_in(schema):
        if len(pattern) > MAX_PATTERN_CHARS:
            raise UsageError(
                f"{what}: a {keyword} of {len(pattern)} characters is longer than the "
                f"{MAX_PATTERN_CHARS} allowed"
            )
        try:
            _compiled(pattern)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            raise UsageError(
                f"{what}: the {keyword} {pattern[:80]!r} cannot run in linear time ({reason}); "
                "lookaround and backreferences are not supported"
            ) from None
    if _uses(schema, "patternProperties") and _uses(schema, "unevaluatedProperties"):
        raise UsageError(
            f"{what}: unevaluatedProperties beside patternProperties is not supported; "
            "use additionalProperties"
        )


def _pattern(
    validator: LinearValidator, pattern: str, instance: object, schema: Mapping[str, object]
) -> Iterator[ValidationError]:
    if (
        isinstance(instance, str)  # what is_type(instance, "string") checks (mypy narrows it)
        and validator.is_type(instance, "string")
        and not _search(pattern, instance)
    ):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: LinearValidator,
    patterns: Mapping[str, object],
    instance: object,
    schema: Mapping[str, object],
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object") or not isinstance(instance, Mapping):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: LinearValidator, additional: object, instance: object, schema: _ObjectKeywords
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object") or not isinstance(instance, Mapping):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in named and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        # worded as jsonschema words it, so messages read the same whichever keyword failed
        listed = ", ".join(repr(key) for key in sorted(extras)[:5])
        more = f" and {len(extras) - 5} more" if len(extras) > 5 else ""
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(
            f"Additional properties are not allowed ({listed}{more} {verb} unexpected)"
        )


def linear_time(validator_cls: type[Validator]) -> type[LinearValidator]:
    """*validator_cls* with its regex keywords matched by RE2 (a new class; cached)."""
    return _extended(validator_cls)


class _Extend(Protocol):
    def __call__(
        self, validator: type[Validator], validators: Mapping[str, object]
    ) -> type[LinearValidator]: ...


_extend: _Extend = jsonschema.validators.extend  # untyped in its stubs


@functools.lru_cache(maxsize=16)
def _extended(validator_cls: type[Validator]) -> type[LinearValidator]:
    return _extend(
        validator_cls,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
