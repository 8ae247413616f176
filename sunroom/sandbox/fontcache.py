"""matplotlib's font cache for bwrap kernels, built once per host and mounted read-only.

matplotlib keeps the fonts it found (``fontlist-vNNN.json``, absolute paths) in its cache
directory and, when there is none, scans every font file and runs ``fc-list`` (about 0.2-1 s,
more with many fonts). A kernel's home is its fresh workdir, so every kernel's first figure used
to pay that scan, and inside bwrap ``fc-list`` printed ``Fontconfig error: Cannot load default
config file`` to stderr (no ``/etc/fonts`` in the sandbox).

Now :data:`FONT_DIRS` are bound read-only into bwrap kernels (fontconfig's configuration and
system cache: public, no secrets), and :func:`font_cache` builds matplotlib's cache **once** in
a bubblewrap sandbox with the kernels' own layout (the same binds, so the paths it records are
the paths kernels see), into a private directory of this user under the temp dir. Each kernel
then gets ``MPLCONFIGDIR=/tmp/matplotlib`` (inside its own ``/tmp`` tmpfs: writable, private)
with the cache file bound **read-only** into it: nothing writable is shared between kernels.

The cache is keyed by the sandbox layout, matplotlib's version (its ``__init__.py``'s size and
mtime) and the modification times of the font directories: installing fonts or upgrading
matplotlib builds a new one. The build runs only matplotlib's own import (no model code) and is
skipped when no site-packages directory of the kernel holds matplotlib.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from sunroom.sandbox.backend import SAFE_PATH

FONT_DIRS: Final = ("/etc/fonts", "/var/cache/fontconfig")
"""Bound read-only into bwrap kernels when they exist: fontconfig's config and system cache."""

SCANNED: Final = ("/usr/share/fonts", "/usr/local/share/fonts", *FONT_DIRS)
"""Directories whose modification times key the cache (fonts installed: a new cache)."""

KERNEL_DIR: Final = "/tmp/matplotlib"
"""``MPLCONFIGDIR`` of bwrap kernels: in the kernel's private ``/tmp``."""

BUILD_TIMEOUT_S: Final = 120

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_built: dict[str, Path | None] = {}


def font_dirs() -> list[str]:
    """The bubblewrap arguments binding :data:`FONT_DIRS` read-only (those that exist)."""
    args: list[str] = []
    for path in FONT_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _has_matplotlib(site_dirs: Sequence[str]) -> str | None:
    for entry in site_dirs:
        init = Path(entry, "matplotlib", "__init__.py")
        try:
            info = init.stat()
        except OSError:
            continue
        return f"{init}:{info.st_size}:{info.st_mtime_ns}"
    return None


def _fonts_state() -> list[tuple[str, int]]:
    state: list[tuple[str, int]] = []
    for top in SCANNED:
        for root, _dirs, _files in os.walk(top):
            try:
                state.append((root, os.stat(root).st_mtime_ns))
            except OSError:
                continue
    return state


def _store() -> Path:
    """The cache directory of this user (ours, writable by us alone, not a link); made."""
    path = Path(tempfile.gettempdir()) / f"sunroom-fonts-{os.geteuid()}"
    path.mkdir(mode=0o755, exist_ok=True)  # readable: a root host's kernel uids bind from it
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(f"{path} is not a directory owned by this user and writable by it alone")
    return path


def font_cache(
    sandbox: Sequence[str], python: str, sys_path: Sequence[str], site_dirs: Sequence[str]
) -> Path | None:
    """The host path of the matplotlib font cache for kernels of this layout, or None.

    *sandbox* is the bubblewrap command with the kernels' read-only binds (system, interpreter,
    code) and nothing else; *python* the interpreter and *sys_path* the kernel's ``sys.path``
    inside; *site_dirs* the host site-packages directories bound. None when the kernels have
    no matplotlib or the build failed (logged once; kernels then build their own cache as
    matplotlib always did).
    Blocking: call it in a thread. The first call for a layout builds (about a second).
    """
    version = _has_matplotlib(site_dirs)
    if version is None:
        return None
    key = hashlib.sha256(
        json.dumps([list(sandbox), python, list(sys_path), version, _fonts_state()]).encode()
    ).hexdigest()[:32]
    with _lock:
        if key in _built:
            return _built[key]
        try:
            found = _find_or_build(key, [*sandbox, "--", python, *_import(sys_path)])
        except (OSError, subprocess.SubprocessError) as exc:
            _log.warning("matplotlib's font cache for kernels could not be built: %s", exc)
            found = None
        _built[key] = found
        return found


def _import(sys_path: Sequence[str]) -> list[str]:
    code = "import sys, json; sys.path[0:0] = json.loads(sys.argv[1]); import matplotlib.pyplot"
    return ["-I", "-S", "-c", code, json.dumps(list(sys_path))]


def _find_or_build(key: str, command: Sequence[str]) -> Path | None:
    store = _store()
    done = store / key
    if done.is_dir():
        return _cache_file(done)
    work = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=store))
    try:
        out = work / "out"
        out.mkdir()
        sandbox, run = command[: command.index("--")], command[command.index("--") :]
        argv = [
            *sandbox,
            "--bind",
            str(out),
            "/out",
            "--chdir",
            "/out",
            "--clearenv",
            "--setenv",
            "PATH",
            SAFE_PATH,
            "--setenv",
            "HOME",
            "/out",
            "--setenv",
            "MPLCONFIGDIR",
            "/out",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "MPLBACKEND",
            "agg",
            *run,
        ]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
            cwd="/",
        )
        if proc.returncode != 0:
            raise OSError(f"the build exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        final = work / "cache"
        final.mkdir()
        for f in out.glob("fontlist-v*.json"):
            shutil.copyfile(f, final / f.name)
            (final / f.name).chmod(0o644)
        final.chmod(0o755)
        with contextlib.suppress(OSError):  # a concurrent builder won: its result is as good
            final.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _cache_file(done)


def _cache_file(folder: Path) -> Path | None:
    files = sorted(folder.glob("fontlist-v*.json"))
    return files[0] if files else None
