"""The wire protocol: length-prefixed msgpack-RPC over one Unix-domain socket per kernel.

Imports only the standard library and ``msgpack``: the kernel image carries this package.
See ``docs/protocol.md`` for the format.
"""

from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    WireError,
    decode,
    encode,
    frame,
)
from sunroom.rpc.messages import (
    Message,
    Notification,
    Request,
    Response,
    RpcError,
    parse_message,
)

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_FRAME",
    "PROTOCOL_VERSION",
    "Message",
    "Notification",
    "Request",
    "Response",
    "RpcError",
    "WireError",
    "decode",
    "encode",
    "frame",
    "parse_message",
]
