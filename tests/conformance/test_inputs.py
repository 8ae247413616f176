"""Large inputs on every backend: values past the frame caps, and read-only File/Directory inputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom import AsyncKernel, Directory, File, KernelError, Limits, UsageError

ROOT = os.geteuid() == 0


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every uid can read: kernels run as their own unprivileged uid under root."""
    path = Path(tempfile.mkdtemp(prefix="sunroom-test-inputs-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    path.chmod(0o644)
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _value(kernel: AsyncKernel, code: str) -> str:
    r = await kernel.execute(code)
    assert r.ok, r.error
    assert r.value is not None
    return " ".join(r.value.split())  # IPython (jupyter) pretty-prints long values over lines


CHECK = (
    "import hashlib\n"
    "(hashlib.sha256(text.encode()).hexdigest(), "
    "hashlib.sha256('\\n'.join(docs).encode()).hexdigest(), len(docs), small)"
)


async def test_big_values_bind_exactly_and_survive_restart(backend: str) -> None:
    text = ("sunroom é ☀ " * 2_000_000)[:24_000_000]  # ~28 MB of UTF-8
    docs = [f"document {i}: short text" for i in range(100_000)]
    want = repr((_sha(text.encode()), _sha("\n".join(docs).encode()), 100_000, 7))
    inputs = {"text": text, "docs": docs, "small": 7}
    async with AsyncKernel(backend=backend, inputs=inputs) as k:
        assert await _value(k, CHECK) == want
        blob = os.urandom(20_000_000)
        await k.bind(blob=blob)  # into the running kernel, streamed as well
        assert await _value(k, "hashlib.sha256(blob).hexdigest()") == repr(_sha(blob))
        await k.restart()
        assert await _value(k, CHECK) == want
        assert await _value(k, "hashlib.sha256(blob).hexdigest()") == repr(_sha(blob))


async def test_a_small_frame_cap_still_streams(backend: str) -> None:
    limits = Limits(max_frame_bytes=64 * 1024)
    items = [{"i": i, "s": "x" * (i % 50)} for i in range(50_000)]
    async with AsyncKernel(backend=backend, limits=limits, inputs={"items": items}) as k:
        got = await _value(k, "len(items), items[-1]['i'], sum(len(d['s']) for d in items)")
        assert got == repr((50_000, 49_999, sum(i % 50 for i in range(50_000))))


async def test_file_and_directory_are_bound_read_only(backend: str, shared_dir: Path) -> None:
    data = _write(shared_dir / "data.txt", "hello\n")
    folder = shared_dir / "folder"
    folder.mkdir(mode=0o755)
    _write(folder / "a.txt", "a")
    (folder / "inner").symlink_to("a.txt")  # inside the folder: allowed
    inputs = {"data": File(data), "folder": Directory(folder)}
    async with AsyncKernel(backend=backend, inputs=inputs) as k:
        assert await _value(k, "type(data).__name__, data.read_text()") == repr(
            ("PosixPath", "hello\n")
        )
        assert await _value(k, "sorted(p.name for p in folder.iterdir())") == repr(
            ["a.txt", "inner"]
        )
        assert await _value(k, "(folder / 'inner').read_text()") == repr("a")
        if backend != "subprocess":
            assert await _value(k, "str(data), str(folder)") == repr(
                ("/inputs/data", "/inputs/folder")
            )
        if backend != "subprocess" or ROOT:  # subprocess: only the file's permissions hold
            for code in (
                "open(data, 'a').write('x')",
                "(folder / 'new.txt').write_text('x')",
                "(folder / 'a.txt').unlink()",
            ):
                r = await k.execute(code)
                assert r.error is not None and r.error.type in ("PermissionError", "OSError"), (
                    code,
                    r,
                )
        await k.restart()  # mounted and bound again
        assert await _value(k, "data.read_text()") == repr("hello\n")
    assert data.read_text() == "hello\n"
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "inner"]


async def test_load_variants(backend: str, shared_dir: Path) -> None:
    text = _write(shared_dir / "t.txt", "héllo")
    raw = _write(shared_dir / "b.bin", b"\x00\xff")
    doc = _write(shared_dir / "d.json", json.dumps({"a": [1, 2]}))
    inputs = {
        "t": File(text, load="text"),
        "b": File(raw, load="bytes"),
        "d": File(doc, load="json"),
    }
    async with AsyncKernel(backend=backend, inputs=inputs) as k:
        assert await _value(k, "t, b, d") == repr(("héllo", b"\x00\xff", {"a": [1, 2]}))


async def test_csv_load(backend: str, shared_dir: Path) -> None:
    table = _write(shared_dir / "t.csv", "a,b\n1,x\n2,y\n")
    async with AsyncKernel(backend=backend) as k:
        has_pandas = await _value(
            k, "import importlib.util\nimportlib.util.find_spec('pandas') is not None"
        )
    if has_pandas == "True":
        async with AsyncKernel(backend=backend, inputs={"t": File(table, load="csv")}) as k:
            assert await _value(k, "list(t.columns), int(t['a'].sum())") == repr((["a", "b"], 3))
        return
    # without pandas in the kernel, load="csv" is refused with one clear sentence
    with pytest.raises(KernelError, match="needs pandas in the kernel"):
        async with AsyncKernel(backend=backend, inputs={"t": File(table, load="csv")}):
            pass
    pytest.skip("pandas is not installed in the kernel's environment; only the refusal was checked")


async def test_bind_file_into_a_running_kernel(backend: str, shared_dir: Path) -> None:
    data = _write(shared_dir / "late.txt", "late")
    k = AsyncKernel(backend=backend)
    try:
        await k.bind(early=File(data))  # before the kernel is started: it starts with the mount
        assert await _value(k, "early.read_text()") == repr("late")
        if backend == "subprocess":
            await k.bind(late=File(data))
            assert await _value(k, "late.read_text()") == repr("late")
        else:
            with pytest.raises(UsageError, match="mounts were fixed when it started"):
                await k.bind(late=File(data))
    finally:
        await k.aclose()


def test_directory_with_an_escaping_symlink_is_refused(shared_dir: Path) -> None:
    folder = shared_dir / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(UsageError, match="points outside the directory"):
        AsyncKernel(backend="subprocess", inputs={"f": Directory(folder)})
    (folder / "sub" / "passwd").unlink()
    (folder / "up").symlink_to("..")
    with pytest.raises(UsageError, match="points outside the directory"):
        AsyncKernel(backend="subprocess", inputs={"f": Directory(folder)})


def test_missing_and_wrong_kind_paths_are_refused(shared_dir: Path) -> None:
    with pytest.raises(UsageError, match="cannot be bound"):
        AsyncKernel(backend="subprocess", inputs={"f": File(shared_dir / "nope.csv")})
    with pytest.raises(UsageError, match="is not a regular file"):
        AsyncKernel(backend="subprocess", inputs={"f": File(shared_dir)})
    with pytest.raises(UsageError, match="is not a directory"):
        AsyncKernel(backend="subprocess", inputs={"f": Directory(_write(shared_dir / "x", "x"))})
    with pytest.raises(UsageError, match="load= must be one of"):
        File(shared_dir, load="xml")  # type: ignore[arg-type]


@pytest.mark.skipif(not ROOT, reason="kernels run as an unprivileged uid only under root")
def test_a_file_the_kernel_uid_cannot_read_is_refused(shared_dir: Path) -> None:
    secret = _write(shared_dir / "secret.txt", "s")
    secret.chmod(0o600)
    with pytest.raises(UsageError, match="not readable by other users"):
        AsyncKernel(backend="subprocess", inputs={"f": File(secret)})


@pytest.mark.parametrize("name", ["_private", "1st", "a-b", "with space", ""])
def test_input_names_are_validated(shared_dir: Path, name: str) -> None:
    data = _write(shared_dir / "n.txt", "n")
    with pytest.raises(UsageError, match="must be a public Python identifier"):
        AsyncKernel(backend="subprocess", inputs={name: File(data)})


async def test_an_unencodable_big_value_is_refused_and_the_kernel_keeps_working(
    backend: str,
) -> None:
    async with AsyncKernel(backend=backend) as k:
        await k.bind(keep=1)
        with pytest.raises(UsageError, match="cannot bind"):
            await k.bind(bad=[*range(100_000), 2**70])  # too big for msgpack, late in the list
        docs = [f"d{i}" for i in range(100_000)]
        await k.bind(docs=docs)  # a fresh stream after the abandoned one
        assert await _value(k, "keep, len(docs), docs[-1], 'bad' in dir()") == repr(
            (1, 100_000, "d99999", False)
        )


@pytest.mark.slow
async def test_a_million_item_list(backend: str) -> None:
    docs = [f"document number {i}" for i in range(1_000_000)]
    want = _sha("\n".join(docs).encode())
    async with AsyncKernel(backend=backend, inputs={"docs": docs}) as k:
        code = "import hashlib\nhashlib.sha256('\\n'.join(docs).encode()).hexdigest()"
        assert await _value(k, code) == repr(want)


async def test_a_pooled_kernel_takes_file_inputs_only_where_nothing_is_mounted(
    backend: str, shared_dir: Path
) -> None:
    from sunroom import KernelPool

    data = _write(shared_dir / "p.txt", "pooled")
    async with KernelPool(backend=backend, size=1) as pool:
        if backend == "subprocess":
            async with AsyncKernel(pool=pool, inputs={"p": File(data)}) as k:
                assert await _value(k, "p.read_text()") == repr("pooled")
        else:
            with pytest.raises(UsageError, match="pooled kernel"):
                AsyncKernel(pool=pool, inputs={"p": File(data)})
