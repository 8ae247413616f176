"""The workdir's files, served to the host: the kernel end of ``kernel.files``.

Every path the host names is relative to the kernel's workdir (its working directory at boot)
and is checked by :func:`normalize`: no NUL, not absolute, no ``..`` component, not the workdir
itself. It is then resolved *beneath* the workdir, never by a plain ``open`` of a joined path:

* with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`` (Linux 5.6 or later, through
  ctypes), which follows a symbolic link only while it stays inside the workdir and refuses one
  that leads out (``EXDEV``);
* else component by component with ``openat`` and ``O_NOFOLLOW`` from a directory fd, which
  refuses every symbolic link on the way.

A write goes to a fresh hidden name in the target's directory and is renamed over the target
when the host commits it, or unlinked when the host aborts: a reader never sees half a file.
Standard library only; imported on the first file request (ctypes is not cheap).

Errors are raised as the exception classes below; the runtime answers them by class name, and
the host turns the name into a :class:`~sunroom.errors.FileError` with the matching reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_PATH = 4096
"""Longest path (characters) a file request may name."""

MAX_GLOB = 1024
"""Longest glob pattern a listing may use."""

MAX_LIST = 10_000
"""Most entries a listing returns; more is an error (narrow the glob)."""

MAX_HANDLES = 64
"""Most transfers open at once in one kernel."""

UPLOAD_PREFIX = ".sunroom-upload-"
"""Start of the hidden name a write goes to before it is committed (never listed)."""

PSEUDO_FILESYSTEMS = {
    0x9FA0: "procfs",
    0x62656572: "sysfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0xCAFE4A11: "bpf",
    0x62656570: "configfs",
    0x6165676C: "pstore",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs",
    0x42494E4D: "binfmt_misc",
}
"""Kernel interfaces that look like regular files (``statfs``'s ``f_type`` to a name).

Their files are no data: most report size 0 or 4096 whatever they hold, some produce output
without end or change what they say by who reads them. Neither the kernel runtime serves
them (:meth:`FileServer.read_open`) nor the host takes a descriptor of one
(:func:`sunroom.sandbox.fdtake.take`)."""

_STATFS_BYTES = 256  # more than ``struct statfs`` on every Linux ABI (120 bytes on 64-bit)

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every architecture with the unified syscall table
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class PathRefused(Exception):
    """The path is not allowed: absolute, ``..``, NUL, or it leads out of the workdir."""


class NotFound(Exception):
    """Nothing exists at the path."""


class IsDirectory(Exception):
    """The path names a directory where a file is needed."""


class NotDirectory(Exception):
    """A component of the path is a file where a directory is needed."""


class NoSpace(Exception):
    """The workdir (or the kernel's file size limit) has no room for the data."""


class TooMany(Exception):
    """Too many entries match, or too many transfers are open."""


class FileOpFailed(Exception):
    """Another operating system error."""


def normalize(path: object) -> str:
    """*path* as ``a/b/c`` (no empty or ``.`` parts). Raises PathRefused (one sentence)."""
    if type(path) is not str:
        raise PathRefused("the path must be a string")
    if "\x00" in path:
        raise PathRefused("the path must not contain a NUL character")
    if len(path) > MAX_PATH:
        raise PathRefused(f"the path must be at most {MAX_PATH} characters")
    if path.startswith("/"):
        raise PathRefused("the path must be relative to the workdir, not absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("the path must not contain a '..' component")
    if not parts:
        raise PathRefused("the path must name something inside the workdir, not the workdir")
    return "/".join(parts)


def filesystem_type(fd: int) -> int:
    """The filesystem *fd* is on: ``fstatfs(fd).f_type``, its magic number.

    ``os.fstatvfs`` has no ``f_type``, so this calls libc's ``fstatfs`` through ctypes (the
    field opens ``struct statfs`` on every Linux ABI, as wide as a C ``long``). Raises OSError
    when the call fails, or ENOSYS when there is no ctypes or no ``fstatfs`` to call.
    """
    try:
        import ctypes

        fstatfs = ctypes.CDLL(None, use_errno=True).fstatfs
    except (ImportError, OSError, AttributeError):
        raise OSError(errno.ENOSYS, "fstatfs is not available") from None
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    if fstatfs(ctypes.c_int(fd), buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF  # the magics are 32-bit


def pseudo_filesystem(fd: int) -> str | None:
    """The name of the kernel interface (:data:`PSEUDO_FILESYSTEMS`) *fd* is on, or None."""
    return PSEUDO_FILESYSTEMS.get(filesystem_type(fd))


def _openat2_function(root: str) -> Callable[[int, str, int, int], int] | None:
    """A caller of ``openat2`` with the jail's resolve flags, or None where there is none."""
    if not hasattr(os, "O_PATH"):
        return None
    try:
        import ctypes
        import struct
    except ImportError:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    resolve = _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS

    def openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
        how = ctypes.create_string_buffer(struct.pack("=QQQ", flags, mode, resolve), 24)
        fd = syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            how,
            ctypes.c_size_t(24),
        )
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(fd)

    try:
        probe = os.open(root, _DIR_FLAGS)
    except OSError:
        return None  # every operation will say why the workdir cannot be opened
    try:
        os.close(openat2(probe, ".", _DIR_FLAGS, 0))
    except OSError:  # ENOSYS (old kernel), EPERM (a seccomp filter): walk instead
        return None
    finally:
        os.close(probe)
    return openat2


class Jail:
    """Opens paths beneath one directory, *root* (an absolute path, opened per operation)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._openat2 = _openat2_function(root)

    @property
    def mode(self) -> str:
        """``"openat2"`` or ``"walk"``: how paths are resolved here."""
        return "openat2" if self._openat2 is not None else "walk"

    def open_root(self) -> int:
        """An ``O_PATH`` fd of the workdir itself."""
        return os.open(self.root, _DIR_FLAGS | os.O_NOFOLLOW)

    def open(self, dir_fd: int, rel: str, flags: int, mode: int = 0) -> int:
        """Open *rel* (normalized) beneath *dir_fd*; raises OSError (EXDEV/ELOOP: an escape)."""
        flags |= os.O_CLOEXEC
        if self._openat2 is not None:
            return self._openat2(dir_fd, rel, flags, mode if flags & os.O_CREAT else 0)
        parts = rel.split("/")
        cur = dir_fd
        try:
            for name in parts[:-1]:
                nxt = self._step(cur, name, _DIR_FLAGS | os.O_NOFOLLOW, 0)
                if cur != dir_fd:
                    os.close(cur)
                cur = nxt
            return self._step(cur, parts[-1], flags | os.O_NOFOLLOW, mode)
        finally:
            if cur != dir_fd:
                os.close(cur)

    @staticmethod
    def _step(dir_fd: int, name: str, flags: int, mode: int) -> int:
        try:
            return os.open(name, flags, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    raise exc from None
                if stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ELOOP, "a symbolic link on the path") from None
            raise

    def directory(self, root_fd: int, parts: list[str], *, create: bool) -> int:
        """An ``O_PATH`` fd of the directory *parts* beneath *root_fd*, made when *create*."""
        if not parts:
            return os.dup(root_fd)
        try:
            return self.open(root_fd, "/".join(parts), _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
        parent = self.directory(root_fd, parts[:-1], create=True)
        try:
            with contextlib.suppress(FileExistsError):  # made meanwhile, or a link: refused below
                os.mkdir(parts[-1], 0o755, dir_fd=parent)
            return self.open(parent, parts[-1], _DIR_FLAGS)
        finally:
            os.close(parent)


def _translate(error: OSError) -> Exception:
    """The exception the host is told about for *error* (one sentence, no host paths)."""
    code = error.errno
    if code in (errno.EXDEV, errno.ELOOP):
        return PathRefused("the path leads out of the workdir through a symbolic link")
    if code == errno.ENOENT:
        return NotFound("no such file or directory in the workdir")
    if code == errno.EISDIR:
        return IsDirectory("the path names a directory, not a file")
    if code == errno.ENOTDIR:
        return NotDirectory("a component of the path is a file, not a directory")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return NoSpace("the workdir has no room for the file (its size limit is reached)")
    if code == errno.EEXIST:
        return FileOpFailed("something already exists at the path")
    return FileOpFailed(f"the file operation failed: {os.strerror(code or 0)}")


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a glob over ``/``-separated paths: ``**`` spans directories, ``*`` not."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


class _Upload:
    __slots__ = ("dir_fd", "fd", "name", "temp", "written")

    def __init__(self, dir_fd: int, fd: int, name: str, temp: str) -> None:
        self.dir_fd, self.fd, self.name, self.temp, self.written = dir_fd, fd, name, temp, 0


class _Read:
    __slots__ = ("fd", "left")

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left = fd, size  # left: the bytes still to send of the size at open


class FileServer:
    """The ``file_*`` requests of one kernel, over the workdir *root*."""

    def __init__(self, root: str) -> None:
        self.jail = Jail(root)
        self._uploads: dict[int, _Upload] = {}
        self._reads: dict[int, _Read] = {}
        self._read_buf: bytearray | None = None  # reused by every read while one is open
        self._next = 0
        self.handlers: dict[str, Callable[[Any], Any]] = {
            "file_write_open": self._guarded(self.write_open),
            "file_write_chunk": self._guarded(self.write_chunk),
            "file_write_close": self._guarded(self.write_close),
            "file_read_open": self._guarded(self.read_open),
            "file_read_chunk": self._guarded(self.read_chunk),
            "file_read_close": self._guarded(self.read_close),
            "file_list": self._guarded(self.list),
            "file_delete": self._guarded(self.delete),
        }

    @staticmethod
    def _guarded(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(params: object) -> object:
            if type(params) is not dict:
                raise FileOpFailed("the request's params must be a map")
            try:
                return handler(params)
            except OSError as exc:
                raise _translate(exc) from None

        return run

    def _handle(self) -> int:
        if len(self._uploads) + len(self._reads) >= MAX_HANDLES:
            raise TooMany(f"at most {MAX_HANDLES} transfers may be open at once")
        self._next += 1
        return self._next

    # -- writing -------------------------------------------------------------------------------

    def write_open(self, params: dict[str, object]) -> dict[str, int]:
        """Start a write to ``path``: a hidden temporary file in its (created) directory."""
        parts = normalize(params.get("path")).split("/")
        handle = self._handle()
        root = self.jail.open_root()
        try:
            dir_fd = self.jail.directory(root, parts[:-1], create=True)
        finally:
            os.close(root)
        temp = UPLOAD_PREFIX + secrets.token_hex(8)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o644, dir_fd=dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        self._uploads[handle] = _Upload(dir_fd, fd, parts[-1], temp)
        return {"handle": handle}

    def _upload(self, params: dict[str, Any]) -> _Upload:
        upload = self._uploads.get(params.get("handle"))  # type: ignore[arg-type]
        if upload is None:
            raise FileOpFailed("no write is open with that handle")
        return upload

    def write_chunk(self, params: dict[str, object]) -> int:
        """Append ``data`` (bytes) to an open write; the bytes written so far."""
        upload = self._upload(params)
        data = params.get("data")
        if type(data) is not bytes:
            raise FileOpFailed("the data of a write must be bytes")
        view = memoryview(data)
        while view:
            view = view[os.write(upload.fd, view) :]
        upload.written += len(data)
        return upload.written

    def write_close(self, params: dict[str, Any]) -> int:
        """Commit (rename over the target) or abort (unlink) a write; the file's size."""
        upload = self._upload(params)
        del self._uploads[params["handle"]]
        try:
            os.close(upload.fd)
            if params.get("commit") is True:
                os.rename(
                    upload.temp, upload.name, src_dir_fd=upload.dir_fd, dst_dir_fd=upload.dir_fd
                )
                return upload.written
            os.unlink(upload.temp, dir_fd=upload.dir_fd)
            return 0
        except BaseException:
            with contextlib.suppress(OSError):  # renamed or never made: nothing is left either way
                os.unlink(upload.temp, dir_fd=upload.dir_fd)
            raise
        finally:
            os.close(upload.dir_fd)

    # -- reading -------------------------------------------------------------------------------

    def read_open(self, params: dict[str, object]) -> dict[str, int]:
        """Open ``path`` for reading; its handle and size.

        The size is the file's when it was opened, and the read never goes past it
        (:meth:`read_chunk`): the host refuses every byte past it as a broken protocol. A file
        of a kernel interface (procfs, sysfs, ...: :data:`PSEUDO_FILESYSTEMS`, found with
        ``fstatfs``, never by its size) is refused (PathRefused): its size says nothing of
        what reading it gives. The host checks the same for a descriptor it takes (the share
        below), because this check runs in the kernel, which the host does not trust; here it
        turns such a file into a clear error instead of a read cut at a meaningless size.

        With ``share: true`` the answer also holds ``fd``, the number of this process's own
        descriptor of the file (open until ``file_read_close``), and the file's ``dev`` and
        ``ino``: the host may take that descriptor with ``pidfd_getfd`` and send the file from
        it (:mod:`sunroom.sandbox.fdtake`). The path was resolved here, in the jail, either way.
        """
        rel = normalize(params.get("path"))
        handle = self._handle()
        root = self.jail.open_root()
        try:
            fd = self.jail.open(root, rel, os.O_RDONLY | os.O_NONBLOCK)
        finally:
            os.close(root)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsDirectory("the path names a directory, not a file")
            if not stat.S_ISREG(st.st_mode):
                raise FileOpFailed("the path names something that is not a regular file")
            kind = pseudo_filesystem(fd)
            if kind is not None:
                raise PathRefused(f"the path names a file of {kind}, a kernel interface, not data")
        except BaseException:
            os.close(fd)
            raise
        self._reads[handle] = _Read(fd, st.st_size)
        if params.get("share") is True:
            return {
                "handle": handle,
                "size": st.st_size,
                "fd": fd,
                "dev": st.st_dev,
                "ino": st.st_ino,
            }
        return {"handle": handle, "size": st.st_size}

    def read_chunk(self, params: dict[str, Any]) -> bytes | memoryview:
        """Up to ``size`` more bytes of an open read (``b""`` at the end, or at the opened size).

        The bytes are read into one buffer kept while reads are open, and returned as a view of
        it: the answer is sent (without copying it) before the next request is read.
        """
        read = self._reads.get(params.get("handle"))  # type: ignore[arg-type]
        size = params.get("size")
        if read is None:
            raise FileOpFailed("no read is open with that handle")
        if type(size) is not int or size <= 0:
            raise FileOpFailed("the size of a read must be a positive int")
        size = min(size, read.left)  # a file that grew meanwhile is cut at its opened size
        if not size:
            return b""
        buf = self._read_buf
        if buf is None or len(buf) < size:
            self._read_buf = buf = bytearray(size)
        view = memoryview(buf)[:size]
        got = os.readv(read.fd, [view])
        read.left -= got
        return view[:got] if got else b""

    def read_close(self, params: dict[str, Any]) -> None:
        """Close an open read."""
        read = self._reads.pop(params.get("handle"), None)  # type: ignore[arg-type]
        if read is not None:
            os.close(read.fd)
        if not self._reads:
            self._read_buf = None

    # -- listing and deleting -------------------------------------------------------------------

    def list(self, params: dict[str, object]) -> list[dict[str, object]]:
        """Entries (files, directories, links) whose workdir-relative path matches ``glob``."""
        pattern = params.get("glob", "**/*")
        if type(pattern) is not str or len(pattern) > MAX_GLOB or "\x00" in pattern:
            raise PathRefused(f"the glob must be a string of at most {MAX_GLOB} characters")
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise PathRefused("the glob must be relative to the workdir and not contain '..'")
        regex = _glob_regex(pattern)
        out: list[dict[str, Any]] = []
        root = os.open(self.jail.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for top, dirs, files, dir_fd in os.fwalk(".", dir_fd=root):
                base = "" if top == "." else top[2:] + "/"
                for name in dirs + files:
                    if name.startswith(UPLOAD_PREFIX):
                        continue
                    rel = base + name
                    if not regex.fullmatch(rel):
                        continue
                    try:
                        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    if len(out) >= MAX_LIST:
                        raise TooMany(f"more than {MAX_LIST} entries match; narrow the glob")
                    out.append(
                        {
                            "path": rel,
                            "size": st.st_size,
                            "mtime": st.st_mtime,
                            "is_dir": stat.S_ISDIR(st.st_mode),
                        }
                    )
        finally:
            os.close(root)
        out.sort(key=lambda row: row["path"])
        return out

    def delete(self, params: dict[str, object]) -> None:
        """Remove the file, link or directory tree at ``path`` (a link, never its target)."""
        parts = normalize(params.get("path")).split("/")
        root = self.jail.open_root()
        try:
            parent = self.jail.directory(root, parts[:-1], create=False)
        finally:
            os.close(root)
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                import shutil

                readable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
                try:
                    shutil.rmtree(parts[-1], dir_fd=readable)
                finally:
                    os.close(readable)
            else:
                os.unlink(parts[-1], dir_fd=parent)
        finally:
            os.close(parent)
