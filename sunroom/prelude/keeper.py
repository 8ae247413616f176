"""The keeper: serves the sunroom channel beside a kernel program that cannot (bash, R, ...).

A Jupyter kernel that is not Python cannot load sunroom's runtime, yet the host still needs a
hello with the kernel's pid, the files API and a way to end the kernel. The supervisor
(:mod:`sunroom.prelude.supervisor`, exec mode without ``attach``) forks this keeper beside
the program: it says hello *for* the program (its pid, no Python version), serves the
``file_*`` requests (:mod:`sunroom.prelude.files`, rooted at the working directory), answers
``shutdown`` by ending the program, and refuses everything else with an ``Unsupported`` error.
When the host goes away (the channel closes) it kills the program with ``SIGKILL``; the
supervisor then kills everything else. Standard library and msgpack only.
"""

from __future__ import annotations

import _socket
import contextlib
import os
import signal

from sunroom.prelude import serving
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.messages import RpcError

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any


def refusal(method: str, kernel_name: str | None) -> RpcError:
    """The error every request the keeper does not serve is answered with."""
    kernel = f"the {kernel_name} Jupyter kernel" if kernel_name else "this Jupyter kernel"
    return RpcError(
        "Unsupported",
        f"{kernel} has no sunroom runtime, so it cannot serve {method!r}: host functions, "
        "inputs and variables need a Python kernel (ipykernel)",
    )


def serve(channel: BlockingChannel, kernel_pid: int, kernel_name: str | None = None) -> None:
    """Serve *channel* for the kernel program *kernel_pid* until shutdown or the host leaves.

    Returns after ``shutdown`` (answered) or when the channel closes; either way the caller
    ends the program.
    """
    files: Any = None
    while True:
        try:
            req = channel.next_request()
        except ConnectionError:
            return
        if req.method == "shutdown":
            with contextlib.suppress(ConnectionError):
                channel.respond(req.id, None, True)
            return
        handler = None
        if req.method.startswith("file_"):
            if files is None:
                files = serving.Services({}, workdir=os.getcwd())
            handler = files.handler(req.method)
        try:
            if handler is None:
                channel.respond(req.id, refusal(req.method, kernel_name))
            else:
                serving.answer(channel, req, handler)
        except ConnectionError:
            return


def main(
    fd: int,
    nonce: str,
    max_frame: int,
    *,
    kernel_pid: int,
    kernel_name: str | None = None,
) -> None:
    """Keep channel *fd* for kernel *kernel_pid*; returns once the program has been killed.

    Says hello with *kernel_pid*, serves until shutdown or until the host leaves, then kills
    the program (``SIGKILL``), also when serving failed (the error propagates).
    *kernel_name* (e.g. ``"bash"``) names the kernel in refusals.
    """
    channel = BlockingChannel(_socket.socket(fileno=fd), max_frame=max_frame)
    try:
        serving.hello(channel, nonce, kernel_pid, python=False)
        serve(channel, kernel_pid, kernel_name)
    finally:
        with contextlib.suppress(OSError):
            os.kill(kernel_pid, signal.SIGKILL)
        channel.close()
