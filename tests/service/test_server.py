from __future__ import annotations

import socket
from pathlib import Path

from sunroom.service.config import ServiceConfig
from sunroom.service.server import bind


def test_listener_disables_nagle(tmp_path: Path) -> None:
    """Keep-alive responses must not wait for the client's delayed ACK (a 40 ms stall each)."""
    config = ServiceConfig(host="127.0.0.1", port=0, token="x" * 32, db_path=tmp_path / "s.db")
    sock = bind(config)
    try:
        assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY per connection
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
