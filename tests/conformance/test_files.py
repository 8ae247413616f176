"""kernel.files on every backend: transfers, listing, deleting, and the workdir jail."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sunroom import AsyncKernel, Kernel, Limits
from sunroom.errors import FileError, UsageError
from sunroom.sandbox.files import COPY_MAX_BYTES, copy_out


@pytest.fixture
async def kernel(backend: str) -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=10)) as k:
        yield k


async def test_write_read_list_delete(kernel: AsyncKernel) -> None:
    assert await kernel.files.write("in/data.bin", b"\x00\x01hello") == 7
    assert await kernel.files.read("in/data.bin") == b"\x00\x01hello"
    r = await kernel.execute("open('in/data.bin', 'rb').read()")
    assert r.value == "b'\\x00\\x01hello'"
    r = await kernel.execute(
        "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('result')"
    )
    assert r.ok, r
    rows = await kernel.files.list()
    assert [(f.path, f.is_dir) for f in rows] == [
        ("in", True),
        ("in/data.bin", False),
        ("out", True),
        ("out/r.txt", False),
    ]
    assert [f.path for f in await kernel.files.list("out/*.txt")] == ["out/r.txt"]
    assert [f.path for f in await kernel.files.list("*")] == ["in", "out"]
    assert (await kernel.files.list("out/r.txt"))[0].size == 6
    await kernel.files.delete("in")
    assert [f.path for f in await kernel.files.list()] == ["out", "out/r.txt"]
    with pytest.raises(FileError, match="no such file") as err:
        await kernel.files.read("in/data.bin")
    assert err.value.reason == "not_found"


async def test_chunked_transfer_round_trips(kernel: AsyncKernel) -> None:
    data = bytes(range(256)) * (12 * 1024)  # 3 MiB: several frames each way, some in flight

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(data), 100_000):
            yield data[at : at + 100_000]

    assert await kernel.files.write("big.bin", pieces()) == len(data)
    chunks = [c async for c in kernel.files.read_stream("big.bin")]
    assert len(chunks) == 3 and all(len(c) <= 1024 * 1024 for c in chunks)
    assert b"".join(chunks) == data
    assert (await kernel.execute("import os; os.path.getsize('big.bin')")).value == str(len(data))


async def test_a_failed_upload_leaves_nothing(kernel: AsyncKernel) -> None:
    await kernel.files.write("keep.txt", b"old")

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * 3_000_000
        raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError, match="went away"):
        await kernel.files.write("keep.txt", broken())
    assert await kernel.files.read("keep.txt") == b"old"
    assert [f.path for f in await kernel.files.list()] == ["keep.txt"]
    r = await kernel.execute("import os; sorted(os.listdir('.'))")
    assert r.value == "['keep.txt']"  # no temporary file left behind either


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside", "'..'"),
        ("a/../../outside", "'..'"),
        ("/etc/passwd", "not absolute"),
        ("a\x00b", "NUL"),
        ("", "not the workdir"),
        ("./.", "not the workdir"),
    ],
)
async def test_bad_paths_are_refused(kernel: AsyncKernel, path: str, message: str) -> None:
    for attempt in (
        kernel.files.read(path),
        kernel.files.write(path, b"x"),
        kernel.files.delete(path),
    ):
        with pytest.raises(FileError, match=message) as err:
            await attempt
        assert err.value.reason == "refused"
    assert (await kernel.execute("1 + 1")).value == "2"


PLANT = """
import os
os.symlink('/etc/passwd', 'passwd')
os.symlink('/etc', 'etc')
os.makedirs('inside', exist_ok=True)
open('inside/ok.txt', 'w').write('fine')
"""


async def test_symlink_escapes_are_refused(kernel: AsyncKernel) -> None:
    assert (await kernel.execute(PLANT)).ok
    for path in ("passwd", "etc/passwd", "etc/hostname"):
        with pytest.raises(FileError, match="symbolic link") as err:
            await kernel.files.read(path)
        assert err.value.reason == "refused"
    with pytest.raises(FileError, match="symbolic link"):
        await kernel.files.write("etc/planted", b"x")  # through a symlinked directory
    with pytest.raises(FileError, match="symbolic link"):
        await kernel.files.delete("etc/passwd")
    # writing *at* a link replaces the link itself; its target is never opened
    await kernel.files.write("passwd", b"mine")
    r = await kernel.execute("import os; (os.path.islink('passwd'), open('passwd').read())")
    assert r.value == "(False, 'mine')"
    r = await kernel.execute(
        "import os; not os.path.exists('/etc/passwd') or b'mine' not in open('/etc/passwd', 'rb').read()"
    )
    assert r.value == "True"
    # deleting a link removes the link, not its target
    await kernel.files.delete("etc")
    r = await kernel.execute("import os; (os.path.lexists('etc'), os.path.isdir('/etc'))")
    assert r.value == "(False, True)"
    assert await kernel.files.read("inside/ok.txt") == b"fine"


async def test_a_file_or_directory_where_the_other_is_needed(kernel: AsyncKernel) -> None:
    await kernel.files.write("d/f", b"x")
    with pytest.raises(FileError) as err:
        await kernel.files.read("d")
    assert err.value.reason == "is_dir"
    with pytest.raises(FileError) as err:
        await kernel.files.write("d", b"x")
    assert err.value.reason == "is_dir"
    with pytest.raises(FileError) as err:
        await kernel.files.write("d/f/g", b"x")
    assert err.value.reason == "not_dir"
    assert await kernel.files.read("d/f") == b"x"


async def test_a_full_workdir_is_a_clear_error(backend: str) -> None:
    limits = Limits(timeout_s=10, file_size_mb=1)
    async with AsyncKernel(backend=backend, limits=limits) as k:
        with pytest.raises(FileError, match="no room") as err:
            await k.files.write("big", b"x" * (3 * 1024 * 1024))
        assert err.value.reason == "no_space"
        assert await k.files.list() == []
        assert (await k.execute("1")).ok


async def test_file_ops_wait_for_a_running_cell(kernel: AsyncKernel) -> None:
    import asyncio

    cell = asyncio.ensure_future(
        kernel.execute("import time\ntime.sleep(0.5)\nopen('late.txt', 'w').write('done')")
    )
    await asyncio.sleep(0.1)
    assert await kernel.files.read("late.txt") == b"done"  # ran after the cell, not during it
    assert (await cell).ok


async def test_read_sized_gives_the_size_then_the_stream(kernel: AsyncKernel) -> None:
    data = b"z" * (2 * 1024 * 1024 + 5)
    await kernel.files.write("s.bin", data)
    size, stream = await kernel.files.read_sized("s.bin")
    assert size == len(data)
    assert b"".join([c async for c in stream]) == data
    with pytest.raises(FileError, match="no such file") as err:
        await kernel.files.read_sized("missing.bin")
    assert err.value.reason == "not_found"
    assert (await kernel.execute("1 + 1")).value == "2"  # nothing holds the kernel


SWAP_SOON = """
import os, threading, time
def swap():
    time.sleep(0.6)
    os.symlink('/etc/passwd', 'link')
    os.replace('link', 'kept.bin')
threading.Thread(target=swap, daemon=True).start()
"""


async def test_open_shared_hands_over_the_kernels_own_open_file(
    kernel: AsyncKernel, backend: str
) -> None:
    data = bytes(range(256)) * 4096 + b"end"
    await kernel.files.write("kept.bin", data)
    assert (await kernel.execute(SWAP_SOON)).ok  # a thread of the kernel's own code, later
    shared = await kernel.files.open_shared("kept.bin")
    if shared is None:  # an unforked docker kernel: its runtime's host pid is unknown
        assert backend == "docker"
        return
    async with shared:
        assert shared.size == len(data)
        cell = asyncio.ensure_future(kernel.execute("1 + 1"))
        await asyncio.sleep(1.0)  # meanwhile the path became a link out of the workdir
        assert not cell.done()  # the kernel is held: no cell runs during a transfer
        assert os.pread(shared.fd, len(data) + 1, 0) == data  # what was opened, unchanged
        taken = os.fstat(shared.fd)
    with contextlib.suppress(OSError):  # closed by aclose, unless its number was reused
        assert not os.path.samestat(os.fstat(shared.fd), taken)
    assert (await cell).value == "2"
    with pytest.raises(FileError, match="symbolic link") as err:
        await kernel.files.open_shared("kept.bin")  # the link is refused in the kernel's jail
    assert err.value.reason == "refused"
    for path, reason in (("../x", "refused"), ("/etc/passwd", "refused"), ("nope", "not_found")):
        with pytest.raises(FileError) as err:
            await kernel.files.open_shared(path)
        assert err.value.reason == reason
    assert (await kernel.execute("1 + 1")).value == "2"  # nothing holds the kernel


async def test_open_shared_on_forked_kernels_takes_each_ones_own_file(
    kernel: AsyncKernel,
) -> None:
    await kernel.files.write("a.txt", b"parent")
    [copy] = await kernel.fork(1)
    try:
        await copy.files.write("a.txt", b"copy!")
        for owner, expected in ((kernel, b"parent"), (copy, b"copy!")):
            shared = await owner.files.open_shared("a.txt")
            assert shared is not None  # forked docker kernels too: their host pid is known
            async with shared:
                assert os.pread(shared.fd, 100, 0) == expected
    finally:
        await copy.aclose()


async def test_usage_errors(kernel: AsyncKernel) -> None:
    with pytest.raises(UsageError, match="bytes"):
        await kernel.files.write("x", "text")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="glob"):
        await kernel.files.list("\x00")


def test_the_sync_twin(backend: str) -> None:
    with Kernel(backend=backend) as k:
        assert k.files.write("a.txt", [b"he", b"llo"]) == 5
        assert k.files.read("a.txt") == b"hello"
        with pytest.raises(FileError, match="over the read limit of 4 bytes") as err:
            k.files.read("a.txt", max_bytes=4)
        assert err.value.reason == "too_big"
        assert list(k.files.read_stream("a.txt")) == [b"hello"]
        stream = k.files.read_stream("a.txt")
        assert next(stream) == b"hello"
        del stream  # abandoned early: the generator closes the read and frees the kernel
        assert (k.execute("1")).ok
        size, chunks = k.files.read_sized("a.txt")
        assert size == 5 and list(chunks) == [b"hello"]
        size, chunks = k.files.read_sized("a.txt")
        chunks.close()  # never iterated: closing it still frees the kernel
        assert (k.execute("1")).ok
        with pytest.raises(FileError):
            k.files.read_sized("nope")
        shared = k.files.open_shared("a.txt")
        assert (shared is None) == (backend == "docker")
        if shared is not None:
            with shared:
                assert shared.size == 5 and os.pread(shared.fd, 10, 0) == b"hello"
            assert (k.execute("1")).ok  # closing it freed the kernel
        assert [f.path for f in k.files.list()] == ["a.txt"]
        k.files.delete("a.txt")
        assert k.files.list() == []


GROW_SOON = """
import threading, time
def grow():
    time.sleep(0.5)
    with open('g.bin', 'ab') as f:
        f.write(b'more' * 100_000)
threading.Thread(target=grow, daemon=True).start()
"""


async def test_a_read_ends_at_the_size_the_file_had_when_opened(kernel: AsyncKernel) -> None:
    """Issue 26: every host read stops at the size reported at open (the host refuses more as
    a broken protocol), so a file that grows meanwhile is cut there, on every path."""
    data = b"g" * (2 * 1024 * 1024 + 7)
    await kernel.files.write("g.bin", data)
    assert (await kernel.execute(GROW_SOON)).ok
    size, stream = await kernel.files.read_sized("g.bin")
    await asyncio.sleep(1.0)  # it grew meanwhile
    assert size == len(data)
    assert b"".join([c async for c in stream]) == data
    grown = (await kernel.execute("import os; os.path.getsize('g.bin')")).value
    assert grown == str(len(data) + 400_000)
    assert (await kernel.execute("1 + 1")).value == "2"


async def test_read_has_a_size_cap(kernel: AsyncKernel) -> None:
    """Issue 26: ``read(max_bytes=)`` (default 1 GiB) refuses a file over it before reading."""
    data = b"m" * (3 * 1024 * 1024)
    await kernel.files.write("m.bin", data)
    with pytest.raises(FileError, match="m.bin is 3145728 bytes, over the read limit") as err:
        await kernel.files.read("m.bin", max_bytes=len(data) - 1)
    assert err.value.reason == "too_big"
    assert await kernel.files.read("m.bin", max_bytes=len(data)) == data
    assert await kernel.files.read("m.bin") == data
    with pytest.raises(UsageError, match="max_bytes"):
        await kernel.files.read("m.bin", max_bytes=-1)
    assert (await kernel.execute("1 + 1")).value == "2"  # nothing holds the kernel


async def test_copy_out_has_a_total_cap(kernel: AsyncKernel, tmp_path: Path) -> None:
    """Issue 26: ``copy_out`` writes at most ``max_bytes`` in all (default 1 GiB): over it by
    the listing, nothing is copied."""
    for name in ("a.bin", "b.bin", "c.bin"):
        await kernel.files.write(name, b"c" * (1024 * 1024))
    dest = tmp_path / "out"
    with pytest.raises(FileError, match="hold 3145728 bytes, over the limit of 2621440") as err:
        await copy_out(kernel.files, dest, max_bytes=2621440)
    assert err.value.reason == "too_big"
    assert list(dest.iterdir()) == []
    assert COPY_MAX_BYTES == 1024 * 1024 * 1024
    copied, skipped = await copy_out(kernel.files, dest, max_bytes=3 * 1024 * 1024)
    assert (copied, skipped) == (["a.bin", "b.bin", "c.bin"], [])
    assert all((dest / name).stat().st_size == 1024 * 1024 for name in copied)
