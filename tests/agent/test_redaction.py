"""Secret redaction: registry rules, encoded forms, nesting, overlaps, speed."""

from __future__ import annotations

import base64
import json
import random
import string
import time
import urllib.parse
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sunroom.agent.redaction import Redactor, Secrets
from sunroom.errors import UsageError
from sunroom.providers import AssistantMessage, TextPart, ToolCall, ToolResultMessage

KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c"
PASSWORD = "correct horse/battery+staple?é"


def redactor() -> Redactor:
    return Redactor(Secrets({"api_key": KEY, "db_password": PASSWORD}))


def leaks(text: str) -> bool:
    return KEY in text or PASSWORD in text


# --- the registry ---------------------------------------------------------------------------


def test_short_values_are_refused() -> None:
    secrets = Secrets()
    for value in ("", "a", "abc"):
        with pytest.raises(UsageError, match="at least 4"):
            secrets.add(value, name="short")
    secrets.add("abcd")
    assert len(secrets) == 1


@pytest.mark.parametrize("name", ["", "has space", "br]acket", "x" * 65, "new\nline"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="secret name"):
        Secrets().add("a-long-value", name=name)


def test_values_must_be_text() -> None:
    with pytest.raises(UsageError, match="must be a str"):
        Secrets().add(b"bytes-value")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not valid Unicode"):
        Secrets().add("lone \udc80 surrogate")


def test_duplicate_value_same_name_is_a_no_op_other_name_is_refused() -> None:
    secrets = Secrets({"a": "value-1234"})
    version = secrets.version
    secrets.add("value-1234", name="a")
    assert secrets.version == version
    with pytest.raises(UsageError, match="already registered as 'a'"):
        secrets.add("value-1234", name="b")


def test_values_inside_a_marker_are_refused() -> None:
    with pytest.raises(UsageError, match="inside a redaction marker"):
        Secrets().add("REDACTED")
    with pytest.raises(UsageError, match="inside a redaction marker"):
        Secrets().add("ACTED:tok", name="token")
    secrets = Secrets(["mytoken"])
    with pytest.raises(UsageError, match="would contain a registered secret"):
        secrets.add("another-value", name="mytoken")


def test_repr_never_shows_values() -> None:
    secrets = Secrets({"api_key": KEY})
    secrets.add("unnamed-value")
    for text in (repr(secrets), str(secrets), repr(Redactor(secrets))):
        assert KEY not in text and "unnamed-value" not in text
    assert repr(secrets) == "Secrets(2 values: api_key, <unnamed>)"
    assert KEY in secrets
    assert secrets.names() == ("api_key", None)


def test_redactor_follows_registry_changes() -> None:
    secrets = Secrets()
    r = Redactor(secrets)
    assert r.redact("token tok-12345") == "token tok-12345"
    secrets.add("tok-12345", name="tok")
    assert r.redact("token tok-12345") == "token [REDACTED:tok]"
    secrets.add("other-999")
    assert r.redact("tok-12345 other-999") == "[REDACTED:tok] [REDACTED]"


# --- text -----------------------------------------------------------------------------------


def test_every_occurrence_is_replaced_and_clean_text_is_returned_as_is() -> None:
    r = redactor()
    text = f"{KEY}{KEY} then {PASSWORD}\n{KEY}"
    assert r.redact(text) == (
        "[REDACTED:api_key][REDACTED:api_key] then [REDACTED:db_password]\n[REDACTED:api_key]"
    )
    clean = "nothing to see " * 100
    assert r.redact(clean) is clean
    assert not r.contains(clean)
    assert r.contains(f"x{KEY}x")
    assert Redactor(Secrets()).redact(text) == text


@pytest.mark.parametrize("value", [KEY, PASSWORD, "abcde", "ab\ncd", "日本語のひみつ"])
def test_base64_forms_at_every_alignment(value: str) -> None:
    r = Redactor(Secrets({"s": value}))
    data = value.encode()
    for prefix in (b"", b"u", b"us", b"user:", b"longer prefix:"):
        for suffix in (b"", b"!", b"!!", b"@host"):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                blob = encode(prefix + data + suffix).decode()
                redacted = r.redact(f"header {blob} trailer")
                assert "[REDACTED:s]" in redacted, (prefix, suffix, blob)
                leftover = redacted.replace("header ", "").replace(" trailer", "")
                # Decoding what is left around the marker never yields the secret.
                for part in leftover.split("[REDACTED:s]"):
                    padded = part + "=" * (-len(part) % 4)
                    try:
                        decoded = base64.b64decode(padded, altchars=b"-_")
                    except ValueError:
                        continue
                    assert data not in decoded
    unpadded = base64.b64encode(data).decode().rstrip("=")
    assert r.redact(f"jwt.{unpadded}.sig") == "jwt.[REDACTED:s].sig"


def test_base64_of_a_four_character_secret_is_caught_when_encoded_alone() -> None:
    # Inside a longer blob a 4-byte value spans too few whole base64 characters to be told
    # from ordinary text; encoded on its own it is caught.
    r = Redactor(Secrets({"s": "abcd"}))
    assert r.redact("x YWJjZA== y YWJjZA z") == "x [REDACTED:s] y [REDACTED:s] z"


def test_url_encoded_forms() -> None:
    r = redactor()
    for quoted in (
        urllib.parse.quote(PASSWORD, safe=""),
        urllib.parse.quote(PASSWORD),
        urllib.parse.quote_plus(PASSWORD),
        urllib.parse.quote(PASSWORD, safe="").lower(),
    ):
        assert quoted != PASSWORD
        url = f"https://db.example/?user=app&password={quoted}&x=1"
        assert r.redact(url) == "https://db.example/?user=app&password=[REDACTED:db_password]&x=1"
    query = urllib.parse.urlencode({"key": KEY, "pw": PASSWORD})
    assert not leaks(urllib.parse.unquote_plus(r.redact(query)))


def test_json_and_python_escaped_forms() -> None:
    value = 'quote" back\\slash\ttab/é'
    r = Redactor(Secrets({"s": value}))
    for dumped in (
        json.dumps({"k": value}),
        json.dumps({"k": value}, ensure_ascii=False),
        json.dumps({"k": value}).replace("/", "\\/"),
        repr({"k": value}),
    ):
        redacted = r.redact(dumped)
        assert "[REDACTED:s]" in redacted, dumped
        assert value not in redacted
    assert json.loads(r.redact(json.dumps({"k": value}))) == {"k": "[REDACTED:s]"}


def test_nested_secrets_longest_wins() -> None:
    r = Redactor(Secrets({"inner": "abc123", "outer": "xx-abc123-yy"}))
    assert r.redact("xx-abc123-yy and abc123") == "[REDACTED:outer] and [REDACTED:inner]"


def test_overlapping_secrets_leave_no_fragment() -> None:
    r = Redactor(Secrets({"left": "alpha-beta", "right": "beta-gamma"}))
    # The occurrences share "beta": their union is replaced, labelled with the longer one.
    assert r.redact("<alpha-beta-gamma>") == "<[REDACTED:left]>"
    r2 = Redactor(Secrets({"left": "alpha-beta", "right": "beta-gamma-delta"}))
    assert r2.redact("<alpha-beta-gamma-delta>") == "<[REDACTED:right]>"
    # Adjacent (not overlapping) occurrences keep their own markers.
    assert r.redact("alpha-betabeta-gamma") == "[REDACTED:left][REDACTED:right]"


def test_redacting_twice_changes_nothing() -> None:
    r = redactor()
    once = r.redact(f"{KEY} {base64.b64encode(KEY.encode()).decode()} {PASSWORD}")
    assert r.redact(once) == once


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    payload: bytes
    score: float


class Report(BaseModel):
    title: str
    rows: list[Row]
    meta: dict[str, object]


Pair = namedtuple("Pair", "left right")


def test_planted_secrets_in_nested_tool_output() -> None:
    r = redactor()
    output = {
        "status": "ok",
        "results": [
            {"stdout": f"connecting with {KEY}\n", "exit": 0},
            (1, 2.5, None, f"pw={urllib.parse.quote(PASSWORD)}"),
            {f"key:{KEY}", "plain"},
            frozenset({PASSWORD}),
            Pair(left=KEY.encode(), right=bytearray(PASSWORD.encode() + b"\xff\xfe")),
        ],
        "report": Report(
            title=f"creds {PASSWORD}",
            rows=[Row(label=KEY, payload=b"raw " + KEY.encode(), score=1.0)],
            meta={"nested": [[{"deep": base64.b64encode(KEY.encode()).decode()}]]},
        ),
        "message": AssistantMessage(
            [
                TextPart(f"I will use {KEY}"),
                ToolCall("c1", "execute_code", {"code": f"login({PASSWORD!r})"}),
            ]
        ),
        "result": ToolResultMessage("c1", f"Traceback: bad password {PASSWORD}", is_error=True),
        "ordered": OrderedDict(k=KEY),
        "proxy": MappingProxyType({"k": KEY}),
    }
    before = repr(output)
    redacted = r.redact_value(output)
    assert repr(output) == before  # the input is untouched
    text = repr(redacted)
    assert not leaks(text)
    assert KEY.encode() not in text.encode()
    assert "[REDACTED:api_key]" in text and "[REDACTED:db_password]" in text
    # Types are kept.
    results = redacted["results"]
    assert isinstance(results, list)
    assert isinstance(results[1], tuple) and results[1][:3] == (1, 2.5, None)
    assert isinstance(results[4], Pair) and isinstance(results[4].right, bytearray)
    assert results[4].right.endswith(b"\xff\xfe")
    report = redacted["report"]
    assert isinstance(report, Report) and isinstance(report.rows[0], Row)
    assert report.rows[0].payload == b"raw [REDACTED:api_key]"
    message = redacted["message"]
    assert isinstance(message, AssistantMessage)
    assert message.tool_calls[0].arguments == {"code": "login('[REDACTED:db_password]')"}
    result = redacted["result"]
    assert isinstance(result, ToolResultMessage)
    assert result.is_error and result.tool_call_id == "c1"
    assert isinstance(redacted["ordered"], OrderedDict)
    assert redacted["proxy"] == {"k": "[REDACTED:api_key]"}


def test_values_without_secrets_are_returned_as_is() -> None:
    r = redactor()
    value = {"a": [1, "two", (3.0, b"four")], "b": Row("x", b"y", 0.0)}
    assert r.redact_value(value) is value
    assert r.redact_value(42) == 42


def test_cycles_are_refused() -> None:
    cyclic: list[object] = ["x"]
    cyclic.append(cyclic)
    with pytest.raises(UsageError, match="contains itself"):
        redactor().redact_value(cyclic)
    shared = ["x"]
    assert redactor().redact_value([shared, shared]) == [["x"], ["x"]]  # sharing is no cycle


_SECRET_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "-_/+=%", min_size=4)


@settings(max_examples=60, deadline=None)
@given(
    secrets=st.lists(_SECRET_TEXT, min_size=1, max_size=5, unique=True),
    filler=st.lists(st.text(max_size=20), min_size=1, max_size=8),
)
def test_property_no_secret_survives_and_redaction_is_idempotent(
    secrets: list[str], filler: list[str]
) -> None:
    registry = Secrets()
    for value in secrets:
        try:
            registry.add(value)
        except UsageError:  # a value inside "[REDACTED]" (e.g. "DACT")
            continue
    r = Redactor(registry)
    registered = [v for v in secrets if v in registry]
    text = (
        "".join(f + registered[i % len(registered)] for i, f in enumerate(filler))
        if registered
        else "".join(filler)
    )
    once = r.redact(text)
    for value in registered:
        assert value not in once
    assert r.redact(once) == once


# --- speed ----------------------------------------------------------------------------------

PROSE = (
    "the of and to in is that it was for on are as with his they at be this have from "
    "or one had by word but not what all were when we there can an your which their said "
    "if do will each about how up out them then she many some so these would other into"
)


def test_five_megabytes_with_one_hundred_secrets_is_fast() -> None:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(16, 40))) for _ in range(100)]
    r = Redactor(Secrets({f"s{i}": v for i, v in enumerate(values)}))
    words = PROSE.split()
    chunks: list[str] = []
    size = 0
    planted = 0
    while size < 5_000_000:
        chunk = " ".join(rng.choice(words) for _ in range(2_000))
        if planted < 100:
            value = values[planted]
            form = value if planted % 2 else base64.b64encode(value.encode()).decode()
            chunk += f' "token": "{form}", '
            planted += 1
        chunks.append(chunk)
        size += len(chunk)
    text = "".join(chunks)
    megabytes = len(text) / 1_000_000
    r.redact("warm up: compile the pattern")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        redacted = r.redact(text)
        best = min(best, time.perf_counter() - start)
    assert redacted.count("[REDACTED:") == 100
    assert not any(v in redacted for v in values)
    # About 3 ms per MB on a quiet core; the bound leaves room for a busy CI machine.
    assert best / megabytes < 0.025, f"{best / megabytes * 1000:.1f} ms per MB"


def _streamed(r: Redactor, pieces: list[str]) -> list[str]:
    """What a stream of *pieces* shows: at each piece what ``ready`` allows, the rest at the end."""
    shown: list[str] = []
    held = ""
    for piece in pieces:
        held += piece
        n = r.ready(held)
        shown.append(r.redact(held[:n]))
        held = held[n:]
    shown.append(r.redact(held))
    return shown


_FORMS = [
    KEY,
    PASSWORD,
    base64.b64encode(KEY.encode()).decode(),
    urllib.parse.quote(PASSWORD, safe=""),
    json.dumps(PASSWORD)[1:-1],
]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_FORMS) | st.text(alphabet="ab =\n%", max_size=6), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_text_streamed_in_pieces_shows_no_fragment_of_a_secret(
    parts: list[str], cuts: list[int]
) -> None:
    r = redactor()
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    shown = _streamed(r, pieces)
    assert "".join(shown) == r.redact(text)
    for piece in shown:
        for form in _FORMS:
            assert form[:6] not in piece.replace("[REDACTED:api_key]", "").replace(
                "[REDACTED:db_password]", ""
            )


def test_ready_holds_only_what_may_begin_a_secret() -> None:
    r = redactor()
    assert r.ready("plain output\n") == len("plain output\n")
    assert r.ready(f"key {KEY[:5]}") == len("key ")
    assert r.ready(f"key {KEY} done\n") == len(f"key {KEY} done\n")
    assert Redactor(Secrets()).ready("anything sk-") == len("anything sk-")
