"""The compiled watcher (``sunroom-watch``): building it, and choosing it for a kernel.

Every kernel's supervisor forks the runtime and then watches it to its end
(:mod:`sunroom.prelude.watch`). Where ``sunroom/prelude/sunroom-watch`` was built, the
supervisor then replaces itself with it, a static C program of a few pages built from
``watch.c``; an idle kernel then holds one interpreter instead of two (docs/design.md, "The
watcher"). The wheel carries it, built by ``setup.py``; a checkout builds it with
``scripts/setup.sh``. Where it was not built (no C compiler at install), or with
``SUNROOM_WATCHER=python`` in the host's environment, the supervisor watches in Python: the
same contract, the same tests, about 1.8 MB more per kernel.
"""

from __future__ import annotations

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


def build(out: Path, *, compiler: str | None = None) -> str | None:
    """Compile ``watch.c`` into *out* (static where the C library allows, else dynamic).

    Returns None on success, else one sentence saying why it could not be built (no C
    compiler, or the compiler's first error line); *out* is then left as it was. The file is
    written beside *out* and renamed into place, mode 0755.
    """
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc or gcc) was found; install one (e.g. apt install gcc)"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    os.close(fd)
    why = "the compiler failed"
    try:
        for link in (["-static"], []):
            try:
                done = subprocess.run(
                    [cc, *_FLAGS, *link, "-o", tmp, str(SOURCE)],
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


def stale(out: Path = BUILT) -> bool:
    """Whether *out* is missing or older than ``watch.c``."""
    try:
        return out.stat().st_mtime < SOURCE.stat().st_mtime
    except FileNotFoundError:
        return True


def main(argv: list[str] | None = None) -> int:
    """Build the watcher in place when stale (``--force``: always); what ``scripts/setup.sh`` runs.

    Prints one line; exits 0 when the watcher is in place (or was already), 1 when it could
    not be built (kernels then watch in Python).
    """
    force = "--force" in (argv if argv is not None else sys.argv[1:])
    if not force and not stale():
        print(f"watcher: {BUILT} is up to date")
        return 0
    why = build(BUILT)
    if why is None:
        print(f"watcher: built {BUILT}")
        return 0
    print(f"watcher: not built ({why}); kernels will watch in Python", file=sys.stderr)
    return 1
