"""fdtake: taking another process's descriptor, and refusing one that is not what was said."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sunroom.errors import ProtocolError
from sunroom.sandbox import fdtake

pytestmark = pytest.mark.skipif(not fdtake.available(), reason="pidfd_getfd is unavailable")


def _ids(fd: int) -> dict[str, int]:
    st = os.fstat(fd)
    return {"dev": st.st_dev, "ino": st.st_ino}


def test_a_regular_file_open_for_reading_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"hello")
    fd = os.open(path, os.O_RDONLY)
    try:
        got = fdtake.take(os.getpid(), fd, **_ids(fd))
    finally:
        os.close(fd)
    try:
        assert got != fd and os.pread(got, 10, 0) == b"hello"
        assert not os.get_inheritable(got)
    finally:
        os.close(got)


def test_another_file_than_the_one_named_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    a, b = os.open(tmp_path / "a", os.O_RDONLY), os.open(tmp_path / "b", os.O_RDONLY)
    before = len(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(ProtocolError, match="not the file it opened"):
            fdtake.take(os.getpid(), a, **_ids(b))
        assert len(os.listdir("/proc/self/fd")) == before  # the taken one was closed again
    finally:
        os.close(a)
        os.close(b)


def test_what_cannot_be_read_as_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    read_end, write_end = os.pipe()
    path_fd = os.open(tmp_path / "f", os.O_PATH)
    write_only = os.open(tmp_path / "f", os.O_WRONLY)
    try:
        with pytest.raises(ProtocolError, match="not the file"):
            fdtake.take(os.getpid(), read_end, **_ids(read_end))
        for fd in (path_fd, write_only):
            with pytest.raises(ProtocolError, match="not open for reading"):
                fdtake.take(os.getpid(), fd, **_ids(fd))
    finally:
        for fd in (read_end, write_end, path_fd, write_only):
            os.close(fd)


def test_a_descriptor_that_is_not_there_is_an_os_error() -> None:
    unused = os.sysconf("SC_OPEN_MAX") - 1  # far above every descriptor this process holds
    with pytest.raises(OSError, match="Bad file descriptor"):
        fdtake.take(os.getpid(), unused, dev=0, ino=0)


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/proc/self/status", "procfs"), ("/sys/kernel/mm/transparent_hugepage/enabled", "sysfs")],
)
def test_a_file_of_a_kernel_interface_is_refused(path: str, kind: str) -> None:
    """Issue 26: procfs and sysfs files are regular and readable; their size (0, 4096) says
    nothing, so the host checks their filesystem (``fstatfs``), not their size."""
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here")
    fd = os.open(path, os.O_RDONLY)
    before = len(os.listdir("/proc/self/fd"))
    try:
        assert os.path.isfile(path)  # what the other checks pass
        with pytest.raises(ProtocolError, match=f"descriptor of {kind}, not a data file"):
            fdtake.take(os.getpid(), fd, **_ids(fd))
        assert len(os.listdir("/proc/self/fd")) == before  # the taken one was closed again
    finally:
        os.close(fd)
