"""Large inputs, host side: values of any size, and host files mounted read-only.

Two ways to give a kernel big data:

* **Values** (``inputs=`` / ``bind()``) of any size. A value whose encoding could exceed the
  frame caps (bytes or values per frame) is not sent in one frame: the host encodes the values
  in pieces (a big ``str``/``bytes`` as a header plus a view of its UTF-8/raw bytes; a big list
  or dict in batches of items) and sends them as ``bind_chunk`` requests of at most
  :data:`CHUNK_BYTES` each, at most :data:`WINDOW` unanswered at a time. The kernel keeps the
  chunks and decodes them once with the codec's usual per-object caps
  (:mod:`sunroom.prelude.inputs`) when the final ``bind`` names the streamed total. The
  per-frame caps are unchanged. The host keeps only a reference to the caller's object (for
  re-binding after a restart); the encoding is transient: one item batch (or one big string's
  UTF-8 bytes) and a few chunks at a time.
* **Files** (:class:`File`, :class:`Directory`): the host path is resolved (``realpath``) and
  checked on the host, mounted read-only when the kernel starts (bwrap ``--ro-bind``, docker a
  read-only bind mount, subprocess: the host path itself) at :data:`INPUTS_DIR`/NAME, and bound
  as a :class:`pathlib.Path`, or loaded in the kernel with ``load=``. Nothing of the file
  travels through the channel.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import msgpack

from sunroom.errors import ProtocolError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import Channel
from sunroom.rpc.codec import WireError
from sunroom.sandbox.backend import InputMount
from sunroom.sandbox.identity import unreachable

Load = Literal["text", "bytes", "csv", "json", "parquet"]
LOADS: Final = frozenset(get_args(Load))

INPUTS_DIR: Final = "/inputs"
"""Where bwrap and docker kernels see File and Directory inputs: ``/inputs/NAME``."""

MOUNTING_BACKENDS: Final = frozenset({"bwrap", "docker"})
"""Backends that mount file inputs at :data:`INPUTS_DIR` (fixed when the kernel starts)."""

PATH_BACKENDS: Final = frozenset({"subprocess"})
"""Backends whose kernels see the host's filesystem: the kernel gets the host path itself."""

CHUNK_BYTES: Final = 1024 * 1024
"""Largest ``bind_chunk`` payload (and at most half the frame cap). 1 MiB measured faster
than 4 or 8 MiB for a 200 MB str (about 1.1 s against 1.25-1.55 s, same kernel, same run)."""

SMALL_BYTES: Final = 1024 * 1024
SMALL_VALUES: Final = 16_384
"""A value under both bounds is sent inline in the ``bind`` frame, as before."""

WINDOW: Final = 2
"""Chunks in flight at once (sent, not yet acknowledged): encoding overlaps decoding."""

BATCH_ITEMS: Final = 4096
"""List items (or dict entries) encoded at a time when streaming."""


@dataclass(frozen=True, slots=True)
class File:
    """A host file bound read-only into the kernel as ``/inputs/NAME``.

    Args:
        path: the host path; resolved with ``realpath`` on the host when bound (a missing
            path, or one that is not a regular file, is refused).
        load: None binds a :class:`pathlib.Path`; ``"text"`` (UTF-8) ``"bytes"`` and
            ``"json"`` load it with the standard library in the kernel; ``"csv"`` and
            ``"parquet"`` load a ``pandas.DataFrame`` (pandas must be importable in the kernel,
            and pyarrow or fastparquet for parquet).
    """

    path: str | os.PathLike[str]
    load: Load | None = None

    def __post_init__(self) -> None:
        if self.load is not None and self.load not in LOADS:
            raise UsageError(f"File load= must be one of {', '.join(sorted(LOADS))} or None")


@dataclass(frozen=True, slots=True)
class Directory:
    """A host directory bound read-only into the kernel as ``/inputs/NAME`` (a Path).

    Symlinks inside it that resolve outside it are refused when it is bound.
    """

    path: str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A checked file input: its name, host realpath, kind and load mode."""

    name: str
    source: str
    kind: Literal["file", "dir"]
    load: Load | None


def is_file_input(value: object) -> bool:
    """Whether *value* is a :class:`File` or :class:`Directory`."""
    return isinstance(value, File | Directory)


def resolve(name: str, value: File | Directory) -> Resolved:
    """Resolve and check a file input on the host.

    Raises UsageError when the path is missing, of the wrong kind, unreadable by the kernel's
    unprivileged uid (when sunroom runs as root) or, for a Directory, holds a symlink that
    resolves outside it.
    """
    raw = os.fspath(value.path)
    source = os.path.realpath(raw)
    try:
        mode = os.stat(source).st_mode
    except OSError as exc:
        raise UsageError(f"input {name!r}: {raw} cannot be bound: {exc.strerror}") from None
    if isinstance(value, File):
        if not stat.S_ISREG(mode):
            raise UsageError(f"input {name!r}: File({raw!r}) is not a regular file")
        kind: Literal["file", "dir"] = "file"
        load = value.load
    else:
        if not stat.S_ISDIR(mode):
            raise UsageError(f"input {name!r}: Directory({raw!r}) is not a directory")
        _check_links(name, source)
        kind, load = "dir", None
    if os.geteuid() == 0:
        reason = unreachable([source])
        if reason is not None:
            raise UsageError(
                f"input {name!r}: kernels run as an unprivileged uid and {reason}; make it "
                "readable by other users (chmod o+r on the file, o+rx on a directory, o+x on "
                "every parent directory)"
            )
    return Resolved(name, source, kind, load)


def _check_links(name: str, root: str) -> None:
    """Refuse a directory holding a symlink that resolves outside it."""
    prefix = root.rstrip("/") + "/"
    for top, dirs, files in os.walk(root, followlinks=False):
        for entry in (*dirs, *files):
            path = os.path.join(top, entry)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            if target != root and not target.startswith(prefix):
                raise UsageError(
                    f"input {name!r}: the symlink {path} points outside the directory "
                    f"(to {target}); remove it or bind its target separately"
                )


def kernel_path(backend: str, item: Resolved) -> str:
    """Where the kernel of *backend* sees *item*; UsageError for a backend that cannot."""
    if backend in MOUNTING_BACKENDS:
        return f"{INPUTS_DIR}/{item.name}"
    if backend in PATH_BACKENDS:
        return item.source
    raise UsageError(
        f"the {backend!r} backend cannot mount File or Directory inputs; use bwrap, docker or "
        "subprocess, or bind the data as a value"
    )


def mounts(backend: str, items: Mapping[str, Resolved]) -> tuple[InputMount, ...]:
    """The read-only mounts *backend* must make for *items* (none for path backends)."""
    if backend not in MOUNTING_BACKENDS:
        return ()
    return tuple(InputMount(i.source, kernel_path(backend, i)) for i in items.values())


# -- values of any size ---------------------------------------------------------------------


def is_small(value: Any) -> bool:
    """Whether *value* (wire form) surely fits one frame: a bounded walk, O(SMALL_VALUES)."""
    budget = [SMALL_VALUES, SMALL_BYTES]

    def walk(v: Any) -> bool:
        budget[0] -= 1
        if isinstance(v, str | bytes):
            budget[1] -= len(v) * (4 if isinstance(v, str) else 1) + 5
        elif isinstance(v, list | tuple):
            if len(v) > budget[0]:
                return False
            return all(walk(x) for x in v) and budget[0] > 0 and budget[1] > 0
        elif isinstance(v, dict):
            if 2 * len(v) > budget[0]:
                return False
            return all(walk(k) and walk(x) for k, x in v.items()) and budget[0] > 0
        else:
            budget[1] -= 16
        return budget[0] > 0 and budget[1] > 0

    return walk(value)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, datetime=True)  # type: ignore[no-any-return]


def _header(kind: Literal["str", "bin", "array", "map"], n: int) -> bytes:
    """A msgpack header of the widest form (valid for any length)."""
    lead = {"str": b"\xdb", "bin": b"\xc6", "array": b"\xdd", "map": b"\xdf"}[kind]
    return lead + n.to_bytes(4, "big")


def _pieces(value: Any) -> Iterator[bytes | memoryview]:
    """The msgpack encoding of *value* (wire form) in pieces, without one encoding of it all.

    Big strings and bytes become a header and a view of their bytes; lists and dicts are
    encoded :data:`BATCH_ITEMS` items at a time (one ``packb`` per batch, its own header cut).
    """
    if isinstance(value, str) and len(value) > SMALL_BYTES:
        data = value.encode("utf-8", "surrogatepass")
        yield _header("str", len(data))
        yield memoryview(data)
    elif isinstance(value, bytes) and len(value) > SMALL_BYTES:
        yield _header("bin", len(value))
        yield memoryview(value)
    elif isinstance(value, list | tuple):
        yield _header("array", len(value))
        for i in range(0, len(value), BATCH_ITEMS):
            batch = value[i : i + BATCH_ITEMS]
            yield memoryview(_pack(batch))[_header_size(len(batch)) :]
    elif isinstance(value, dict):
        yield _header("map", len(value))
        items = iter(value.items())
        while entries := dict(itertools.islice(items, BATCH_ITEMS)):
            yield memoryview(_pack(entries))[_header_size(len(entries)) :]
    else:
        yield _pack(value)


def _header_size(n: int) -> int:
    """Bytes of the header msgpack writes for an array or map of *n* items."""
    return 1 if n < 16 else 3 if n < 65536 else 5


def _chunks(values: Mapping[str, Any], size: int) -> Iterator[bytes | memoryview]:
    """The encoding of the map *values* in chunks of at most *size* bytes."""
    buf = bytearray(_header("map", len(values)))

    def pieces() -> Iterator[bytes | memoryview]:
        for name, value in values.items():
            yield _pack(name)
            yield from _pieces(value)

    for piece in pieces():
        view = memoryview(piece)
        while len(view):
            room = size - len(buf)
            if not buf and len(view) >= size:
                yield view[:size]
                view = view[size:]
                continue
            buf += view[:room]
            view = view[room:]
            if len(buf) >= size:
                yield bytes(buf)
                buf.clear()
    if buf:
        yield bytes(buf)


async def send_bind(
    channel: Channel,
    values: Mapping[str, Any],
    *,
    types: Mapping[str, str],
    files: Mapping[str, dict[str, Any]],
    max_frame: int,
) -> None:
    """Bind *values* (wire form) and *files* (kernel path specs) in the kernel.

    Small values go inline in the ``bind`` request; the others are streamed first in
    ``bind_chunk`` requests. Raises UsageError when a value cannot be encoded or a frame cannot
    be sent (nothing is bound then; a partial stream is dropped by the kernel at the next
    bind), and what the requests' futures raise (RemoteError, ProtocolError, ClosedError).
    """
    inline = {n: v for n, v in values.items() if is_small(v)}
    big = {n: v for n, v in values.items() if n not in inline}
    streamed = 0
    if big:
        size = max(1024, min(CHUNK_BYTES, max_frame // 2))
        first = True
        window: deque[asyncio.Future[Any]] = deque()
        chunks = _chunks(big, size)
        try:
            while True:
                try:
                    chunk = next(chunks, None)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise UsageError(f"cannot bind: cannot encode a value: {exc}") from None
                if chunk is None:
                    break
                streamed += len(chunk)
                window.append(_request(channel, "bind_chunk", {"data": chunk, "first": first}))
                first = False
                if len(window) >= WINDOW:
                    await window.popleft()
            while window:
                await window.popleft()
        finally:
            for fut in window:
                fut.cancel()
    params: dict[str, Any] = {"values": inline, "types": dict(types)}
    if files:
        params["files"] = dict(files)
    if big:
        params["streamed"] = streamed
    await _request(channel, "bind", params)


def _request(channel: Channel, method: str, params: dict[str, Any]) -> asyncio.Future[Any]:
    """Send one bind request; UsageError when it cannot be encoded or exceeds the frame cap."""
    check = _ack if method == "bind_chunk" else schema.names
    try:
        return channel.request(method, params, check=check)
    except ProtocolError as exc:
        raise UsageError(f"cannot bind: {exc}") from None


def _ack(result: Any) -> int:
    if type(result) is not int:
        raise WireError(f"bind_chunk must answer with an int, got {type(result).__name__}")
    return result


def file_spec(backend: str, item: Resolved) -> dict[str, Any]:
    """What the kernel needs to bind *item*: its path there, kind and load mode."""
    return {"path": kernel_path(backend, item), "kind": item.kind, "load": item.load}
