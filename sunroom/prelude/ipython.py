"""The IPython extension that attaches an ipykernel to its sunroom channel.

Jupyter runs the cells (``execute_request`` over ZeroMQ); sunroom's private channel carries
the rest. The supervisor (exec mode with ``attach``) leaves the channel's fd open in the kernel
and names it in ``SUNROOM_CHANNEL``; ipykernel loads this module as an extension
(``--IPKernelApp.extensions=sunroom.prelude.ipython``), and :func:`load_ipython_extension`:

* takes ``SUNROOM_CHANNEL`` out of the environment (``!env`` and child processes never see
  it) and makes the fd close-on-exec (``!`` lines and subprocesses do not inherit it);
* routes host function calls through the channel (:mod:`sunroom.prelude.hostcall`) and says
  hello as sunroom's runtime does (protocol, pid, Python version, nonce);
* serves ``install``, ``bind`` / ``bind_chunk``, ``variables`` and the ``file_*`` requests
  (:mod:`sunroom.prelude.serving`) into the shell's user namespace on a daemon thread, answers
  ``shutdown``, and refuses anything else (``execute`` above all) with ``MethodNotFound``;
* makes ``input()`` and ``getpass.getpass()`` raise ``EOFError`` in every cell, as in sunroom's
  own kernels, where ipykernel (no stdin allowed) would raise ``StdinNotImplementedError``.

Cells call host functions on ipykernel's main thread while the serving thread usually holds
the channel's reader role; :class:`~sunroom.rpc.blocking.BlockingChannel` routes the answer to
the waiting cell. The serving thread blocks ``SIGINT``, so an interrupt lands on the main
thread: a cell blocked in a host call gets ``KeyboardInterrupt`` and the late answer is dropped.
When the host goes away (or says ``shutdown``) the kernel process ends at once (``os._exit``),
as sunroom's runtime does. Standard library and msgpack only.
"""

from __future__ import annotations

import _socket
import builtins
import getpass
import json
import os
import signal
import sys
import threading

from sunroom.prelude import capture, hostcall, serving, streamcap
from sunroom.prelude.supervisor import CHANNEL_ENV
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.codec import escape_surrogates
from sunroom.rpc.messages import RpcError

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

OUTPUT_CAP_ENV = "SUNROOM_MAX_OUTPUT_BYTES"
"""The kernel's ``max_output_bytes``, set by the host: the cap on stream messages."""
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
"""IPython's own names, left out of ``variables`` (besides ``user_ns_hidden`` and ``_`` names)."""


def load_ipython_extension(ip: Any) -> None:
    """Attach the shell *ip* to the channel named in ``SUNROOM_CHANNEL`` and start serving it.

    Raises RuntimeError when the variable is missing or malformed (the extension was loaded
    outside sunroom's jupyter backend); a second load in the same kernel (``%reload_ext``)
    does nothing.
    """
    if hostcall.attached():
        return
    raw = os.environ.pop(CHANNEL_ENV, None)
    if raw is None:
        raise RuntimeError(
            f"sunroom.prelude.ipython needs {CHANNEL_ENV}: only sunroom's jupyter backend "
            "loads this extension"
        )
    try:
        spec = json.loads(raw)
        fd, nonce, max_frame = int(spec["fd"]), str(spec["nonce"]), int(spec["max_frame"])
    except (ValueError, TypeError, KeyError) as exc:
        raise RuntimeError(
            f"{CHANNEL_ENV} is not JSON with fd, nonce and max_frame ({type(exc).__name__})"
        ) from None
    os.set_inheritable(fd, False)
    channel = BlockingChannel(_socket.socket(fileno=fd), max_frame=max_frame)
    hostcall.attach(channel)
    services = serving.Services(
        ip.user_ns, workdir=os.getcwd(), hidden=(ip.user_ns_hidden, IPYTHON_NAMES)
    )
    ip.events.register("pre_run_cell", _eof_for_stdin)
    ip.events.register("post_execute", drain_fd_output)
    session = getattr(getattr(ip, "kernel", None), "session", None)
    if session is not None:
        session.pack = utf8_packer(session.pack)
    cap = os.environ.pop(OUTPUT_CAP_ENV, None)
    if cap is not None and cap.isdigit():  # floods stay in the kernel (streamcap)
        streamcap.install((sys.stdout, sys.stderr), int(cap))
    serving.hello(channel, nonce, os.getpid())
    thread = threading.Thread(
        target=_serve, args=(channel, services), name="sunroom-channel", daemon=True
    )
    thread.start()


def _serve(channel: BlockingChannel, services: serving.Services) -> None:
    """The serving thread: answer requests until shutdown or the host leaves, then end."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # interrupts are for cells
    code = 0
    try:
        serve(channel, services)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(code)


def serve(channel: BlockingChannel, services: serving.Services) -> None:
    """Serve *channel* with *services* until ``shutdown`` (answered) or the channel closes."""
    while True:
        try:
            req = channel.next_request()
        except ConnectionError:
            return
        try:
            if req.method == "shutdown":
                channel.respond(req.id, None, True)
                return
            handler = services.handler(req.method)
            if handler is None:
                channel.respond(req.id, refusal(req.method))
            else:
                serving.answer(channel, req, handler)
        except ConnectionError:
            return


def utf8_packer(pack: Any) -> Any:
    r"""The message packer *pack* (ipykernel's), made to send only valid UTF-8.

    jupyter-client's packer encodes with ``surrogateescape``: a lone surrogate in a cell's
    output (a repr, an exception message, a display item) makes it raise (``"\ud800"``, the
    message is lost) or send bytes that are not UTF-8 (``"\udcff"``). Such a message is packed
    again with every lone surrogate backslash-escaped (``\ud800``, as the kernel's ``print``
    writes it and sunroom's channel sends it); every other message is packed by *pack* as it is.
    """

    def packer(obj: object) -> bytes:
        try:
            data: bytes = pack(obj)
            data.decode("utf-8")
        except (UnicodeError, ValueError):
            data = pack(escape_surrogates(obj))
        return data

    return packer


def _eof_for_stdin(info: object = None) -> None:
    """Before each cell: wrap ``input`` and ``getpass`` (ipykernel has set its own by now)."""
    if not hasattr(builtins.input, "sunroom_eof"):
        builtins.input = eof_instead(builtins.input)
    if not hasattr(getpass.getpass, "sunroom_eof"):
        getpass.getpass = eof_instead(getpass.getpass)


FD_DRAIN_S = 0.5
"""How long a cell's end waits for ipykernel to read what the cell wrote to fd 1 and 2."""


def drain_fd_output(*_: object) -> None:
    """After each cell: wait until ipykernel's watcher threads have read fd 1/2's pipes.

    ipykernel reads what is written to fd 1 and 2 (``os.write``, C code, subprocesses) from a
    pipe in a thread of its own, and its end-of-cell flush does not wait for that thread: on a
    loaded machine a cell's last ``os.write`` was published after the cell ended, outside its
    result. Waiting here (up to :data:`FD_DRAIN_S`, polling ``FIONREAD``) until each pipe is
    empty leaves only the moment between the thread's read and its write into the stream.
    The pipe is ipykernel's ``OutStream._fid`` (7.x); a stream without one is not waited for.
    """
    import time

    count = bytearray(4)
    deadline = time.monotonic() + FD_DRAIN_S
    for stream in (sys.stdout, sys.stderr):
        fid = getattr(stream, "_fid", None)
        if not isinstance(fid, int):
            continue
        while time.monotonic() < deadline:
            try:
                if not capture.pending(fid, count):
                    break
            except OSError:  # closed: nothing left to wait for
                break
            time.sleep(0.0005)


def eof_instead(read: Any) -> Any:
    """*read* with IPython's "no stdin" error (``StdinNotImplementedError``) as ``EOFError``.

    Matched by class name: the extension does not import IPython. ipykernel restores its
    originals after each cell, so wrappers never pile up.
    """

    def no_stdin(*args: object, **kwargs: object) -> object:
        try:
            return read(*args, **kwargs)
        except Exception as exc:
            if type(exc).__name__ != "StdinNotImplementedError":
                raise
            raise EOFError("EOF when reading a line: the kernel has no stdin") from None

    no_stdin.sunroom_eof = True  # type: ignore[attr-defined]
    return no_stdin


def refusal(method: str) -> RpcError:
    """The answer to a request this kernel does not serve on the sunroom channel."""
    why = ": cells run through Jupyter's execute_request" if method == "execute" else ""
    return RpcError(
        "MethodNotFound", f"an IPython kernel does not serve {method!r} on the sunroom channel{why}"
    )
