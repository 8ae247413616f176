"""``readable`` works for descriptors from 1024 up, where ``select.select`` refuses them."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
from collections.abc import Iterator

import pytest

from sunroom.sandbox.fdready import readable

HIGH = 1500  # above FD_SETSIZE (1024), as on a host with a thousand kernels


@pytest.fixture
def high_pipe() -> Iterator[tuple[int, int]]:
    """A pipe whose read end is descriptor HIGH (the soft fd limit raised for it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > HIGH, "the hard fd limit is too low here"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))
    r, w = os.pipe()
    os.dup2(r, HIGH)
    os.close(r)
    try:
        yield HIGH, w
    finally:
        for fd in (HIGH, w):
            with contextlib.suppress(OSError):  # a test closed it already
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_descriptor_above_fd_setsize_is_polled(high_pipe: tuple[int, int]) -> None:
    r, w = high_pipe
    with pytest.raises(ValueError, match="out of range"):
        select.select([r], [], [], 0)  # what the host used before
    assert not readable(r)
    assert not readable(r, 0.05)
    os.write(w, b"x")
    assert readable(r)
    assert os.read(r, 1) == b"x"
    os.close(w)
    assert readable(r, 1.0)  # end of file is readable too
    assert os.read(r, 1) == b""


def test_a_closed_descriptor_is_an_error(high_pipe: tuple[int, int]) -> None:
    r, _ = high_pipe
    os.close(r)
    with pytest.raises(OSError, match="Bad file descriptor") as info:
        readable(r)
    assert info.value.errno == errno.EBADF
