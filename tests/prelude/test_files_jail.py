"""The kernel's workdir jail, in both resolution modes (openat2, and the O_NOFOLLOW walk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sunroom.prelude import files
from sunroom.prelude.files import FileServer, PathRefused


@pytest.fixture(params=["openat2", "walk"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> FileServer:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"host secret")
    work = tmp_path / "work"
    (work / "inside").mkdir(parents=True)
    (work / "inside" / "ok.txt").write_bytes(b"fine")
    os.symlink(outside / "secret", work / "secret")  # a planted link to a file
    os.symlink(outside, work / "out")  # and to a directory
    os.symlink("inside", work / "alias")  # a link that stays inside
    os.symlink("../../outside", work / "inside" / "up")  # a relative one that leaves
    s = FileServer(str(work))
    if request.param == "walk":
        s.jail._openat2 = None  # as on a kernel without openat2, or with it filtered
    elif s.jail.mode != "openat2":
        pytest.skip("openat2 is not available here")
    return s


def _read(server: FileServer, path: str) -> bytes:
    opened = server.handlers["file_read_open"]({"path": path})
    try:
        data = server.handlers["file_read_chunk"]({"handle": opened["handle"], "size": 1 << 20})
        return bytes(data)  # a view of the server's read buffer
    finally:
        server.handlers["file_read_close"]({"handle": opened["handle"]})


def _write(server: FileServer, path: str, data: bytes) -> int:
    opened = server.handlers["file_write_open"]({"path": path})
    server.handlers["file_write_chunk"]({"handle": opened["handle"], "data": data})
    size: int = server.handlers["file_write_close"]({"handle": opened["handle"], "commit": True})
    return size


@pytest.mark.parametrize("path", ["secret", "out/secret", "inside/up/secret"])
def test_links_out_of_the_workdir_are_refused(server: FileServer, path: str) -> None:
    with pytest.raises(PathRefused, match="symbolic link"):
        _read(server, path)
    with pytest.raises(PathRefused):
        server.handlers["file_delete"]({"path": path + "/x" if path != "secret" else "out/x"})


def test_writes_through_a_linked_directory_are_refused(server: FileServer) -> None:
    with pytest.raises(PathRefused, match="symbolic link"):
        _write(server, "out/planted", b"x")
    with pytest.raises(PathRefused, match="symbolic link"):
        _write(server, "inside/up/planted", b"x")
    root = Path(server.jail.root).parent / "outside"
    assert sorted(p.name for p in root.iterdir()) == ["secret"]


def test_a_write_at_a_link_replaces_the_link(server: FileServer) -> None:
    assert _write(server, "secret", b"mine") == 4
    work = Path(server.jail.root)
    assert not (work / "secret").is_symlink() and (work / "secret").read_bytes() == b"mine"
    assert (work.parent / "outside" / "secret").read_bytes() == b"host secret"


def test_inside_links_follow_the_mode(server: FileServer) -> None:
    assert _read(server, "inside/ok.txt") == b"fine"
    if server.jail.mode == "openat2":
        assert _read(server, "alias/ok.txt") == b"fine"  # stays beneath: allowed
    else:
        with pytest.raises(PathRefused):
            _read(server, "alias/ok.txt")  # the walk refuses every link


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a\x00", "", ".", "a/../../b"])
def test_bad_paths(server: FileServer, path: str) -> None:
    with pytest.raises(PathRefused):
        _read(server, path)


def test_listing_never_follows_links(server: FileServer) -> None:
    rows = server.handlers["file_list"]({"glob": "**/*"})
    paths = {row["path"]: row["is_dir"] for row in rows}
    assert paths == {
        "alias": False,
        "inside": True,
        "inside/ok.txt": False,
        "inside/up": False,
        "out": False,
        "secret": False,
    }
    assert files.normalize("a//./b/") == "a/b"


@pytest.mark.parametrize("mode", ["openat2", "walk"])
@pytest.mark.parametrize(
    ("path", "kind"),
    [("proc/cpuinfo", "procfs"), ("sys/kernel/mm/transparent_hugepage/enabled", "sysfs")],
)
def test_files_of_kernel_interfaces_are_refused(mode: str, path: str, kind: str) -> None:
    """Issue 26: a procfs or sysfs file is regular and reports size 0 or 4096 whatever it
    holds; it is refused by its filesystem (``fstatfs``), whatever its size. (A workdir at /
    reaches them without a link.)"""
    if not os.path.isfile("/" + path):
        pytest.skip(f"/{path} is not here")
    server = FileServer("/")
    if mode == "walk":
        server.jail._openat2 = None
    with pytest.raises(PathRefused, match=f"a file of {kind}, a kernel interface"):
        server.handlers["file_read_open"]({"path": path})
    for share in (True, False):
        opened = server.handlers["file_read_open"]({"path": "etc/hostname", "share": share})
        server.handlers["file_read_close"]({"handle": opened["handle"]})  # data files still are
    proc = os.open("/proc", os.O_RDONLY)
    try:
        assert files.filesystem_type(proc) == 0x9FA0  # PROC_SUPER_MAGIC
    finally:
        os.close(proc)


def test_a_read_ends_at_the_size_the_file_had_when_opened(tmp_path: Path) -> None:
    """Issue 26: the host refuses every byte past the size reported at open, so the kernel
    never sends one: a file that grows meanwhile is cut there."""
    (tmp_path / "f").write_bytes(b"0123456789")
    server = FileServer(str(tmp_path))
    opened = server.handlers["file_read_open"]({"path": "f"})
    assert opened["size"] == 10
    with open(tmp_path / "f", "ab") as more:
        more.write(b"grown" * 1000)
    chunk = server.handlers["file_read_chunk"]
    assert bytes(chunk({"handle": opened["handle"], "size": 4})) == b"0123"
    assert bytes(chunk({"handle": opened["handle"], "size": 1 << 20})) == b"456789"
    assert chunk({"handle": opened["handle"], "size": 1 << 20}) == b""
    server.handlers["file_read_close"]({"handle": opened["handle"]})
