"""The kernel process: connects to the host, then serves requests on its main thread.

Boot order: adopt the inherited socket, capture fd 1/2, send ``hello`` (protocol version, pid,
Python version, the nonce it was given), then serve ``execute``, ``bind``, ``bind_chunk``,
``install``, ``variables``, ``install_packages`` (:mod:`sunroom.prelude.packages`),
``list_packages``, ``fork`` (:mod:`sunroom.prelude.forking`), ``shutdown`` and the
``file_*`` requests (:mod:`sunroom.prelude.files`)
one at a time on the main thread (so SIGINT reaches user code as ``KeyboardInterrupt``). The
kernel exits when the host connection closes.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the C functions, unwrapped
import _socket
import builtins
import contextlib
import os
import sys
import threading
import time
import types

from sunroom.prelude import capture, display, hostcall, packages, pyhelp, serving
from sunroom.prelude.executor import CellOutcome, Executor, describe
from sunroom.prelude.fds import open_fds
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.codec import DEFAULT_MAX_FRAME
from sunroom.rpc.messages import Request, RpcError

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any


class Runtime:
    """One kernel: a namespace, an executor, output capture and the channel to the host."""

    def __init__(
        self,
        sock: _socket.socket,
        *,
        nonce: str,
        max_frame: int,
        registry_fd: int | None = None,
        ready_fd: int | None = None,
    ) -> None:
        """Start serving on *sock*; says hello last.

        *ready_fd* is the read end of a pipe whose writer is the kernel's watcher: it closes
        it once this process's code can no longer trace it (:mod:`sunroom.prelude.watch`).
        No request is served (so no code of the kernel's runs) before it reads EOF; the
        hello does not wait for it, so the watcher's start is not part of the kernel's.
        """
        self.max_frame = max_frame
        self.registry_fd = registry_fd  # the supervisor learns our copies' pids here
        # our copies (children, reaped by us): a single copy's pid -> its status pipe, or a
        # copy's supervisor's pid -> None (sunroom.prelude.forking)
        self.copies: dict[int, int | None] = {}
        self.warm_copies = True  # set by each fork (sunroom.prelude.forking): copies read it
        self.channel = BlockingChannel(sock, max_frame=max_frame)
        self.namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
        self.executor = Executor(self.namespace)
        # install, bind, variables, files; the files API's root is fixed before any cell runs
        self.services = serving.Services(self.namespace, workdir=os.getcwd())
        self.executing = False
        self.capture = capture.install(self._stream)
        self.out, self.err = self.capture.out, self.capture.err
        hostcall.attach(self.channel)
        display.install()
        pyhelp.install()
        packages.add_site()  # the writable site dir, before the read-only site-packages
        packages.install_builtins()
        # matplotlib, if a cell imports it: Agg, and plt.show() emits display items
        os.environ.setdefault("MPLBACKEND", "module://sunroom.prelude.mplbackend")
        sys.stdin = open(os.devnull)  # noqa: SIM115 - input() must raise EOFError
        os.dup2(sys.stdin.fileno(), 0)
        self._sigint_handler = self._on_sigint  # one bound method, compared by identity
        _signal.signal(_signal.SIGINT, self._sigint_handler)
        self._watcher_ready = ready_fd  # waited on before the first request is served
        self.own_fds = open_fds()  # the runtime's own; any other was opened by a cell
        self._hello(nonce)

    @property
    def workdir(self) -> str:
        """The files API's root: the working directory at boot (a copy's own, in a copy)."""
        return self.services.workdir

    def _hello(self, nonce: str) -> None:
        serving.hello(self.channel, nonce, os.getpid())

    # -- fork (sunroom.prelude.forking) ----------------------------------------------------

    def _do_fork(self, params: dict[str, object]) -> list[int]:
        from sunroom.prelude import forking  # only kernels that fork pay for it

        return forking.fork(self, params)

    def capture_threads(self) -> set[int]:
        """The idents of the runtime's own threads (output readers): a fork quiets them."""
        return {self.capture.ident}

    def fork_locks(self) -> list[threading.Lock]:
        """Every lock the runtime's own threads take, in a fixed order."""
        return [self.out.lock, self.err.lock, self.channel.send_lock]

    def note_copy(self, pid: int) -> None:
        """Tell the supervisor that *pid* supervises a copy, so it outlives this kernel."""
        if self.registry_fd is not None:
            os.write(self.registry_fd, f"{pid}\n".encode())

    def forget_parent_links(self, *, keep_registry: bool = False) -> None:
        """In a forked child: close the fds that belong to this kernel, not to the child.

        With *keep_registry* the registry stays open: a single copy names its own copies to
        the same supervisor.
        """
        self._close_owned(self.channel.detach_fd())
        if self.registry_fd is not None and not keep_registry:
            self._close_owned(self.registry_fd)
            self.registry_fd = None
        self._close_owned(self.out.let_go(), self.err.let_go())

    def _close_owned(self, *fds: int) -> None:
        """Close *fds* (-1: none) and count them out of :attr:`own_fds`."""
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.own_fds = self.own_fds - set(fds)

    def make_workdir(self, workdir: str) -> None:
        """Make a copy's *workdir*: a copy of this kernel's, before the copy is forked.

        The kernel is idle, so the files are as they will be at the fork. Raises OSError when
        it cannot be made: the fork is refused, no copy having run.
        """
        if os.listdir(self.workdir):
            import shutil

            shutil.copytree(self.workdir, workdir, symlinks=True, dirs_exist_ok=True)
            os.chmod(workdir, 0o700)
        else:  # nothing to copy (copytree would still copy the directory's times, xattrs)
            try:
                os.mkdir(workdir, 0o700)  # its parent, the kernel's forks directory, exists
            except FileExistsError:
                os.chmod(workdir, 0o700)

    def become_copy(
        self,
        fd: int,
        *,
        nonce: str | None,
        workdir: str,
        registry_fd: int | None,
        inherited: list[int] | None = None,
        ready_fd: int | None = None,
    ) -> None:
        """In a copy's runtime: take socket *fd* and the workdir :meth:`make_workdir` made.

        Says hello with *nonce*, first; with None it says none (a single copy: the fork's
        answer stands for its hello). No request is read before the rest is done. *inherited* are
        descriptors the copy must close (its siblings' ends, the parent's copies' status
        pipes); the parent's channel, capture pipes and, unless it is *registry_fd*,
        registry are closed here too, unless :meth:`forget_parent_links` closed them.

        :attr:`own_fds` is kept by counting each descriptor out as it is closed and in as it
        is made, not by listing ``/proc/self/fd`` again (a third of a copy's setup): a
        descriptor a cell of the parent opened stays someone else's in the copy too.
        """
        parent_fd = self.channel.detach_fd()
        self.channel.rebind(_socket.socket(fileno=fd))  # the same object: no new buffers
        if nonce is not None:
            self._hello(nonce)
        self.copies = {}  # the parent's copies are not ours
        self._close_owned(parent_fd, *(inherited or ()))
        if self.registry_fd is not None and self.registry_fd != registry_fd:
            self._close_owned(self.registry_fd)
        self.registry_fd = registry_fd
        if workdir != self.workdir:  # an isolated copy has its own copy at the same path
            for key in ("HOME", "TMPDIR"):
                if os.environ.get(key) == self.workdir:
                    os.environ[key] = workdir
            os.chdir(workdir)
            self.services.move(workdir)
        self._close_owned(self.out.let_go(), self.err.let_go())
        self.capture.after_fork()
        self.own_fds = self.own_fds | {fd, self.out.fd, self.err.fd}
        if registry_fd is not None:
            self.own_fds = self.own_fds | {registry_fd}
        if ready_fd is not None:  # its supervisor becomes the compiled watcher (__init__)
            self._watcher_ready = ready_fd
            self.own_fds = self.own_fds | {ready_fd}
        # one copy warms up while nothing waits for it (else the first request is here: serve
        # it now); copies forked in a batch do not, their warm-ups would take the CPU that
        # the parent's next forks and their siblings' starts need (32 at once: ~4 ms sooner)
        if self.warm_copies and self.channel.nothing_waiting():
            self._warm()

    def _warm(self) -> None:
        """Take a first cell's copy-on-write faults now, while the host adopts this copy.

        Runs what an ``execute`` runs (the captures, the display list, the compiler and the
        evaluation, the framer) on a throwaway cell ``1`` in a namespace of its own, sending
        nothing, with no effect a cell could see; most of the copy's first cell's faults are
        taken here (its CPU 0.43 -> 0.28 ms, against 0.1 ms for a later one).
        """
        self.out.begin(1)
        self.err.begin(1)
        display.OUTPUTS.begin(1)
        self.executor.warm()
        display.OUTPUTS.end()
        self.out.end()
        self.err.end()
        self.channel.warm()

    def _stream(self, name: str, text: str) -> None:
        self.channel.notify("stream", {"name": name, "text": text})

    def _on_sigint(self, signum: int, frame: types.FrameType | None) -> None:
        if self.executing:
            raise KeyboardInterrupt

    def serve(self) -> None:
        """Serve requests until shutdown or until the host goes away."""
        while True:
            try:
                try:
                    req = self.channel.next_request()
                except ConnectionError:
                    return
                if self._watcher_ready is not None:
                    self._await_watcher()
                if req.method == "shutdown":
                    self.channel.respond(req.id, None, True)
                    return
                self._handle(req)
            except KeyboardInterrupt:
                continue  # a late interrupt landed between cells: nothing to stop

    def _await_watcher(self) -> None:
        """Wait until the watcher may no longer be traced (see :meth:`__init__`), once."""
        fd, self._watcher_ready = self._watcher_ready, None
        assert fd is not None  # serve() calls this only while one is set
        _await_end(fd)
        self.own_fds = self.own_fds - {fd}

    def _handle(self, req: Request) -> None:
        handler = getattr(self, f"_do_{req.method}", None) or self.services.handler(req.method)
        if handler is None:
            self.channel.respond(req.id, RpcError("MethodNotFound", f"unknown method {req.method}"))
            return
        serving.answer(self.channel, req, handler)

    def _do_install_packages(self, params: dict[str, Any]) -> list[dict[str, str]]:
        return packages.install_packages(params["requirements"], params.get("timeout_s"))

    def _do_execute(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.copies:  # reap the supervisors of copies that have ended
            from sunroom.prelude import forking

            forking.reap(self)
        code = params["code"]
        cap = int(params.get("max_output_bytes", 1_000_000))
        self.out.begin(cap)
        self.err.begin(cap)
        # a cell may have replaced it (_signal: signal.getsignal raises and catches per call)
        if _signal.getsignal(_signal.SIGINT) is not self._sigint_handler:
            _signal.signal(_signal.SIGINT, self._sigint_handler)
        display.OUTPUTS.begin(int(params.get("max_display_bytes", display.DEFAULT_MAX_BYTES)))
        started = time.perf_counter()
        self.executing = True
        try:
            filename = params.get("filename")
            outcome = self.executor.run(code, filename if isinstance(filename, str) else None)
            try:
                display.capture_figures(display.OUTPUTS)  # open figures: PNG items, closed
            except KeyboardInterrupt as exc:  # rendering ran past the cell's timeout
                if outcome.error is None:
                    outcome = CellOutcome(error=describe(exc))
        finally:
            self.executing = False
        outputs, dropped_outputs = display.OUTPUTS.end()
        duration = time.perf_counter() - started
        _flush(sys.stdout)
        _flush(sys.stderr)
        stdout, dropped_out = self.out.end()
        stderr, dropped_err = self.err.end()
        return {
            "stdout": stdout,
            "stderr": stderr,
            "value": outcome.value,
            "error": outcome.error,
            "duration_s": duration,
            "truncated_bytes": dropped_out + dropped_err,
            "outputs": outputs,
            "dropped_outputs": dropped_outputs,
        }


def _flush(stream: Any) -> None:
    try:  # noqa: SIM105 - contextlib.suppress costs an object and two calls per cell
        stream.flush()
    except BaseException:  # noqa: BLE001, S110 - a cell's own stream object may fail anyhow
        pass


def _await_end(fd: int) -> None:
    """Read *fd* until its writer closes it (or dies), then close it."""
    try:
        while os.read(fd, 64):
            pass
    finally:
        os.close(fd)


def main(
    fd: int,
    nonce: str,
    max_frame: int = DEFAULT_MAX_FRAME,
    *,
    registry_fd: int | None = None,
    ready_fd: int | None = None,
) -> None:
    """Run a kernel on inherited socket *fd*; returns when the host says shutdown or leaves.

    *registry_fd* and *ready_fd* as :class:`Runtime`'s.
    """
    sock = _socket.socket(fileno=fd)
    runtime = Runtime(
        sock, nonce=nonce, max_frame=max_frame, registry_fd=registry_fd, ready_fd=ready_fd
    )
    threading.current_thread().name = "sunroom-kernel"
    runtime.serve()
    for stream in (sys.stdout, sys.stderr):
        # BaseException on purpose: the streams may be a cell's own objects, and whatever
        # their flush raises (SystemExit included) must not keep this process from os._exit;
        # no await is involved
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(0)
