"""``prctl(2)`` for the kernel's own processes: the options its supervisors and runtimes set.

Kernel side: standard library only. The call goes through ``_ctypes``, the C half of
``ctypes``, directly: the ``ctypes`` package itself (and its ``struct`` and endianness
modules) cost every kernel's start ~0.8 ms for the three lines of it used here.
"""

from __future__ import annotations

import _ctypes
import os

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


TYPE_CHECKING = False
if TYPE_CHECKING:
    _SimpleInt = _ctypes._SimpleCData[int]  # generic in the stubs only
else:
    _SimpleInt = _ctypes._SimpleCData


class _CInt(_SimpleInt):
    """C ``int``, prctl's return type (what ``ctypes.c_int`` is)."""

    _type_ = "i"


class _ThisProcess:
    """The symbols of this process, libc's among them (what ``ctypes.CDLL(None)`` holds)."""

    _handle = _ctypes.dlopen(None, os.RTLD_LOCAL)  # type: ignore[arg-type]  # None: ourselves


class _CFunction(_ctypes.CFuncPtr):
    """A C function returning int that sets errno (``ctypes.CFUNCTYPE(c_int, use_errno=True)``)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _CInt


_PRCTL = _CFunction(("prctl", _ThisProcess))  # type: ignore[arg-type]  # has a _handle


def prctl(option: int, value: int) -> None:
    """Set *option* to *value* for this process; raises OSError when the kernel refuses."""
    if _PRCTL(option, value, 0, 0, 0) != 0:
        raise OSError(_ctypes.get_errno(), f"prctl({option}) failed")
