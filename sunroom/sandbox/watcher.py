"""The compiled watcher and launcher (``sunroom-watch``, ``sunroom-launch``): build, choose.

Every kernel's supervisor forks the runtime and then watches it to its end
(:mod:`sunroom.prelude.watch`). Where ``sunroom/prelude/sunroom-watch`` was built, the
supervisor then replaces itself with it, a static C program of a few pages built from
``watch.c``; an idle kernel then holds one interpreter instead of two (docs/design.md, "The
watcher"). Where ``sunroom/prelude/sunroom-launch`` was built (from ``launch.c``), a host
that is root starts a local kernel's first program through it: it drops to the kernel's uid
and waits at the kernel's cgroup gate in one exec, where ``setpriv`` and a shell gate took
two (docs/design.md, "The launcher"). The wheel carries both, built by ``setup.py``; a
checkout builds them with ``scripts/setup.sh``. Where they were not built (no C compiler at
install), or with ``SUNROOM_WATCHER=python`` in the host's environment, the supervisor
watches in Python (the same contract, the same tests, about 1.8 MB more per kernel) and the
host drops to the kernel's uid with ``setpriv`` and gates in ``sh``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

COMPILED_NAME: Final = "sunroom-watch"
"""The compiled watcher's file name beside ``watch.c`` (``sunroom.prelude.watch`` says it too:
this module imports nothing of sunroom's at its top, for ``setup.py`` loads it by path)."""
PRELUDE: Final = Path(__file__).resolve().parents[1] / "prelude"
SOURCE: Final = PRELUDE / "watch.c"
BUILT: Final = PRELUDE / COMPILED_NAME
LAUNCHER_NAME: Final = "sunroom-launch"
LAUNCH_SOURCE: Final = PRELUDE / "launch.c"
LAUNCHER: Final = PRELUDE / LAUNCHER_NAME
PROGRAMS: Final = ((SOURCE, BUILT), (LAUNCH_SOURCE, LAUNCHER))
"""Each compiled program's source and where it is built in the package."""
ENV_CHOICE: Final = "SUNROOM_WATCHER"
_FLAGS: Final = ("-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11")


def watch_config() -> dict[str, object]:
    """The supervisor config keys that choose its watcher (see the module docstring)."""
    choice = os.environ.get(ENV_CHOICE, "")
    if choice not in ("", "python", "compiled"):
        from sunroom.errors import UsageError

        raise UsageError(
            f"{ENV_CHOICE}, which chooses each kernel's watcher, may be 'compiled' (the "
            f"default) or 'python', not {choice!r}"
        )
    return {"python_watch": True} if choice == "python" else {}


def compiled_launcher() -> str | None:
    """The compiled launcher's path; None where it was not built or the choice is ``python``.

    The host then drops to a kernel's uid with ``setpriv`` and gates in a shell (see the
    module docstring).
    """
    if os.environ.get(ENV_CHOICE, "") == "python":
        return None
    return str(LAUNCHER) if os.access(LAUNCHER, os.X_OK) else None


def build(out: Path, *, compiler: str | None = None, source: Path = SOURCE) -> str | None:
    """Compile *source* (``watch.c`` unless told) into *out*, static where libc allows.

    Returns None on success, else one sentence saying why it could not be built (no C
    compiler, or the compiler's first error line); *out* is then left as it was. The file is
    written beside *out* and renamed into place, mode 0755. Its ELF build id is the SHA-256 of
    *source*, which is how :func:`stale` knows what it was built from.
    """
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc or gcc) was found; install one (e.g. apt install gcc)"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    os.close(fd)
    build_id = f"-Wl,--build-id=0x{_digest(source).hex()}"
    why = "the compiler failed"
    try:
        for link in (["-static"], []):
            try:
                done = subprocess.run(
                    [cc, *_FLAGS, *link, build_id, "-o", tmp, str(source)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
            except OSError as exc:
                return f"the C compiler {cc} could not be run ({exc.strerror or exc})"
            if done.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, out)
                return None
            lines = done.stderr.strip().splitlines()
            why = f"{cc} failed: {lines[0] if lines else f'exit status {done.returncode}'}"
        return why
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def stale(out: Path = BUILT, source: Path = SOURCE) -> bool:
    """Whether *out* is missing or was not built from *source* as it is now (``watch.c``).

    By content, not by time: :func:`build` makes the source's SHA-256 the program's build id,
    and an installer (pip sets every file's time to when it wrote it) or a checkout cannot
    make a program built from the same source look stale, nor an edited source look built.
    """
    try:
        program = out.read_bytes()
    except FileNotFoundError:
        return True
    return _digest(source) not in program


def _digest(source: Path) -> bytes:
    return hashlib.sha256(source.read_bytes()).digest()


def build_all(*, force: bool = False) -> int:
    """Build each compiled program in place when stale (*force*: always).

    What ``sunroom build-helpers`` runs (``scripts/setup.sh`` too). Prints one line per
    program; returns 0 when both are in place (or were already), 1 when one could not be
    built (kernels then watch in Python, or start through ``setpriv``).
    """
    code = 0
    for source, out in PROGRAMS:
        if not force and not stale(out, source):
            print(f"compiled: {out} is up to date")
            continue
        why = build(out, source=source)
        if why is None:
            print(f"compiled: built {out}")
            continue
        print(f"compiled: {out.name} not built ({why})", file=sys.stderr)
        code = 1
    return code
