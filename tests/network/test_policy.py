"""Network: validation, normalization, matching, JSON, and the secret never shown."""

from __future__ import annotations

import time
from typing import Any

import jsonschema
import pytest

from sunroom.errors import UsageError
from sunroom.network import Network, network_schema

SECRET = "Bearer sk-very-secret-value"


def test_exact_names_default_ports_and_explicit_ports() -> None:
    n = Network(allow=["PyPI.org.", "files.test:8443"])
    assert n.allow == ("pypi.org", "files.test:8443")
    assert n.allows("pypi.org", 443) and n.allows("PYPI.ORG.", 80)
    assert not n.allows("pypi.org", 8080)
    assert n.allows("files.test", 8443) and not n.allows("files.test", 443)
    assert not n.allows("sub.pypi.org", 443)


def test_wildcards_match_subdomains_at_any_depth_not_the_name() -> None:
    n = Network(allow=["*.example.com", "*.x.test:8443"])
    assert n.allows("a.example.com", 443) and n.allows("a.b.c.example.com", 80)
    assert not n.allows("example.com", 443)
    assert not n.allows("badexample.com", 443)
    assert not n.allows("example.com.evil.org", 443)
    assert n.allows("y.x.test", 8443) and not n.allows("y.x.test", 443)


def test_idna_names_compare_in_their_ascii_form() -> None:
    n = Network(allow=["bücher.test"])
    assert n.allow == ("xn--bcher-kva.test",)
    assert n.allows("BÜCHER.test", 443) and n.allows("xn--bcher-kva.test", 443)


def test_ip_literals_only_when_listed_exactly() -> None:
    n = Network(allow=["10.0.0.5", "[::1]:80", "*.example.com"])
    assert n.allows("10.0.0.5", 443) and not n.allows("10.0.0.6", 443)
    assert n.allows("::1", 80) and n.allows("[0:0::1]", 80) and not n.allows("::1", 443)
    assert not Network(allow=["*.example.com"]).allows("1.2.3.4", 443)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "a..b",
        "*.com",
        "*.1.2.3.4",
        "a*.b.com",
        "host:0",
        "host:70000",
        "host:x",
        "-a.com",
        "[::1",
        "a b.com",
    ],
)
def test_bad_patterns_are_usage_errors(entry: str) -> None:
    with pytest.raises(UsageError):
        Network(allow=[entry])


def test_bad_fields_are_usage_errors() -> None:
    kwargs: dict[str, Any]
    for kwargs in (
        {"tls": "sometimes"},
        {"allow_addresses": ["10.0.0.1/8"]},
        {"allow_addresses": ["nope"]},
        {"hosts": {"a.test": "not-an-ip"}},
        {"max_bytes": -1},
        {"max_connections": 0},
        {"connect_timeout_s": 0},
        {"idle_timeout_s": float("inf")},
        {"allow": "pypi.org"},
    ):
        with pytest.raises(UsageError):
            Network(**kwargs)


def test_inject_must_be_covered_and_well_formed_and_never_shown() -> None:
    with pytest.raises(UsageError, match="not covered"):
        Network(allow=["a.test"], inject={"b.test": {"Authorization": SECRET}})
    with pytest.raises(UsageError, match="not covered"):
        Network(allow=["a.test:443"], inject={"a.test": {"Authorization": SECRET}})  # 80 too
    with pytest.raises(UsageError, match="not covered"):
        Network(allow=["a.test"], inject={"*.a.test": {"Authorization": SECRET}})
    Network(allow=["*.corp.test"], inject={"*.a.corp.test": {"X": "1"}})
    for headers in (
        {"Authorization": SECRET + "\r\nX-Evil: 1"},
        {"Authorization": SECRET + "\n"},
        {"Bad Name": SECRET},
        {"Host": SECRET},
        {"Content-Length": "1"},
        {"Authorization": SECRET + "€"},
    ):
        with pytest.raises(UsageError) as info:
            Network(allow=["a.test"], inject={"a.test": headers})
        assert SECRET not in str(info.value)
    n = Network(allow=["a.test"], inject={"a.test": {"Authorization": SECRET}})
    assert SECRET not in repr(n) and SECRET not in str(n) and "***" in repr(n)


def test_headers_for_prefers_the_more_specific_entry() -> None:
    n = Network(
        allow=["*.corp.test", "api.b.corp.test"],
        inject={
            "*.corp.test": {"X-Key": "wide", "X-Other": "o"},
            "*.b.corp.test": {"X-Key": "mid"},
            "api.b.corp.test": {"x-key": "exact"},
        },
    )
    assert n.headers_for("api.b.corp.test", 443) == {"x-key": "exact", "X-Other": "o"}
    assert n.headers_for("c.b.corp.test", 443) == {"X-Key": "mid", "X-Other": "o"}
    assert n.headers_for("c.corp.test", 80) == {"X-Key": "wide", "X-Other": "o"}
    assert n.headers_for("c.corp.test", 8080) == {}
    assert n.headers_for("other.org", 443) == {}


def test_json_round_trip_matches_the_schema() -> None:
    n = Network(
        allow=["a.test", "*.b.test:8443"],
        inject={"a.test": {"Authorization": SECRET}},
        tls="terminate",
        allow_addresses=["127.0.0.0/8"],
        hosts={"a.test": "127.0.0.1"},
        max_bytes=10,
        max_connections=3,
        connect_timeout_s=2,
        idle_timeout_s=5,
    )
    data = n.to_json()
    jsonschema.validate(data, network_schema())
    assert Network.from_json(data) == n
    with pytest.raises(UsageError, match="unknown"):
        Network.from_json({"allow": [], "allowed": []})


def test_a_100k_entry_allowlist_builds_and_matches_fast() -> None:
    names = [f"host{i}.example{i % 97}.test" for i in range(50_000)]
    wild = [f"*.zone{i}.test" for i in range(50_000)]
    started = time.perf_counter()
    n = Network(allow=names + wild)
    built = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(0, 50_000, 5):
        assert n.allows(f"host{i}.example{i % 97}.test", 443)
        assert n.allows(f"a.b.zone{i}.test", 443)
        assert not n.allows(f"zone{i}.test", 443)
    per_lookup = (time.perf_counter() - started) / 30_000
    assert built < 10.0, built
    assert per_lookup < 100e-6, per_lookup
