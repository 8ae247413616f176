"""``prctl(2)`` for the kernel's own processes: the options its supervisors and runtimes set.

Kernel side: standard library only.
"""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    """Set *option* to *value* for this process; raises OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
