"""The wire protocol: length-prefixed msgpack-RPC over one Unix-domain socket per kernel.

Imports only the standard library and ``msgpack``: the kernel image carries this package.
See ``docs/protocol.md`` for the format.
"""

from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_VALUES,
    PROTOCOL_VERSION,
    Decoding,
    WireError,
    count_values,
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
    "DEFAULT_MAX_VALUES",
    "PROTOCOL_VERSION",
    "Decoding",
    "Message",
    "Notification",
    "Request",
    "Response",
    "RpcError",
    "WireError",
    "count_values",
    "decode",
    "encode",
    "frame",
    "parse_message",
]
