"""Secret redaction: a registry of secret values and a redactor for everything shown.

Secrets live only on the host. The session registers them in a :class:`Secrets` registry and
passes everything a model, an event or a log sees (kernel output, tool results, errors,
structured values) through a :class:`Redactor`, which replaces every occurrence of a secret
with ``[REDACTED:<name>]`` (``[REDACTED]`` for an unnamed one). Secrets never enter the
kernel; redaction is the second line, for whatever reaches the host's output by another path.

Besides the value itself the redactor catches the forms a secret usually leaks in: base64
(standard and URL-safe, padded or not, and, for values of five bytes or more, the run of
characters that encodes it at any byte alignment inside a longer encoded blob, as in
``Authorization: Basic``), URL encoding (``%XX``, upper and lower case, ``+`` for spaces)
and JSON and Python string escaping.

Matching is done by one compiled regex over a four-character *anchor window* of each form
(chosen at its rarest characters, so the scan skips ordinary text at C speed), and each hit
is confirmed against the whole form. Overlapping occurrences are merged, so no fragment of an
overlapping secret survives; a merged span is labelled with the name of its longest form.
"""

from __future__ import annotations

import base64
import bisect
import copy
import dataclasses
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias, TypeVar, final

from pydantic import BaseModel

from sunroom.errors import UsageError

__all__ = ["MIN_SECRET_LENGTH", "Redactor", "Secrets"]

MIN_SECRET_LENGTH = 4
"""Shorter values are refused: redacting them would shred ordinary text."""

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_WINDOW = 4  # anchor window length; every form is at least this long
_MIN_BASE64_CORE = 6  # shorter alignment cores would match ordinary words

T = TypeVar("T")

_Trie: TypeAlias = "dict[str, _Trie]"


def _marker(name: str | None) -> str:
    return f"[REDACTED:{name}]" if name else "[REDACTED]"


@final
class Secrets:
    """A registry of secret values, each with an optional name.

    ``Secrets({"openai_key": key, "db_password": pw})`` names them; ``Secrets([token])``
    registers unnamed values. :meth:`add` registers more later; a :class:`Redactor` built on
    the registry picks up changes at its next call. The registry never shows its values:
    ``repr`` lists names only. It is safe to add from several threads.

    Raises:
        UsageError: a value shorter than :data:`MIN_SECRET_LENGTH` characters, a value that
            is not text or cannot be encoded as UTF-8, a name that is not 1-64 characters of
            ``[A-Za-z0-9_.-]``, a value already registered under another name, or a value
            that occurs inside a redaction marker (redaction could not then be idempotent).
    """

    __slots__ = ("_entries", "_lock", "_version")

    def __init__(self, secrets: Mapping[str, str] | Iterable[str] = ()) -> None:
        self._entries: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._version = 0
        if isinstance(secrets, Mapping):
            for name, value in secrets.items():
                self.add(value, name=name)
        else:
            for value in secrets:
                self.add(value)

    def add(self, value: str, *, name: str | None = None) -> None:
        """Register ``value`` (under ``name``); re-adding it under the same name is a no-op."""
        if not isinstance(value, str):
            raise UsageError(f"a secret must be a str, not {type(value).__name__}")
        if len(value) < MIN_SECRET_LENGTH:
            raise UsageError(
                f"secret {name or '<unnamed>'!r} is {len(value)} characters long; secrets "
                f"must have at least {MIN_SECRET_LENGTH} (a shorter value would redact "
                "ordinary text)"
            )
        if name is not None and not _NAME.fullmatch(name):
            raise UsageError(f"secret name {name!r} must be 1-64 characters of [A-Za-z0-9_.-]")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(f"secret {name or '<unnamed>'!r} is not valid Unicode") from exc
        with self._lock:
            if value in self._entries:
                if self._entries[value] == name:
                    return
                raise UsageError(
                    f"this value is already registered as {self._entries[value] or '<unnamed>'!r}"
                )
            markers = {_marker(n) for n in self._entries.values()} | {_marker(name)}
            if any(value in m for m in markers):
                raise UsageError(
                    f"secret {name or '<unnamed>'!r} occurs inside a redaction marker; "
                    "register a longer value"
                )
            new_marker = _marker(name)
            if any(v in new_marker for v in self._entries):
                raise UsageError(f"the marker {new_marker!r} would contain a registered secret")
            self._entries[value] = name
            self._version += 1

    @property
    def version(self) -> int:
        """A counter that changes whenever a value is added."""
        return self._version

    def snapshot(self) -> tuple[int, tuple[tuple[str, str | None], ...]]:
        """The version and the ``(value, name)`` pairs, taken consistently."""
        with self._lock:
            return self._version, tuple(self._entries.items())

    def names(self) -> tuple[str | None, ...]:
        """The names of the registered values, in registration order (``None`` if unnamed)."""
        with self._lock:
            return tuple(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, value: object) -> bool:
        return value in self._entries

    def __repr__(self) -> str:
        names = ", ".join(n or "<unnamed>" for n in self.names())
        return f"Secrets({len(self)} values: {names})" if names else "Secrets(0 values)"


def _base64_forms(data: bytes) -> set[str]:
    """The encodings of ``data`` and the runs that encode it at each alignment in a blob."""
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        full = encode(data).decode("ascii")
        forms.update((full, full.rstrip("=")))
        for pad in range(3):
            encoded = encode(b"\0" * pad + data + b"\0\0").decode("ascii")
            # Characters wholly inside the secret's bits: [ceil(8*pad/6), floor(8*(pad+n)/6)).
            core = encoded[-(-8 * pad // 6) : 8 * (pad + len(data)) // 6]
            if len(core) >= _MIN_BASE64_CORE:
                forms.add(core)
    return forms


def _forms(value: str) -> set[str]:
    """The value and the encoded forms it usually leaks in."""
    forms = {value}
    json_ascii = json.dumps(value)[1:-1]
    forms.update((json_ascii, json_ascii.replace("/", "\\/")))
    forms.add(json.dumps(value, ensure_ascii=False)[1:-1])
    forms.update((repr(value)[1:-1], value.encode("unicode_escape").decode("ascii")))
    for quoted in (
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),
        urllib.parse.quote_plus(value, safe=""),
    ):
        forms.add(quoted)
        forms.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted))
    forms |= _base64_forms(value.encode("utf-8"))
    return {f for f in forms if len(f) >= _WINDOW}


# Rough frequency of characters in prose, logs and JSON: the anchor window of a form starts
# at its rarest character, so the regex scan triggers as seldom as possible.
# fmt: off
_FREQUENCY = {
    " ": 15.0, "e": 10.0, "t": 7.0, "a": 6.5, "o": 6.0, "i": 6.0, "n": 6.0, "s": 5.5,
    "r": 5.5, "h": 5.0, "l": 3.5, "d": 3.5, "c": 2.5, "u": 2.5, "m": 2.0, "f": 2.0,
    "p": 1.8, "g": 1.7, "w": 1.7, "y": 1.6, "b": 1.3, "v": 1.0, "k": 0.7, "\n": 2.0,
    '"': 2.0, ",": 1.5, ".": 1.5, ":": 1.0, "x": 0.2, "j": 0.15, "q": 0.1, "z": 0.08,
}
# fmt: on


def _frequency(char: str) -> float:
    if char in _FREQUENCY:
        return _FREQUENCY[char]
    if char.isdigit():
        return 0.5
    if char.isupper():
        return 0.3
    return 0.1 if char < "\x80" else 0.05


def _anchor(form: str) -> int:
    """The offset of the window of ``form`` least likely to start in ordinary text."""
    return min(
        range(len(form) - _WINDOW + 1),
        key=lambda i: (_frequency(form[i]), _frequency(form[i + 1])),
    )


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching exactly ``words`` (all of one length), factored as a prefix tree."""
    root: _Trie = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})

    def build(node: _Trie) -> str:
        if not node:
            return ""
        alternatives = [re.escape(char) + build(child) for char, child in sorted(node.items())]
        return alternatives[0] if len(alternatives) == 1 else f"(?:{'|'.join(alternatives)})"

    return build(root)


@dataclass(frozen=True, slots=True)
class _Form:
    offset: int  # of the anchor window inside the form
    text: str
    label: str


@dataclass(frozen=True, slots=True)
class _Matcher:
    version: int
    pattern: re.Pattern[str] | None
    candidates: Mapping[str, tuple[_Form, ...]]
    forms: tuple[str, ...] = ()  # every form, sorted
    starts: frozenset[str] = frozenset()  # their first characters
    longest: int = 0  # of the forms

    @classmethod
    def build(cls, version: int, entries: Iterable[tuple[str, str | None]]) -> _Matcher:
        entries = tuple(entries)
        markers = {_marker(name) for _, name in entries}
        by_form: dict[str, str] = {}
        for value, name in entries:
            for form in _forms(value):
                # A form inside a marker would shred redacted text when it is redacted again
                # (Secrets.add refuses such values; derived forms are dropped).
                if not any(form in marker for marker in markers):
                    by_form.setdefault(form, _marker(name))
        candidates: dict[str, list[_Form]] = {}
        for form, label in by_form.items():
            offset = _anchor(form)
            window = form[offset : offset + _WINDOW]
            candidates.setdefault(window, []).append(_Form(offset, form, label))
        pattern = re.compile(_trie_pattern(candidates)) if candidates else None
        forms = tuple(sorted(by_form))
        starts = frozenset(form[0] for form in forms)
        longest = max(map(len, forms), default=0)
        found = {w: tuple(f) for w, f in candidates.items()}
        return cls(version, pattern, found, forms, starts, longest)

    def unfinished(self, text: str, start: int) -> int:
        """The first offset ``>= start`` from which the rest of *text* begins a form (or is one).

        The forms beginning with a text are contiguous in sorted order, starting at the first
        form not below it: one bisection per candidate offset.
        """
        forms = self.forms
        for at in range(max(start, len(text) - self.longest + 1), len(text)):
            if text[at] not in self.starts:
                continue
            rest = text[at:]
            i = bisect.bisect_left(forms, rest)
            if i < len(forms) and forms[i].startswith(rest):
                return at
        return len(text)

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """Merged ``(start, end, label)`` spans of every occurrence, in order."""
        if self.pattern is None:
            return []
        search = self.pattern.search
        candidates = self.candidates
        hits: list[tuple[int, int, str]] = []
        match = search(text)
        while match is not None:
            at = match.start()
            for form in candidates[match.group()]:
                start = at - form.offset
                if start >= 0 and text.startswith(form.text, start):
                    hits.append((start, start + len(form.text), form.label))
            match = search(text, at + 1)
        if len(hits) <= 1:
            return hits
        hits.sort(key=lambda h: (h[0], h[0] - h[1]))
        merged: list[tuple[int, int, str]] = []
        start, end, label = hits[0]
        longest = end - start
        for s, e, lab in hits[1:]:
            if s < end:
                if e - s > longest:
                    label, longest = lab, e - s
                end = max(end, e)
            else:
                merged.append((start, end, label))
                start, end, label, longest = s, e, lab, e - s
        merged.append((start, end, label))
        return merged


@final
class Redactor:
    """Replaces every registered secret, in every known form, in text and values.

    Build one per :class:`Secrets` registry and share it; it recompiles its pattern when the
    registry has changed since its last call. :meth:`redact` on text without secrets
    returns the same string. No marker contains a secret (such values are refused), so
    redacted text stays redacted when it is redacted again.
    """

    __slots__ = ("_lock", "_matcher", "secrets")

    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets
        self._lock = threading.Lock()
        self._matcher = _Matcher.build(-1, ())

    def _current(self) -> _Matcher:
        matcher = self._matcher
        if matcher.version != self.secrets.version:
            with self._lock:
                version, entries = self.secrets.snapshot()
                if self._matcher.version != version:
                    self._matcher = _Matcher.build(version, entries)
                matcher = self._matcher
        return matcher

    def redact(self, text: str) -> str:
        """Return ``text`` with each secret occurrence replaced by ``[REDACTED:<name>]``.

        Where secrets nest, the longest one is replaced; where occurrences overlap, their
        union is replaced by one marker (named for the longest), so no fragment survives.
        """
        spans = self._current().spans(text)
        if not spans:
            return text
        parts: list[str] = []
        position = 0
        for start, end, label in spans:
            parts.append(text[position:start])
            parts.append(label)
            position = end
        parts.append(text[position:])
        return "".join(parts)

    def ready(self, text: str) -> int:
        """How much of *text*, a stream's output so far, can be redacted and shown now.

        For text that arrives in pieces (a running cell's output): the rest may be the start
        of a secret whose end has not arrived yet, so it waits for more text (or for the
        stream's end, when all of it is redacted). The prefix up to the returned offset holds
        no part of an unfinished secret, and never ends inside a secret it contains: so
        ``redact(text[:n])`` shows no fragment of a secret. Without secrets, ``len(text)``.
        """
        matcher = self._current()
        if matcher.pattern is None:
            return len(text)
        cut = matcher.unfinished(text, 0)
        for start, end, _ in matcher.spans(text):
            if start < cut < end:  # a whole secret across the cut: show it (redacted) whole
                cut = matcher.unfinished(text, end)
        return cut

    def contains(self, text: str) -> bool:
        """True when ``text`` holds a registered secret in any known form."""
        return bool(self._current().spans(text))

    def redact_value(self, value: T) -> T:
        """Return a redacted copy of ``value``; the input is never modified.

        Recurses through ``str``, ``bytes``/``bytearray`` (as UTF-8, other bytes kept),
        lists, tuples (named tuples too), sets, dicts (keys and values), dataclass instances
        and pydantic models (copied without re-validation). Anything else is returned as is,
        and so is any part that holds no secret (not copied).

        Raises:
            UsageError: ``value`` contains a reference cycle.
        """
        return self._value(value, set())

    def _value(self, value: T, active: set[int]) -> T:
        if isinstance(value, str):
            redacted_text = self.redact(value)
            return value if redacted_text == value else redacted_text  # type: ignore[return-value]
        if isinstance(value, bytes | bytearray):
            decoded = bytes(value).decode("utf-8", "surrogateescape")
            redacted_bytes = self.redact(decoded)
            if redacted_bytes == decoded:
                return value
            encoded = redacted_bytes.encode("utf-8", "surrogateescape")
            return bytearray(encoded) if isinstance(value, bytearray) else encoded  # type: ignore[return-value]
        if id(value) in active:
            raise UsageError("cannot redact a value that contains itself")
        active.add(id(value))
        try:
            return self._container(value, active)
        finally:
            active.discard(id(value))

    def _container(self, value: T, active: set[int]) -> T:
        result: object = value
        if isinstance(value, BaseModel):
            update = {}
            fields = dict(value)
            for key, item in fields.items():
                new = self._value(item, active)
                if new is not item:
                    update[key] = new
            if update:
                result = value.model_copy(update=update)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {}
            for field in dataclasses.fields(value):
                item = getattr(value, field.name)
                new = self._value(item, active)
                if new is not item:
                    changes[field.name] = new
            if changes:
                result = copy.copy(value)
                for key, new in changes.items():
                    object.__setattr__(result, key, new)
        elif isinstance(value, Mapping):
            pairs = [(self._value(k, active), self._value(v, active)) for k, v in value.items()]
            if any(
                nk is not k or nv is not v
                for (nk, nv), (k, v) in zip(pairs, value.items(), strict=True)
            ):
                result = dict(pairs) if type(value) is dict else _rebuild_mapping(value, pairs)
        elif isinstance(value, list | tuple | set | frozenset):
            items = [self._value(item, active) for item in value]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                result = _rebuild(value, items)
        return result  # type: ignore[return-value]  # a copy of value's type (or the plain fallback)


def _rebuild(value: object, items: list[object]) -> object:
    """A container of ``value``'s type holding ``items`` (a plain one if that fails)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return _new_like(value, *items)
    try:
        return _new_like(value, items)
    except TypeError:
        return tuple(items) if isinstance(value, tuple) else list(items)


def _rebuild_mapping(value: Mapping[object, object], pairs: list[tuple[object, object]]) -> object:
    """A mapping of ``value``'s type holding ``pairs`` (a dict if that fails)."""
    try:
        return _new_like(value, pairs)
    except TypeError:
        return dict(pairs)


def _new_like(value: object, *args: object) -> object:
    """An instance of ``value``'s class built from *args* (TypeError when it refuses them)."""
    kind: Callable[..., object] = type(value)  # type: ignore[explicit-any]  # any class's constructor
    return kind(*args)
