"""The supervisor: the first process of every kernel, which reaps and kills all descendants.

Started by the host as ``python -I -S -c BOOT ...`` (``boot_argv`` in
``sunroom.sandbox.backends.subprocess``). It makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``) so that every orphaned descendant, double-forked ``setsid``
daemons included, is re-parented to it; asks for ``SIGTERM`` when its parent dies
(``PR_SET_PDEATHSIG``); imports the runtime; waits, where it is the gate, until the host has
moved it into the kernel's cgroup; then forks the kernel runtime (no second interpreter
start). When the kernel exits, or on ``SIGTERM``, it stops and kills every descendant, reaps
them all, reports the kernel's exit on the status fd and exits. A kernel's copies
(:mod:`sunroom.prelude.forking`) outlive it: each has a supervisor of its own, or is owned
by this one, which waits for them before it exits.

In exec mode (config key ``exec``: a foreign kernel program, e.g. a Jupyter kernel) the kernel
is a child that ``execvpe``s the program instead, with default signal dispositions and an
empty signal mask; either the program attaches to the channel itself (``attach``: the fd is
inherited and named in ``SUNROOM_CHANNEL``), or a second child runs
:mod:`sunroom.prelude.keeper` on the channel for it. Exec mode makes no copies.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; unlike signal, no enum import
import contextlib
import os
import resource
import sys
import time

import msgpack

from sunroom.prelude.prctl import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl
from sunroom.prelude.watch import (
    become_compiled,
    compiled,
    descendants,
    on_term,
    registry_pair,
    supervise,
)

__all__ = ["CHANNEL_ENV", "EXEC_FAILED", "GATE_CLOSED", "NO_WAY_OUT", "descendants", "main"]

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any


def _apply_rlimits(limits: dict[str, int]) -> None:
    table = {
        "as": resource.RLIMIT_AS,
        "cpu": resource.RLIMIT_CPU,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "core": resource.RLIMIT_CORE,
    }
    for name, value in limits.items():
        key = table[name]
        _, hard = resource.getrlimit(key)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(key, (soft, soft))


def _connect(path: str) -> int:
    """Connect to the host's listening socket at *path* (docker); return the fd."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    return sock.detach()


def main(config_hex: str) -> None:
    """Supervise one kernel described by *config_hex* (msgpack, in hex); never returns.

    Config keys: ``fd`` (inherited socket) or ``connect`` (a socket path to connect to),
    ``nonce``, ``max_frame``, ``rlimits``; ``status_fd`` (a pipe for the
    kernel's exit status) or none, in which case the exit status becomes this process's
    (``128 + signal`` for a signal); ``parent_pid`` (checked after asking for the parent-death
    signal) or none; ``forward_sigint`` (relay SIGINT to the kernel runtime, for backends that
    can only signal the container's first process); ``exec`` (a foreign kernel program to
    run instead of the runtime: ``{"argv": [...], "env": {...}, "attach": bool}`` and an
    optional ``"name"`` for messages, resolved by the host; see :func:`_run_program`);
    ``forward`` (a network policy: ``{"port": int, "socket": path}``: the listener is bound
    and given to the host's proxy before the kernel starts, see :mod:`sunroom.prelude.egress`);
    ``close_fds`` (descriptors the launcher needed and the kernel must not keep, closed first);
    ``gate`` (wait for the host's ``go`` on stdin before making any process: see
    :func:`_await_gate`); ``python_watch`` (watch the kernel in this process, with
    :func:`~sunroom.prelude.watch.supervise`, even where the compiled watcher was built).

    Once the runtime is forked, this process becomes the compiled watcher
    (:func:`~sunroom.prelude.watch.become_compiled`) where it was built, unless the host chose
    Python (``python_watch``), so that an idle kernel's second process holds a few pages
    instead of an interpreter; the runtime serves its first request only once the watcher may
    no longer be traced.
    """
    config = msgpack.unpackb(bytes.fromhex(config_hex))
    for stray in config.get("close_fds", ()):  # the launcher's, not the kernel's (bwrap's pipes)
        with contextlib.suppress(OSError):
            os.close(stray)
    status_fd: int | None = config.get("status_fd")
    _signal.signal(_signal.SIGTERM, on_term)  # noted now, acted on once supervise() runs
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)  # the kernel's code may not ptrace or read our memory
    parent = config.get("parent_pid")
    if parent is not None:
        prctl(PR_SET_PDEATHSIG, _signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(70)  # the host died before we could ask to be told
    fd: int = config["fd"] if "fd" in config else _connect(config["connect"])
    _open_way_out(config.get("forward"))
    if "exec" in config:
        if config.get("gate"):
            _await_gate()
        code = _run_program(config, fd, status_fd)
        sys.stdout.flush()
        os._exit(code)
    from sunroom.prelude import runtime  # import before fork: the kernel starts warm

    registry_r, registry_w = registry_pair()  # the runtime names its copies here
    watcher = None if config.get("python_watch") else compiled()
    ready_r, ready_w = os.pipe() if watcher is not None else (None, None)
    if config.get("gate"):
        _await_gate()  # the imports above ran while the host moved us into the cgroup
    kernel = os.fork()
    if kernel == 0:
        try:
            os.close(registry_r)
            if ready_w is not None:
                os.close(ready_w)
            prctl(PR_SET_DUMPABLE, 1)  # the runtime is the user's own process
            if status_fd is not None:
                os.close(status_fd)
            _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            _apply_rlimits(config.get("rlimits", {}))
            runtime.main(
                fd, config["nonce"], config["max_frame"], registry_fd=registry_w, ready_fd=ready_r
            )
        except BaseException:
            import traceback

            traceback.print_exc()
        os._exit(1)
    os.close(fd)
    os.close(registry_w)
    forward_sigint = bool(config.get("forward_sigint"))
    if watcher is not None and ready_r is not None and ready_w is not None:
        os.close(ready_r)
        become_compiled(
            watcher,
            kernel,
            status_fd=status_fd,
            registry_fd=registry_r,
            forward_sigint=forward_sigint,
            ready_fd=ready_w,
        )
        os.close(ready_w)  # still here: this process watches, and the runtime may go on
    code = supervise(
        kernel, status_fd=status_fd, registry_fd=registry_r, forward_sigint=forward_sigint
    )
    sys.stdout.flush()
    os._exit(code)


def _await_gate() -> None:
    """Wait until the host says ``go`` on stdin, then put ``/dev/null`` there.

    The host moves this process into the kernel's cgroup while it starts (on cgroup v1 that
    move waits out an RCU grace period, 3 to 30 ms here, which the interpreter's start and
    the imports now hide); every process of the kernel is forked after the gate, so each is
    born in the cgroup. Exits with :data:`GATE_CLOSED` if the host closes the gate instead.
    """
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 16)
        if not chunk:
            os._exit(GATE_CLOSED)
        line += chunk
    if line != b"go\n":
        os._exit(GATE_CLOSED)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


GATE_CLOSED = 72
"""The supervisor's exit status when the host closed its gate without saying ``go``."""

EXEC_FAILED = 127
"""The exit status of an exec-mode kernel whose program could not be started."""

CHANNEL_ENV = "SUNROOM_CHANNEL"
"""The environment variable naming the channel for a program that attaches to it: JSON
``{"fd": int, "nonce": str, "max_frame": int}``."""


def _run_program(config: dict[str, Any], fd: int, status_fd: int | None) -> int:
    """Exec mode: run ``config["exec"]`` as the kernel and supervise it; the exit code to use.

    With ``attach`` the program inherits channel *fd* (named in :data:`CHANNEL_ENV`) and
    speaks for itself; without it the program never sees the fd and a keeper
    (:func:`sunroom.prelude.keeper.main`) serves the channel beside it, speaking for the
    program's pid. The program is "the kernel": its exit ends everything, keeper included.
    """
    spec: dict[str, Any] = config["exec"]
    attach = bool(spec.get("attach"))
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    if attach:
        import json  # exec mode only: a runtime's start never pays for it

        env[CHANNEL_ENV] = json.dumps(
            {"fd": fd, "nonce": config["nonce"], "max_frame": config["max_frame"]}
        )
    else:
        from sunroom.prelude import keeper  # import before fork: the keeper starts warm
    rlimits: dict[str, int] = config.get("rlimits", {})
    argv = [str(a) for a in spec["argv"]]
    if not argv:
        raise ValueError("the kernel program's argv is empty")
    exec_r, exec_w = os.pipe()  # close-on-exec: EOF once the program runs, a byte if it cannot
    kernel = os.fork()
    if kernel == 0:
        os.close(exec_r)
        _exec_child(
            argv,
            env,
            channel_fd=fd,
            attach=attach,
            status_fd=status_fd,
            rlimits=rlimits,
            failed_fd=exec_w,
        )
    os.close(exec_w)
    started = os.read(exec_r, 1) == b""
    os.close(exec_r)
    if started and not attach:  # the keeper speaks for a program that runs, never before
        helper = os.fork()
        if helper == 0:
            try:
                if status_fd is not None:
                    os.close(status_fd)
                _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)  # SIGINT stays ignored
                _apply_rlimits(rlimits)
                keeper.main(
                    fd,
                    config["nonce"],
                    config["max_frame"],
                    kernel_pid=kernel,
                    kernel_name=spec.get("name"),
                )
                os._exit(0)
            except BaseException:
                import traceback

                traceback.print_exc()
            os._exit(1)
    os.close(fd)
    return supervise(
        kernel,
        status_fd=status_fd,
        registry_fd=None,
        forward_sigint=bool(config.get("forward_sigint")),
    )


def _exec_child(
    argv: list[str],
    env: dict[str, str],
    *,
    channel_fd: int,
    attach: bool,
    status_fd: int | None,
    rlimits: dict[str, int],
    failed_fd: int,
) -> None:
    """In the forked kernel: close what must not leak, reset signals, exec *argv*; never returns.

    The channel fd is inherited with *attach*, else closed here. An exec failure is one line
    on stderr (the kernel's log), a byte on *failed_fd* (close-on-exec: the supervisor reads
    EOF when the exec succeeds) and exit status :data:`EXEC_FAILED`.
    """
    try:
        if status_fd is not None:
            os.close(status_fd)
        if attach:
            os.set_inheritable(channel_fd, True)
        else:
            os.close(channel_fd)
        prctl(PR_SET_DUMPABLE, 1)  # the program is the user's own process
        _apply_rlimits(rlimits)
        for sig in _signal.valid_signals():  # an ignored signal would stay ignored across exec
            if sig not in (_signal.SIGKILL, _signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError):
                    _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - reported on stderr, then exit 127
        # BaseException on purpose, here and below: this forked child must reach os._exit
        # whatever happens (a KeyboardInterrupt or SystemExit raised now would run the
        # supervisor's own code on in the child); no await is involved
        with contextlib.suppress(BaseException):
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            line = f"sunroom: cannot run the kernel program {argv[0]!r}: {reason}\n"
            os.write(2, line.encode(errors="replace"))
        with contextlib.suppress(BaseException):
            os.write(failed_fd, b"!")
    os._exit(EXEC_FAILED)


def _open_way_out(spec: dict[str, Any] | None) -> None:
    """With a network policy (config ``forward``), give ``127.0.0.1:port`` to the host's proxy.

    Done before the kernel is forked, so the port is bound before any of its code runs and no
    process of the kernel ever holds the listener (:mod:`sunroom.prelude.egress`). When that
    fails the supervisor exits with :data:`NO_WAY_OUT` before the kernel starts.
    """
    if not spec:
        return
    from sunroom.prelude import egress

    try:
        egress.open_way_out(int(spec["port"]), str(spec["socket"]))
    except OSError as exc:
        sys.stderr.write(
            f"sunroom: the kernel's network listener could not be given to the egress proxy "
            f"({exc.strerror or exc}).\n"
        )
        sys.stderr.flush()
        os._exit(NO_WAY_OUT)


NO_WAY_OUT = 71
"""The supervisor's exit status when a kernel's network listener cannot reach the proxy."""
