"""A kernel's network policy: which hosts it may reach, what the proxy adds, and its limits.

``Network`` is the one value the caller writes. It is validated and normalized when it is
built (a bad entry is a :class:`~sunroom.errors.UsageError` naming the entry, never an injected
header's value) and answers the two questions the egress proxy asks: may this ``host:port`` be
reached (:meth:`Network.allows`), and which headers go with a request to it
(:meth:`Network.headers_for`).
"""

from __future__ import annotations

import ipaddress
import math
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sunroom.errors import UsageError

__all__ = [
    "DEFAULT_PORTS",
    "Network",
    "is_ip",
    "network_schema",
    "normalize_host",
    "parse_pattern",
]

DEFAULT_PORTS: frozenset[int] = frozenset({80, 443})
"""The ports a pattern without a port allows."""

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_FRAMING = frozenset({"host", "content-length", "expect"})
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def normalize_host(host: str) -> str:
    """The canonical form of a host name or IP literal, or ``UsageError`` if it is neither.

    Case-folded, trailing dot stripped, internationalized names in their IDNA (``xn--``)
    form; an IP literal (IPv6 with or without brackets) in its compressed form.
    """
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        pass
    name = text.rstrip(".") if text.endswith(".") and not text.endswith("..") else text
    try:
        ascii_name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise UsageError(f"{host!r} is not a valid host name.") from None
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise UsageError(f"{host!r} is not a valid host name.")
    if labels[-1].isdigit():
        raise UsageError(f"{host!r} is not a valid host name or IP address.")
    return ascii_name


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{entry!r} has an invalid port (1-65535).")
    return int(text)


def parse_pattern(entry: str) -> tuple[str, bool, frozenset[int]]:
    """Split an allowlist or ``inject`` entry into (host, is_wildcard, ports).

    ``*.example.com`` is a wildcard over every subdomain of ``example.com`` (any depth, not the
    name itself); a pattern without ``:port`` allows ports 80 and 443 only. IP literals are
    exact: ``10.0.0.5``, ``10.0.0.5:80``, ``::1``, ``[::1]:80``.
    """
    if not isinstance(entry, str) or not entry.strip():
        raise UsageError(f"{entry!r} is not a host pattern (a non-empty string).")
    text = entry.strip()
    ports = DEFAULT_PORTS
    if text.startswith("["):
        close = text.find("]")
        rest = text[close + 1 :]
        if close < 0 or (rest and not rest.startswith(":")):
            raise UsageError(f"{entry!r} is not a valid host pattern.")
        if rest:
            ports = frozenset({_port(rest[1:], entry)})
        text = text[: close + 1]
    elif text.count(":") == 1:
        text, port_text = text.split(":")
        ports = frozenset({_port(port_text, entry)})
    wildcard = text.startswith("*.")
    if wildcard:
        text = text[2:]
    if "*" in text:
        raise UsageError(f"{entry!r}: a wildcard may only be a leading '*.'.")
    try:
        host = normalize_host(text)
    except UsageError:
        raise UsageError(f"{entry!r} is not a valid host pattern.") from None
    if wildcard and is_ip(host):
        raise UsageError(f"{entry!r}: an IP address cannot take a wildcard.")
    if wildcard and "." not in host:
        raise UsageError(f"{entry!r}: a wildcard must name a domain with a dot (not a TLD).")
    return host, wildcard, ports


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IP literal (without brackets)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _render(host: str, wildcard: bool, ports: frozenset[int]) -> str:
    shown = f"[{host}]" if ":" in host else host
    shown = f"*.{shown}" if wildcard else shown
    return shown if ports == DEFAULT_PORTS else f"{shown}:{next(iter(ports))}"


class _Matcher:
    """Exact names in a dict, wildcards in a dict keyed by suffix: O(labels) per lookup."""

    __slots__ = ("exact", "suffixes")

    def __init__(self) -> None:
        self.exact: dict[str, set[int]] = {}
        self.suffixes: dict[str, set[int]] = {}

    def add(self, host: str, wildcard: bool, ports: frozenset[int]) -> None:
        table = self.suffixes if wildcard else self.exact
        table.setdefault(host, set()).update(ports)

    def keys_for(self, host: str, port: int) -> list[tuple[str, bool]]:
        """The (host, wildcard) keys that match, least specific first."""
        found: list[tuple[str, bool]] = []
        if not is_ip(host):
            labels = host.split(".")
            for start in range(len(labels) - 1, 0, -1):
                suffix = ".".join(labels[start:])
                if port in self.suffixes.get(suffix, ()):
                    found.append((suffix, True))
        if port in self.exact.get(host, ()):
            found.append((host, False))
        return found


def _header(name: object, value: object, key: str) -> tuple[str, str]:
    if not isinstance(name, str) or not _TOKEN.match(name):
        raise UsageError(f"inject[{key!r}] has an invalid header name {name!r}.")
    lowered = name.lower()
    if lowered in _HOP_BY_HOP or lowered in _FRAMING:
        raise UsageError(f"inject[{key!r}] may not set the {name} header.")
    if not isinstance(value, str) or _BAD_VALUE.search(value) or not _latin1(value):
        # never echo the value: it is a secret
        raise UsageError(
            f"inject[{key!r}] header {name} has an invalid value (a Latin-1 string without CR, "
            "LF or other control characters)."
        )
    return name, value


def _latin1(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{name} must be a number of seconds.")
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} must be a positive, finite number of seconds.")
    return float(value)


def _strings(value: object, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be a list of strings.")
    return tuple(value)


@dataclass(frozen=True, kw_only=True, eq=False)
class Network:
    """What a kernel may reach through its egress proxy; the default reaches nothing.

    ``allow`` lists host patterns: ``pypi.org`` (that name), ``*.example.com`` (every
    subdomain at any depth, not ``example.com`` itself), with an optional ``:port``; **a
    pattern without a port allows ports 80 and 443 only**. An IP literal (``10.0.0.5``,
    ``[::1]:80``) is reached only if listed exactly. Matching is case-insensitive, ignores a
    trailing dot and compares internationalized names in IDNA form. There is no cap on the
    number of entries (lookups cost one dict probe per label).

    ``inject`` maps a host pattern (which some ``allow`` entry must cover) to headers the proxy
    sets on each request to that host, replacing any the kernel sent with the same name. They
    are secrets: never shown by ``repr`` or in any message. Plain HTTP gets them always; TLS
    only with ``tls="terminate"`` (the proxy then decrypts traffic to those hosts with a
    per-kernel CA the kernel trusts); with ``"passthrough"`` a CONNECT to such a host is refused.

    Lists and dicts are accepted and stored as tuples and read-only mappings.
    Names resolve on the host, once per connection; every address must be global unless it is
    inside ``allow_addresses`` (CIDRs); ``hosts`` maps names to fixed IPs like /etc/hosts.
    ``ca_file`` adds CAs the proxy trusts for upstream TLS in terminate mode. ``max_bytes``
    caps the bytes relayed in both directions over all connections; ``max_connections``
    caps concurrent connections; ``connect_timeout_s`` covers resolution and TCP connect;
    ``idle_timeout_s`` ends a connection with no bytes either way for that long.
    """

    allow: Sequence[str] = ()
    inject: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tls: Literal["passthrough", "terminate"] = "passthrough"
    allow_addresses: Sequence[str] = ()
    hosts: Mapping[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    max_bytes: int | None = None
    max_connections: int = 64
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    _allowed: _Matcher = field(init=False, repr=False, compare=False)
    _injected: _Matcher = field(init=False, repr=False, compare=False)
    _inject_index: Mapping[tuple[str, bool, int], Mapping[str, str]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        allowed = _Matcher()
        canonical: list[str] = []
        for entry in _strings(self.allow, "allow"):
            host, wildcard, ports = parse_pattern(entry)
            allowed.add(host, wildcard, ports)
            canonical.append(_render(host, wildcard, ports))
        set_(self, "allow", tuple(canonical))
        set_(self, "_allowed", allowed)
        set_(self, "inject", self._normalize_inject(allowed))
        if self.tls not in ("passthrough", "terminate"):
            raise UsageError(f"tls must be 'passthrough' or 'terminate', not {self.tls!r}.")
        nets: list[str] = []
        for cidr in _strings(self.allow_addresses, "allow_addresses"):
            try:
                nets.append(str(ipaddress.ip_network(str(cidr).strip(), strict=True)))
            except ValueError:
                raise UsageError(f"allow_addresses entry {cidr!r} is not an IP or CIDR.") from None
        set_(self, "allow_addresses", tuple(nets))
        set_(self, "hosts", self._normalize_hosts())
        if self.ca_file is not None and not isinstance(self.ca_file, str):
            raise UsageError("ca_file must be a path string or None.")
        if self.max_bytes is not None and (
            isinstance(self.max_bytes, bool)
            or not isinstance(self.max_bytes, int)
            or self.max_bytes < 0
        ):
            raise UsageError("max_bytes must be a non-negative integer or None.")
        if (
            isinstance(self.max_connections, bool)
            or not isinstance(self.max_connections, int)
            or self.max_connections < 1
        ):
            raise UsageError("max_connections must be a positive integer.")
        set_(self, "connect_timeout_s", _seconds(self.connect_timeout_s, "connect_timeout_s"))
        set_(self, "idle_timeout_s", _seconds(self.idle_timeout_s, "idle_timeout_s"))

    def _normalize_inject(self, allowed: _Matcher) -> Mapping[str, Mapping[str, str]]:
        if not isinstance(self.inject, Mapping):
            raise UsageError("inject must map host patterns to header mappings.")
        injected = _Matcher()
        index: dict[tuple[str, bool, int], Mapping[str, str]] = {}
        out: dict[str, Mapping[str, str]] = {}
        for key, headers in self.inject.items():
            host, wildcard, ports = parse_pattern(key)
            # a wildcard key is covered by wildcards only: those matching any name under it
            covered = all(
                any(w for _, w in allowed.keys_for(f"x.{host}", port))
                if wildcard
                else allowed.keys_for(host, port)
                for port in ports
            )
            if not covered:
                raise UsageError(f"inject key {key!r} is not covered by any allow entry.")
            if not isinstance(headers, Mapping) or not headers:
                raise UsageError(f"inject[{key!r}] must be a non-empty mapping of headers.")
            pairs = dict(_header(name, value, key) for name, value in headers.items())
            if len({name.lower() for name in pairs}) != len(pairs):
                raise UsageError(f"inject[{key!r}] names a header twice (case-insensitively).")
            canonical = _render(host, wildcard, ports)
            if canonical in out:
                raise UsageError(f"inject names {canonical!r} twice.")
            injected.add(host, wildcard, ports)
            out[canonical] = types.MappingProxyType(pairs)
            for port in ports:
                index[(host, wildcard, port)] = out[canonical]
        object.__setattr__(self, "_injected", injected)
        object.__setattr__(self, "_inject_index", index)
        return types.MappingProxyType(out)

    def _normalize_hosts(self) -> Mapping[str, str]:
        if not isinstance(self.hosts, Mapping):
            raise UsageError("hosts must map host names to IP addresses.")
        out: dict[str, str] = {}
        for name, ip in self.hosts.items():
            key = normalize_host(str(name))
            try:
                out[key] = ipaddress.ip_address(str(ip).strip()).compressed
            except ValueError:
                raise UsageError(f"hosts[{name!r}] is not an IP address.") from None
        return types.MappingProxyType(out)

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is on the allowlist (no resolution; see the class doc)."""
        try:
            name = normalize_host(host)
        except UsageError:
            return False
        return bool(self._allowed.keys_for(name, port))

    def headers_for(self, host: str, port: int) -> dict[str, str]:
        """The headers to inject for ``host:port`` (a new dict; empty if none apply).

        When several entries match, the more specific wins per header name: an exact name over
        wildcards, a longer wildcard suffix over a shorter one.
        """
        try:
            name = normalize_host(host)
        except UsageError:
            return {}
        merged: dict[str, tuple[str, str]] = {}
        for key_host, wildcard in self._injected.keys_for(name, port):
            headers = self._inject_index[(key_host, wildcard, port)]
            merged.update({n.lower(): (n, v) for n, v in headers.items()})
        return dict(merged.values())

    def address_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """``allow_addresses`` as network objects."""
        return tuple(ipaddress.ip_network(n) for n in self.allow_addresses)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_json` reads back; it holds the injected values."""
        return {
            "allow": list(self.allow),
            "inject": {k: dict(v) for k, v in self.inject.items()},
            "tls": self.tls,
            "allow_addresses": list(self.allow_addresses),
            "hosts": dict(self.hosts),
            "ca_file": self.ca_file,
            "max_bytes": self.max_bytes,
            "max_connections": self.max_connections,
            "connect_timeout_s": self.connect_timeout_s,
            "idle_timeout_s": self.idle_timeout_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Network:
        """A policy from :meth:`to_json`'s shape; unknown keys are a ``UsageError``."""
        if not isinstance(data, Mapping):
            raise UsageError("a network policy must be a JSON object.")
        known = set(network_schema()["properties"])
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise UsageError(f"unknown network policy field(s): {', '.join(unknown)}.")
        return cls(**dict(data))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Network):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.allow, self.tls, self.allow_addresses, self.max_bytes))

    def __repr__(self) -> str:
        masked = {k: dict.fromkeys(v, "***") for k, v in self.inject.items()}
        return (
            f"Network(allow={self.allow!r}, inject={masked!r}, tls={self.tls!r}, "
            f"allow_addresses={self.allow_addresses!r}, hosts={dict(self.hosts)!r}, "
            f"ca_file={self.ca_file!r}, max_bytes={self.max_bytes!r}, "
            f"max_connections={self.max_connections!r}, "
            f"connect_timeout_s={self.connect_timeout_s!r}, "
            f"idle_timeout_s={self.idle_timeout_s!r})"
        )

    __str__ = __repr__


def network_schema() -> dict[str, Any]:
    """The JSON Schema of :meth:`Network.to_json` (for the service's edge model)."""
    strings = {"type": "array", "items": {"type": "string", "minLength": 1}}
    return {
        "title": "Network",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "allow": strings,
            "inject": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": {"type": "string"},
                },
            },
            "tls": {"enum": ["passthrough", "terminate"], "default": "passthrough"},
            "allow_addresses": strings,
            "hosts": {"type": "object", "additionalProperties": {"type": "string"}},
            "ca_file": {"type": ["string", "null"], "default": None},
            "max_bytes": {"type": ["integer", "null"], "minimum": 0, "default": None},
            "max_connections": {"type": "integer", "minimum": 1, "default": 64},
            "connect_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 10.0},
            "idle_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 300.0},
        },
    }
