"""Where a docker kernel's interpreter and code live when the host's are mounted in.

The offline kernel image holds almost nothing: the host's ``/usr``, top-level system
directories, the interpreter's prefix and sunroom's import path are mounted read-only
(:func:`host_layout`), so the kernel runs the host's own Python. Split out of
:mod:`sunroom.sandbox.backends.docker`.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sunroom.errors import SandboxUnavailableError
from sunroom.sandbox.backends.subprocess import installed_in_site, kernel_sys_path, package_root
from sunroom.sandbox.fontcache import FONT_DIRS

PYTHON_DIR: Final = "/opt/sunroom/python"
LIB_DIR: Final = "/opt/sunroom/lib"
SITE_DIR: Final = "/opt/sunroom/site"
_TOP_DIRS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_EXTRAS: Final = ("/etc/ld.so.cache", "/etc/alternatives", *FONT_DIRS)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the kernel's interpreter and code are inside the container."""

    python: str
    sys_path: tuple[str, ...]
    mounts: tuple[tuple[str, str], ...]  # (host source, container target), all read-only
    env: tuple[tuple[str, str], ...]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def host_layout() -> Layout:
    """The read-only host mounts, interpreter and sys.path of an offline-image kernel.

    Raises SandboxUnavailableError when the interpreter is not inside its own prefix.
    """
    mounts: list[tuple[str, str]] = [("/usr", "/usr")]
    for top in _TOP_DIRS:
        if os.path.isdir(top) and not os.path.islink(top):
            mounts.append((top, top))
    mounts += [(p, p) for p in _SYSTEM_EXTRAS if os.path.exists(p)]
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    env: list[tuple[str, str]] = []
    if _under(prefix, "/usr"):
        if not _under(exe, "/usr"):
            raise SandboxUnavailableError(f"the interpreter {exe} is outside /usr, its prefix")
        python = exe

        def inside(path: str) -> str | None:
            return path if _under(path, "/usr") else None

    else:
        if not _under(exe, prefix):
            raise SandboxUnavailableError(
                f"the interpreter {exe} is not inside its prefix {prefix}; the docker backend "
                "mounts that prefix read-only and cannot find the interpreter in it"
            )
        mounts.append((prefix, PYTHON_DIR))

        def inside(path: str) -> str | None:
            if _under(path, "/usr"):
                return path
            if _under(path, prefix):
                return PYTHON_DIR + path[len(prefix) :]
            return None

        python = PYTHON_DIR + exe[len(prefix) :]
        libdir = os.path.realpath(str(sysconfig.get_config_var("LIBDIR") or ""))
        if sysconfig.get_config_var("Py_ENABLE_SHARED") and _under(libdir, prefix):
            # the executable's RUNPATH is the absolute host prefix: point the loader inside
            env.append(("LD_LIBRARY_PATH", PYTHON_DIR + libdir[len(prefix) :]))
    sys_path = _code_paths(inside, mounts)
    return Layout(python, tuple(sys_path), tuple(mounts), tuple(env))


def _code_paths(inside: Callable[[str], str | None], mounts: list[tuple[str, str]]) -> list[str]:
    """The kernel's sys.path: the package and every entry of :func:`kernel_sys_path`.

    *inside* maps a host path to where a mount already shows it in the container (None when
    none does); the package (from a source checkout) and each entry it does not map are added
    to *mounts*.
    """
    root = os.path.realpath(package_root())
    checkout = not installed_in_site()
    sys_path: list[str] = []
    if checkout:
        # a source checkout: mount the package alone, not the whole project
        mounts.append((os.path.join(root, "sunroom"), f"{LIB_DIR}/sunroom"))
        sys_path.append(LIB_DIR)
    for i, entry in enumerate(kernel_sys_path()):
        real = os.path.realpath(entry)
        if checkout and real == root:
            continue
        target = inside(real)
        if target is None:
            target = f"{SITE_DIR}/{i}"
            mounts.append((real, target))
        if target not in sys_path:
            sys_path.append(target)
    return sys_path
