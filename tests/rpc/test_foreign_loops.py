"""The host channel must not assume asyncio's own transport classes (uvloop has its own)."""

from __future__ import annotations

from sunroom.rpc.channel import Channel


class _DuckTransport:
    """A transport that is not an asyncio.Transport subclass, like uvloop's."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def test_connection_made_accepts_a_foreign_transport() -> None:
    ch = Channel()
    foreign = _DuckTransport()
    ch.connection_made(foreign)  # type: ignore[arg-type]
    ch.notify("ping", 1)
    assert foreign.written
    await ch.aclose()
