"""Whether a descriptor is ready to read, for any descriptor number.

``select.select`` refuses descriptors from 1024 up (``FD_SETSIZE``: "filedescriptor out of
range in select()"), and a host running a thousand kernels holds four thousand; ``poll`` has
no such limit. Used where the host looks at a status pipe, a pidfd or bubblewrap's info pipe
without the event loop.
"""

from __future__ import annotations

import errno
import os
import select

_READY = select.POLLIN | select.POLLHUP | select.POLLERR


def readable(fd: int, within_s: float = 0.0) -> bool:
    """Whether *fd* is readable (data, end of file or an error) within *within_s* seconds.

    Raises OSError (``EBADF``) when *fd* is not open.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    events = poller.poll(max(0, int(within_s * 1000)))
    for _, event in events:
        if event & select.POLLNVAL:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if event & _READY:
            return True
    return False
