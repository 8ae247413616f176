"""How sunroom starts a Jupyter kernel written in Python, with ipykernel's TCP pipe off.

``python -m sunroom.prelude.jupyter_main MODULE ARGS...`` runs ``python -m MODULE ARGS...``
(``ipykernel_launcher``, ``bash_kernel``, ...) with one change.

Kernels built on ipykernel start an IOPub thread that binds a TCP socket on 127.0.0.1 so that
*forked* children (``multiprocessing`` with fork) can send their ``print`` output back. In
sunroom's sandboxes the seccomp filter refuses every socket that is not ``AF_UNIX``, and libzmq
then aborts the kernel instead of failing the bind. Here that pipe is off from the start, as
ipykernel itself leaves it when the bind fails: what forked children write to fd 1/2 is still
captured; only their Python-level ``print`` to the parent's stream objects is lost. Imports only
the standard library until it runs; then ipykernel, if the kernel's environment has it.
"""

from __future__ import annotations

import runpy
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _no_pipe(thread: Any) -> None:
    thread._pipe_flag = False  # what ipykernel does when it cannot bind the pipe


def main() -> None:
    """Run the kernel module named by ``sys.argv[1]`` as ``__main__``, the pipe off."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m sunroom.prelude.jupyter_main MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    try:
        from ipykernel import iostream  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        pass  # not an ipykernel kernel: nothing to change
    else:
        iostream.IOPubThread._setup_pipe_in = _no_pipe  # type: ignore[method-assign, unused-ignore]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
