"""Taking a kernel's open file into this process with ``pidfd_getfd`` (Linux 5.6 or later).

The download route sends a workdir file with ``sendfile`` instead of through the kernel's
channel. The host still never resolves a workdir path itself: the kernel opens the file
through its jail (:mod:`sunroom.prelude.files`, ``openat2(RESOLVE_BENEATH)`` or the walk) and
names its descriptor, and the host duplicates that descriptor out of the kernel's runtime.
What the host gets is the kernel's own open file description, with the access mode it was
opened with, so it can read through it only what the kernel could have read and sent over the
channel itself: a link planted by kernel code was resolved (or refused) inside the jail, and a
file renamed, replaced or relinked afterwards does not change what the descriptor reads.

The kernel is not trusted: :func:`take` refuses (ProtocolError) a descriptor that is not
open for reading, not a regular file, not the file (device and inode) the kernel said it
opened, or a file of a kernel interface (procfs, sysfs, debugfs, securityfs, cgroup, ...:
:data:`~sunroom.prelude.files.PSEUDO_FILESYSTEMS`). That last check is made here, on the
host, with ``fstatfs`` of the taken descriptor: this process holds the descriptor and trusts
no answer of the kernel about it, and such a file's size (0 or 4096, whatever it holds) says
nothing of what reading it gives, so a size check would not catch it. (The kernel runtime
refuses to open one too, so an honest kernel never names one.)

Taking needs ptrace access to the runtime (the host runs as root or as the kernel's owner);
:func:`available` says whether this process can take descriptors at all.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
from functools import cache
from typing import Final

from sunroom.errors import ProtocolError
from sunroom.prelude.files import pseudo_filesystem

__all__ = ["available", "take"]

_SYS_PIDFD_GETFD: Final = 438
"""The syscall's number: the same on every architecture with the unified syscall table."""


def _getfd(pidfd: int, fd: int) -> int:
    """``pidfd_getfd(pidfd, fd, 0)``: a close-on-exec duplicate of *fd* of the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    got = syscall(
        ctypes.c_long(_SYS_PIDFD_GETFD), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0)
    )
    if got < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(got)


@cache
def available() -> bool:
    """Whether this process can take descriptors (probed once, on a pipe of its own)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    read_end, write_end = os.pipe()
    try:
        os.close(_getfd(pidfd, read_end))
    except OSError:  # ENOSYS (an old kernel), EPERM (a seccomp filter, no ptrace access)
        return False
    finally:
        for fd in (pidfd, read_end, write_end):
            os.close(fd)
    return True


def take(pid: int, fd: int, *, dev: int, ino: int) -> int:
    """A duplicate, in this process, of the descriptor *fd* of the process *pid*.

    *dev* and *ino* are what the kernel said the file is. Raises OSError when the descriptor
    cannot be taken (the process is gone, no ptrace access) and ProtocolError when it is not
    a regular file open for reading with that device and inode, or when it is a file of a
    kernel interface (procfs, sysfs, ...; found with ``fstatfs``).
    """
    pidfd = os.pidfd_open(pid)
    try:
        got = _getfd(pidfd, fd)
    finally:
        os.close(pidfd)
    try:
        st = os.fstat(got)
        mode = fcntl.fcntl(got, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_PATH)
        if mode not in (os.O_RDONLY, os.O_RDWR):
            raise ProtocolError("the kernel named a file descriptor that is not open for reading")
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (dev, ino):
            raise ProtocolError("the kernel named a file descriptor that is not the file it opened")
        kind = pseudo_filesystem(got)
        if kind is not None:
            raise ProtocolError(f"the kernel named a file descriptor of {kind}, not a data file")
    except BaseException:
        os.close(got)
        raise
    return got
