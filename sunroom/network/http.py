"""HTTP pieces of the egress proxy: request targets, forwarded headers, refusal responses.

Parsing is h11's; this module only reads the parts h11 hands over (a request target, header
lists) and writes the short ``text/plain`` answers the proxy refuses with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from http import HTTPStatus
from urllib.parse import urlsplit

from sunroom.errors import UsageError
from sunroom.network.policy import normalize_host

__all__ = [
    "BadTarget",
    "absolute_target",
    "authority",
    "check_framing",
    "error_response",
    "forward_headers",
]

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


class BadTarget(Exception):
    """The request cannot be forwarded as it is: its target, its Host header or its framing.

    ``str()`` is safe to send back.
    """


def authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` or ``[v6]:port`` as a normalized (host, port).

    Without a port, ``default_port`` is used (``None``: the port is required, as in CONNECT).
    """
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise BadTarget("an IPv6 address lacks its closing bracket")
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise BadTarget("junk follows the IPv6 address")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        raise BadTarget("an IPv6 address must be in brackets")
    else:
        host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise BadTarget("the target has no port")
        port = default_port
    elif port_text.isdigit() and 1 <= int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise BadTarget("the port is not a number from 1 to 65535")
    try:
        return normalize_host(host), port
    except UsageError:
        raise BadTarget("the host is not a valid name or IP address") from None


def absolute_target(target: str) -> tuple[str, int, str]:
    """An absolute-form ``http://host[:port]/path?query`` as (host, port, origin-form target)."""
    if target.startswith("/") or target == "*":
        raise BadTarget("a proxy needs an absolute URI (http://host/path) as the request target")
    parts = urlsplit(target)
    if parts.scheme.lower() != "http":
        raise BadTarget("only http:// URIs are forwarded (use CONNECT for https)")
    if "@" in parts.netloc:
        raise BadTarget("credentials in the URI are not forwarded")
    host, port = authority(parts.netloc, default_port=80)
    origin = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return host, port, origin


def host_header(headers: Iterable[tuple[bytes, bytes]], *, default_port: int) -> tuple[str, int]:
    """The one Host header as a normalized (host, port)."""
    values = [value for name, value in headers if name == b"host"]
    if len(values) != 1:
        raise BadTarget("the request must have exactly one Host header")
    return authority(values[0].decode("latin-1"), default_port=default_port)


def check_framing(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Refuse (BadTarget) a request with both ``Transfer-Encoding`` and ``Content-Length``.

    RFC 9112, section 6.1: a sender must not send both, and a server that receives both may
    refuse the request with 400. h11 frames such a body by its ``Transfer-Encoding``; a server
    behind the proxy that trusted the length instead would wait for bytes that never come, or
    read part of the body as a second request (request smuggling). The proxy refuses it.
    """
    names = {name for name, _ in headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise BadTarget(
            "a request must not have both Transfer-Encoding and Content-Length (RFC 9112, 6.1)"
        )


def forward_headers(
    headers: Iterable[tuple[bytes, bytes]], inject: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """The headers to pass on, with hop-by-hop, ``Proxy-*`` and replaced ones removed.

    Hop-by-hop headers (and those the ``Connection`` header names) and ``Proxy-*`` are
    dropped; headers named in ``inject`` replace the sender's (case-insensitively);
    ``Transfer-Encoding: chunked`` is kept as the framing (h11 re-frames the body), and then
    any ``Content-Length`` is dropped (RFC 9112, section 6.3: a forwarding intermediary
    removes it; h11 framed the body by its ``Transfer-Encoding``), and ``Connection: close``
    is added. Requests with both are refused before this (:func:`check_framing`); an
    upstream's response with both reaches the kernel chunked, without its length (h11, which
    writes it, would drop the length too).
    """
    items = list(headers)
    named = {
        token.strip().lower()
        for name, value in items
        if name == b"connection"
        for token in value.split(b",")
    }
    replaced = {name.lower().encode("ascii") for name in inject}
    out: list[tuple[bytes, bytes]] = []
    chunked = False
    for name, value in items:
        if name == b"transfer-encoding":
            chunked = chunked or value.strip().lower().endswith(b"chunked")
        if name in _HOP_BY_HOP or name in named or name.startswith(b"proxy-") or name in replaced:
            continue
        out.append((name, value))
    if chunked:
        out = [(name, value) for name, value in out if name != b"content-length"]
        out.append((b"transfer-encoding", b"chunked"))
    out.extend((name.encode("ascii"), value.encode("latin-1")) for name, value in inject.items())
    out.append((b"connection", b"close"))
    return out


def error_response(status: int, sentence: str) -> bytes:
    """A complete ``Connection: close`` answer whose body is ``sentence`` (one line)."""
    body = (sentence + "\n").encode("utf-8")
    phrase = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
