"""Host-side reads of a kernel's files are bounded, whatever the kernel answers (issue 26).

Each hostile kernel here is a real one whose own code rewrites the handlers its runtime serves
``file_*`` requests with (:class:`sunroom.prelude.files.FileServer`): it reports one size when
it opens a file and then sends more, without end as far as the host can tell (each hostile
answer is as long as asked; the stream stops at ``ENDLESS_CAP`` only so that a host without
the bound still ends its test instead of filling its memory or disk). The host must stop at
the size the kernel reported: ``read``, ``read_stream``, ``read_sized`` and ``copy_out`` (what
``sunroom exec --output`` runs) raise ProtocolError at the first byte past it, keep and write
nothing past it, and the kernel starts afresh on next use.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sunroom import AsyncKernel, Limits
from sunroom.errors import FileError, ProtocolError
from sunroom.sandbox import fdtake
from sunroom.sandbox.files import READ_MAX_BYTES, copy_out
from tests.conftest import _require, backends_under_test
from tests.security.test_host_dos import PeakRss

ENDLESS_CAP = 64 * 1024 * 1024
"""Where a hostile stream stops (see the module docstring): far past every reported size."""

MAX_RSS_GROWTH_MB = 32
"""The host's peak RSS growth while a hostile kernel streams (its chunks are 1 MiB)."""


@pytest.fixture(params=backends_under_test(("subprocess", "bwrap", "docker")))
def backend(request: pytest.FixtureRequest) -> str:
    return _require(request.param)


@pytest.fixture
async def kernel(backend: str) -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=30)) as k:
        yield k


FIND_SERVER = """
import gc, os
from sunroom.prelude.files import FileServer
fs = next(o for o in gc.get_objects() if isinstance(o, FileServer))
"""

LIE = (
    FIND_SERVER
    + """
real_open, real_chunk = fs.handlers['file_read_open'], fs.handlers['file_read_chunk']
lying, sent = set(), [0]
def lying_open(params):
    out = real_open(params)
    if params.get('path') == 'f.txt':
        out['size'] = {reported}
        lying.add(out['handle'])
    return out
def endless_chunk(params):
    if params.get('handle') not in lying:
        return real_chunk(params)
    if sent[0] >= {cap}:
        return b''
    sent[0] += params['size']
    return b'x' * params['size']
fs.handlers['file_read_open'] = lying_open
fs.handlers['file_read_chunk'] = endless_chunk
'lying'
"""
)


async def lie(k: AsyncKernel, *, reported: int, endless: bool = True) -> None:
    """Make *k* report *reported* bytes for its file f.txt (10 bytes, written here) and, if
    *endless*, send more of it than asked for, forever (every other file is served as it is)."""
    await k.files.write("f.txt", b"0123456789")  # the runtime's FileServer exists from here
    code = LIE.format(reported=reported, cap=ENDLESS_CAP if endless else 0)
    if not endless:
        code = code.replace("fs.handlers['file_read_chunk'] = endless_chunk\n", "")
    assert (await k.execute(code)).value == "'lying'"


async def restarted(k: AsyncKernel) -> None:
    """The channel broke: the next use starts a fresh kernel, which works (and is honest)."""
    assert (await k.execute("1 + 1")).value == "2"
    assert await k.files.list() == []  # a fresh, empty workdir


async def test_read_stops_at_the_reported_size(kernel: AsyncKernel) -> None:
    await lie(kernel, reported=10)
    with (
        PeakRss() as rss,
        pytest.raises(ProtocolError, match="more than the 10 bytes it reported"),
    ):
        await asyncio.wait_for(kernel.files.read("f.txt"), 60)
    assert rss.growth_mb < MAX_RSS_GROWTH_MB, rss.growth_mb
    await restarted(kernel)


async def test_read_stream_yields_nothing_past_the_reported_size(kernel: AsyncKernel) -> None:
    await lie(kernel, reported=10)
    got = bytearray()

    async def consume() -> None:
        async for chunk in kernel.files.read_stream("f.txt"):
            got.extend(chunk)

    with pytest.raises(ProtocolError, match="more than the 10 bytes"):
        await asyncio.wait_for(consume(), 60)
    assert got == b"x" * 10
    await restarted(kernel)


async def test_copy_out_writes_nothing_past_the_reported_size(
    kernel: AsyncKernel, tmp_path: Path
) -> None:
    """What ``sunroom exec --output`` runs: the 3 GiB-for-10-bytes report of issue 26."""
    await kernel.files.write("a.txt", b"first")
    await lie(kernel, reported=10)
    dest = tmp_path / "out"
    with pytest.raises(ProtocolError, match="more than the 10 bytes"):
        await asyncio.wait_for(copy_out(kernel.files, dest), 60)
    # a.txt (first in order, served as it is) was copied; f.txt broke the protocol and its
    # partial copy was removed
    assert sorted(p.name for p in dest.iterdir()) == ["a.txt"]
    assert (dest / "a.txt").read_bytes() == b"first"
    await restarted(kernel)


async def test_a_size_over_max_bytes_is_refused_before_reading(kernel: AsyncKernel) -> None:
    """A kernel reporting 1 TiB for a 10-byte file: refused at open, nothing allocated."""
    await lie(kernel, reported=1 << 40, endless=False)
    with (
        PeakRss() as rss,
        pytest.raises(FileError, match="over the read limit of 1073741824") as err,
    ):
        await kernel.files.read("f.txt")
    assert err.value.reason == "too_big"
    assert rss.growth_mb < MAX_RSS_GROWTH_MB
    assert READ_MAX_BYTES == 1 << 30
    assert (await kernel.execute("1 + 1")).value == "2"  # no protocol break: the same kernel
    with PeakRss() as rss:  # allowed: what is held grows with what arrives, not the claim
        assert await kernel.files.read("f.txt", max_bytes=1 << 41) == b"0123456789"
    assert rss.growth_mb < MAX_RSS_GROWTH_MB


async def test_copy_out_checks_the_size_at_open_not_the_listing(
    kernel: AsyncKernel, tmp_path: Path
) -> None:
    """The listing says 0 bytes; the open says 3 MiB: the total cap holds at the open."""
    await kernel.files.write("a.bin", b"a" * (1 << 20))
    await kernel.files.write("b.bin", b"b" * (3 << 20))
    hide = (
        FIND_SERVER + "real_list = fs.handlers['file_list']\n"
        "fs.handlers['file_list'] = lambda p: [dict(r, size=0) for r in real_list(p)]\n"
        "'hidden'"
    )
    assert (await kernel.execute(hide)).value == "'hidden'"
    assert [f.size for f in await kernel.files.list()] == [0, 0]
    dest = tmp_path / "out"
    with pytest.raises(FileError, match="b.bin is 3145728 bytes") as err:
        await copy_out(kernel.files, dest, max_bytes=2 << 20)
    assert err.value.reason == "too_big"
    assert sorted(p.name for p in dest.iterdir()) == ["a.bin"]  # b.bin was never opened here
    assert (await kernel.execute("1 + 1")).value == "2"


PROC_SHARE = (
    FIND_SERVER
    + """
real_open = fs.handlers['file_read_open']
def proc_open(params):
    out = real_open(params)
    if params.get('share'):
        fd = os.open('/proc/self/status', os.O_RDONLY)
        st = os.fstat(fd)
        out.update(fd=fd, dev=st.st_dev, ino=st.st_ino)
    return out
fs.handlers['file_read_open'] = proc_open
'swapped'
"""
)


async def test_a_procfs_descriptor_is_never_taken(kernel: AsyncKernel, backend: str) -> None:
    """The kernel names its own /proc/self/status for a workdir file: the host's fstatfs
    sees procfs and refuses it (its size, 0, would have said nothing)."""
    if not fdtake.available():
        pytest.skip("pidfd_getfd is unavailable")
    await kernel.files.write("f.txt", b"0123456789")
    assert (await kernel.execute(PROC_SHARE)).value == "'swapped'"
    if backend == "docker":  # an unforked docker kernel: nothing is ever taken from it
        assert await kernel.files.open_shared("f.txt") is None
    else:
        with pytest.raises(ProtocolError, match="descriptor of procfs, not a data file"):
            await kernel.files.open_shared("f.txt")
    assert (await kernel.execute("1 + 1")).value == "2"


async def test_read_holds_the_file_at_most_twice(kernel: AsyncKernel) -> None:
    """``read`` keeps the chunks and joins them once: at most twice the file, whatever the
    allocator does (a growing buffer measured 1.05x alone and 2.7x late in a full test run,
    where each regrowth copied)."""
    size = 64 * 1024 * 1024
    made = await kernel.execute(f"open('big.bin', 'wb').write(b'z' * {size})")
    assert made.value == str(size), made
    with PeakRss() as rss:
        data = await kernel.files.read("big.bin")
    assert len(data) == size
    print(f"\npeak RSS growth {rss.growth_mb:.1f} MB for a {size >> 20} MB file")
    assert rss.growth_mb < 2.25 * (size >> 20), rss.growth_mb
