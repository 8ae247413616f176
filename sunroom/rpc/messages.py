"""The msgpack-RPC message shapes and their validation.

* request      ``[0, id, method, params]``
* response     ``[1, id, error, result]`` where ``error`` is ``None`` or ``{type, message, data}``
* notification ``[2, method, params]``

``parse_message`` turns a decoded payload into one of the frozen records below or raises
:class:`~sunroom.rpc.codec.WireError`; ``to_wire`` is its inverse.
"""

from __future__ import annotations

from sunroom.rpc.codec import WireError

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Final

REQUEST: Final = 0
RESPONSE: Final = 1
NOTIFICATION: Final = 2
MAX_ID: Final = 2**32 - 1


_set = object.__setattr__


class _Record:
    """A tiny frozen record (``dataclasses`` costs the kernel ~10 ms of start-up to import).

    Each record sets its fields in its own ``__init__`` (one message is parsed per frame, so
    a generic loop over ``__slots__`` showed in profiles).
    """

    __slots__: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Record)
            and type(other) is type(self)
            and self._values() == other._values()
        )

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"


class RpcError(_Record):
    """An error carried in a response: a type name, a message and optional extra data."""

    __slots__ = ("type", "message", "data")
    type: str
    message: str
    data: object

    def __init__(self, type: str, message: str, data: object = None) -> None:  # noqa: A002
        _set(self, "type", type)
        _set(self, "message", message)
        _set(self, "data", data)

    def to_wire(self) -> dict[str, object]:
        """Return the ``{type, message, data}`` map."""
        return {"type": self.type, "message": self.message, "data": self.data}


class Request(_Record):
    """A call expecting exactly one response with the same id."""

    __slots__ = ("id", "method", "params")
    id: int
    method: str
    params: object

    def __init__(self, id: int, method: str, params: object) -> None:  # noqa: A002
        _set(self, "id", id)
        _set(self, "method", method)
        _set(self, "params", params)

    def to_wire(self) -> list[object]:
        """Return the msgpack-RPC array for this request."""
        return [REQUEST, self.id, self.method, self.params]


class Response(_Record):
    """The answer to a request: exactly one of ``error`` and ``result`` is meaningful."""

    __slots__ = ("id", "error", "result")
    id: int
    error: RpcError | None
    result: object

    def __init__(self, id: int, error: RpcError | None, result: object) -> None:  # noqa: A002
        _set(self, "id", id)
        _set(self, "error", error)
        _set(self, "result", result)

    def to_wire(self) -> list[object]:
        """Return the msgpack-RPC array for this response."""
        err = None if self.error is None else self.error.to_wire()
        return [RESPONSE, self.id, err, self.result]


class Notification(_Record):
    """A one-way message; never answered."""

    __slots__ = ("method", "params")
    method: str
    params: object

    def __init__(self, method: str, params: object) -> None:
        _set(self, "method", method)
        _set(self, "params", params)

    def to_wire(self) -> list[object]:
        """Return the msgpack-RPC array for this notification."""
        return [NOTIFICATION, self.method, self.params]


Message = Request | Response | Notification


def _check_id(value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise WireError(f"message id must be an int in [0, 2**32), got {value!r:.40}")
    return value


def _check_method(value: object) -> str:
    if type(value) is not str or not value or len(value) > 128:
        raise WireError(f"method must be a non-empty str of at most 128 chars, got {value!r:.40}")
    return value


def _parse_error(value: object) -> RpcError | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError("response error must be nil or a map")
    etype, message = value.get("type"), value.get("message")
    if type(etype) is not str or type(message) is not str:
        raise WireError("response error needs str 'type' and 'message'")
    return RpcError(etype, message, value.get("data"))


def parse_message(obj: object) -> Message:
    """Validate a decoded payload's shape and return the typed message; raises WireError."""
    if type(obj) is not list or not obj:
        raise WireError("a message must be a non-empty array")
    kind = obj[0]
    if kind == REQUEST and type(kind) is int:
        if len(obj) != 4:
            raise WireError("a request has exactly 4 elements")
        return Request(_check_id(obj[1]), _check_method(obj[2]), obj[3])
    if kind == RESPONSE and type(kind) is int:
        if len(obj) != 4:
            raise WireError("a response has exactly 4 elements")
        return Response(_check_id(obj[1]), _parse_error(obj[2]), obj[3])
    if kind == NOTIFICATION and type(kind) is int:
        if len(obj) != 3:
            raise WireError("a notification has exactly 3 elements")
        return Notification(_check_method(obj[1]), obj[2])
    raise WireError(f"unknown message type {kind!r:.20}")
