"""Forking a live kernel: each copy is the runtime's own state, copied on write by ``fork()``.

The host asks with a ``fork`` request naming one ``{"nonce", "workdir"}`` per copy; the copies'
ends of their sockets and status pipes come with the request's frame (one ``SCM_RIGHTS``
message, ``BlockingChannel.take_fds``). The runtime refuses if code it ran left Python threads
running (a copy would inherit their locks, not the threads), closing them. Nothing of the
state is pickled or replayed: it is the same memory, shared until written (the collector's
objects are frozen across the fork so that a collection does not touch every page). A copy
then comes in one of two shapes:

* **single** (``"single": true``, which the host asks for when the copy has a cgroup of its own):
  the runtime forks once, and the child *is* the copy's runtime. It takes its new socket, new
  output pipes and a copy of the workdir and says ``hello`` with its nonce. It is this
  runtime's child: this runtime reaps it (on ``SIGCHLD``, and before each request) and writes
  its status on its status pipe. The kernel's supervisor owns it too (the registry carries it
  with a copy of its status pipe, :mod:`sunroom.prelude.watch`): when this runtime ends, the
  copy is re-parented to that supervisor, which reaps it and reports. Every process the copy
  makes stays in its cgroup, which the host kills to close it; the supervisor's sweep spares
  other cgroups' processes. One ``fork()`` of the heap per copy.
* **supervised** (otherwise): for each copy the runtime forks the copy's supervisor (a
  subreaper), whose pid goes to the kernel supervisor's registry so that it outlives this
  kernel; the copy's supervisor forks the copy's runtime, which proceeds as above. A copy that
  asks to be isolated (``"isolate"``: a template's tenant) makes itself a tenant of its own
  first (:mod:`sunroom.prelude.isolation`), and forks its runtime only once the host has opened
  its gate (a third descriptor: the host has moved the supervisor into the copy's cgroup by
  then). This runtime reaps the supervisors of its copies that end.

Sockets opened by cells, files outside the workdir and threads are not copied (see docs/fork.md).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
import signal
import socket
import sys
import threading

from sunroom.prelude import isolation
from sunroom.prelude.prctl import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, prctl
from sunroom.prelude.watch import (
    become_compiled,
    compiled,
    registry_pair,
    status_word,
    supervise,
)

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Iterator
    from typing import Any, Protocol

    from sunroom.rpc.blocking import BlockingChannel

    class Runtime(Protocol):
        """What forking needs of the kernel's runtime (:class:`sunroom.prelude.runtime.Runtime`).

        A protocol, so that this module does not import the runtime that imports it.
        """

        channel: BlockingChannel
        copies: dict[int, int | None]
        own_fds: frozenset[int]
        registry_fd: int | None
        warm_copies: bool

        def capture_threads(self) -> set[int]:
            """The idents of the runtime's own threads, quieted (not refused) across a fork."""

        def fork_locks(self) -> list[threading.Lock]:
            """Every lock the runtime's own threads take, in a fixed order."""

        def note_copy(self, pid: int) -> None:
            """Tell the kernel's supervisor that *pid* supervises a copy (it outlives us)."""

        def forget_parent_links(self, *, keep_registry: bool = False) -> None:
            """In a forked child: close the fds that belong to the kernel, not to the child."""

        @property
        def workdir(self) -> str:
            """The kernel's working directory (the files API's root)."""

        def make_workdir(self, workdir: str) -> None:
            """Make a copy's *workdir*, a copy of the kernel's, before forking it."""

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
            """In a copy's runtime: take socket *fd* and its workdir, say hello (or not)."""

        def serve(self) -> None:
            """Serve requests until shutdown or until the host goes away."""


MAX_COPIES = 64
"""The most copies one ``fork`` request may ask for."""


def fork(runtime: Runtime, params: dict[str, object]) -> list[int]:
    """Make the copies *params* asks for; return their supervisors' pids (this namespace).

    The copies' descriptors came with the request (``params["fds"]`` of them); a refused
    fork closes them.
    """
    try:
        fds = runtime.channel.take_fds(_fd_count(params))
    except BaseException:
        runtime.channel.drop_fds()
        raise
    kept: set[int] = set()  # the single copies': closed later, not here (see _fork)
    try:
        copies = _checked_copies(params, len(fds))
        reap(runtime)
        _refuse_threads(runtime)
        if any(spec.get("isolate") is not None for spec in copies):
            _refuse_shared_fds(runtime, passed=fds)
        if not runtime.channel.input_idle():
            raise RuntimeError("the host sent more requests while asking for a fork")
        return _fork(runtime, copies, fds, kept)
    finally:
        for fd in fds:
            if fd not in kept:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _fd_count(params: dict[str, object]) -> int:
    count = params.get("fds")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("a fork names how many descriptors came with it")
    return count


def _checked_copies(params: dict[str, object], fds: int) -> list[dict[str, Any]]:
    """The copies asked for, each checked; ValueError for a malformed request."""
    copies = params.get("copies")
    if not isinstance(copies, list) or not 1 <= len(copies) <= MAX_COPIES:
        raise ValueError(f"a fork asks for 1 to {MAX_COPIES} copies")
    for spec in copies:
        if not isinstance(spec, dict) or not all(
            isinstance(spec.get(k), str) for k in ("nonce", "workdir")
        ):
            raise ValueError("each copy needs a nonce and a workdir")
        if spec.get("isolate") is not None and not isinstance(spec["isolate"], dict):
            raise ValueError("a copy's isolation is a map")
        if spec.get("single") is not None and (
            spec["single"] is not True or spec.get("isolate") is not None
        ):
            raise ValueError("only a copy that is not isolated may be a single process")
    # a socket and a status pipe per copy; an isolated copy also a gate (see _copy_supervisor)
    if fds != sum(_width(spec) for spec in copies):
        raise ValueError("the host passed the wrong number of descriptors for the copies")
    return copies


def _width(spec: dict[str, Any]) -> int:
    return 3 if spec.get("isolate") is not None else 2


def _fork(
    runtime: Runtime, copies: list[dict[str, Any]], fds: list[int], kept: set[int]
) -> list[int]:
    """Fork the checked *copies* with their *fds*; those still needed go into *kept*."""
    _flush()
    owns: list[list[int]] = []
    at = 0
    for spec in copies:
        owns.append(fds[at : at + _width(spec)])
        at += _width(spec)
    _make_workdirs(runtime, copies)
    runtime.warm_copies = len(copies) == 1  # a batch's copies take no warm-up
    gc.freeze()  # a collection in a copy must not write to every tracked object's page
    try:
        if all(spec.get("single") for spec in copies):
            singles = _spawn_singles(runtime, copies, owns, fds)
            kept.update(own[1] for own in owns)  # their status pipes: this runtime reports
            return singles
        pids: list[int] = []
        for spec, own in zip(copies, owns, strict=True):
            try:
                pids.append(_spawn(runtime, spec, own, fds))
            except OSError as exc:
                raise _cut_short(exc, len(pids), len(copies)) from None
        return pids
    finally:
        gc.unfreeze()


def _make_workdirs(runtime: Runtime, copies: list[dict[str, Any]]) -> None:
    """Make each copy's workdir, a copy of the kernel's, before any copy is forked.

    An isolated copy makes its own, at the kernel's path (:mod:`sunroom.prelude.isolation`).
    When one cannot be made, those made are removed and the fork is refused (OSError).
    """
    made: list[str] = []
    try:
        for spec in copies:
            if spec.get("isolate") is None and spec["workdir"] != runtime.workdir:
                runtime.make_workdir(spec["workdir"])
                made.append(spec["workdir"])
    except BaseException:
        for workdir in made:
            shutil.rmtree(workdir, ignore_errors=True)  # best effort: the refusal is the news
        raise


def _cut_short(exc: OSError, made: int, asked: int) -> RuntimeError:
    """The error of a fork that ``os.fork()`` failed part way (*made* of *asked* copies made).

    The copies already made are let go by the host when it reads it (their channels close).
    """
    if exc.errno == errno.EAGAIN:
        why = "the kernel may start no more processes (its Limits.pids, or a limit its code set)"
    elif exc.errno == errno.ENOMEM:
        why = "the kernel is out of memory"
    else:
        why = exc.strerror or repr(exc)
    return RuntimeError(f"could not fork copy {made + 1} of {asked}: {why}")


def _refuse_threads(runtime: Runtime) -> None:
    main, ours = threading.main_thread(), runtime.capture_threads()
    others = [t for t in threading.enumerate() if t is not main and t.ident not in ours]
    if others:
        names = ", ".join(sorted(t.name for t in others)[:5])
        raise RuntimeError(
            f"the kernel has {len(others)} thread(s) of its own code running ({names}); "
            "a copy would inherit their locks but not the threads, so stop or join them "
            "before forking"
        )


def _refuse_shared_fds(runtime: Runtime, *, passed: list[int]) -> None:
    """Refuse to make tenants while code this kernel ran holds descriptors open.

    A copy inherits every descriptor, and an inherited one is the *same* open file (offset
    and all) or socket: two tenants holding it could talk through it, or reach the file
    behind it. So a template's setup must close what it opened (or open it in each kernel).
    The descriptors *passed* with the fork request are the copies' own, not strays.
    """
    from sunroom.prelude.fds import open_fds

    stray = sorted(open_fds() - runtime.own_fds - set(isolation.held_fds()) - set(passed))
    if stray:
        names = []
        for fd in stray[:5]:
            try:
                names.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                names.append(str(fd))
        raise RuntimeError(
            f"the template's setup left {len(stray)} descriptor(s) open ({', '.join(names)}); "
            "its kernels would all share them, so close them before the setup ends"
        )


def _flush() -> None:
    """Flush the streams before a fork (so no copy repeats their buffers) and before _exit.

    BaseException on purpose: the streams may be a cell's own objects, and whatever their
    flush raises (SystemExit, KeyboardInterrupt) must neither end the fork request nor keep a
    copy's runtime from ``os._exit``; no await is involved. (SIGINT raises only inside a cell.)
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


@contextlib.contextmanager
def _quiet(runtime: Runtime) -> Iterator[None]:
    """Hold the locks the runtime's own threads take, so none is held across the fork."""
    locks = runtime.fork_locks()
    for lock in locks:
        lock.acquire()
    try:
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


def _spawn(runtime: Runtime, spec: dict[str, object], own: list[int], fds: list[int]) -> int:
    """Fork one copy's supervisor; return its pid (this runtime reaps it, see :func:`reap`).

    An isolated copy's supervisor is PID 1 of a PID namespace of its own. Where this runtime
    may go back to its own namespace (as root) it makes the namespace itself, forks and goes
    back; elsewhere it forks a middle process that makes it, forks the supervisor and waits
    for it (the pid returned is then the middle's, which ends with the supervisor).
    """
    isolated = spec.get("isolate") is not None
    direct = isolated and isolation.can_restore_pid_namespace()
    with _quiet(runtime):
        if direct:
            isolation.new_pid_namespace()
        pid = os.fork()
        if pid == 0:
            if isolated and not direct:
                _middle(runtime, spec, own, fds)
            if isolated:
                _pass_gate(own[2])
            _copy_supervisor(runtime, spec, own, fds)
        if direct:
            isolation.restore_pid_namespace()
    runtime.copies[pid] = None
    runtime.note_copy(pid)  # the kernel's supervisor spares it when this kernel ends
    return pid


def reap(runtime: Runtime) -> None:
    """Reap this kernel's copies that have ended; a single copy's status goes on its pipe.

    They are its children: single copies, or the supervisors of supervised ones. Not
    reentrant, on purpose: the ``SIGCHLD`` handler (:func:`_on_child`) calls it, and Python
    runs that handler on the main thread whatever its signal mask (another thread may take the
    signal), so a call that finds one running asks it to go round once more instead.
    """
    if _REAPING["now"]:
        _REAPING["again"] = True
        return
    _REAPING["now"] = True
    try:
        _REAPING["again"] = True
        while _REAPING["again"]:
            _REAPING["again"] = False
            _reap(runtime)
    finally:
        _REAPING["now"] = False


_REAPING = {"now": False, "again": False}
"""Whether :func:`reap` is running, and whether a call came meanwhile (see there)."""


def _reap(runtime: Runtime) -> None:
    for pid in list(runtime.copies):
        try:
            done, code = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # a cell reaped it (os.wait) or it is gone
            done, code = pid, -1
        if not done:
            continue
        status_fd = runtime.copies.pop(pid, None)
        if status_fd is None:  # a supervised copy: its supervisor reported already
            continue
        if code >= 0:
            with contextlib.suppress(OSError):  # the host let go of the copy already
                os.write(status_fd, status_word(code).encode())
        with contextlib.suppress(OSError):
            os.close(status_fd)
        runtime.own_fds = runtime.own_fds - {status_fd}


def _on_child(runtime: Runtime) -> Callable[[int, types.FrameType | None], None]:
    """A ``SIGCHLD`` handler that reaps the copies (only theirs: a cell's children are its own)."""

    def handler(signum: int, frame: types.FrameType | None) -> None:
        reap(runtime)

    return handler


_HANDLER: dict[int, object] = {}
"""The ``SIGCHLD`` handler this process installed for its runtime (a cell may replace it)."""


def _spawn_singles(
    runtime: Runtime, specs: list[dict[str, Any]], owns: list[list[int]], fds: list[int]
) -> list[int]:
    """Fork the single copies (the module's docstring); return their pids (our children).

    The forks run back to back with nothing in between but a ``forked`` notification naming
    each (the host places it meanwhile): after each fork every page this process writes is
    copied first, so the bookkeeping waits until the last.
    """
    if signal.getsignal(signal.SIGCHLD) is not _HANDLER.get(id(runtime)):
        _HANDLER[id(runtime)] = handler = _on_child(runtime)
        # not SA_RESTART: the runtime waits for requests in a blocking read, which must return
        # for the handler to run (Python retries it then, PEP 475)
        signal.signal(signal.SIGCHLD, handler)
    pids: list[int] = []
    with _quiet(runtime):
        try:
            for spec, own in zip(specs, owns, strict=True):
                pid = os.fork()
                if pid == 0:
                    _single_copy(runtime, spec, own, fds)
                pids.append(pid)
                # named at once: the host moves it into its cgroup while the next is forked
                runtime.channel.notify_holding_send_lock("forked", {"pid": pid})
        except BaseException as exc:  # the host lets go of those forked: reaped as they end
            runtime.copies.update(dict.fromkeys(pids))
            if isinstance(exc, OSError):
                raise _cut_short(exc, len(pids), len(specs)) from None
            raise
    _own_singles(runtime, pids, specs, owns)
    return pids


def _own_singles(
    runtime: Runtime, pids: list[int], specs: list[dict[str, Any]], owns: list[list[int]]
) -> None:
    """The bookkeeping of single copies just forked: count them in, name them.

    Before the answer: once the host has it, it may close this kernel, and the kernel's
    supervisor must own the copies by then (they outlive it). A copy that ended before it
    was counted in is reaped here: its ``SIGCHLD`` came when nobody knew it.
    """
    for pid, own in zip(pids, owns, strict=True):
        runtime.copies[pid] = own[1]
    runtime.own_fds = runtime.own_fds | {own[1] for own in owns}
    registry = runtime.registry_fd
    if registry is not None:  # the kernel's supervisor owns them too (they outlive us)
        sock = socket.socket(fileno=registry)
        try:
            for pid, spec, own in zip(pids, specs, owns, strict=True):
                socket.send_fds(sock, [f"{pid}\t{spec['workdir']}".encode()], [own[1]])
        finally:
            sock.detach()
    reap(runtime)


def _single_copy(runtime: Runtime, spec: dict[str, Any], own: list[int], fds: list[int]) -> None:
    """A single copy's runtime, just forked: never returns.

    It says no hello: the fork's answer stands for it (the forking runtime vouches for its
    child, its pid and nonce; the host adopts the copy while it wakes up). It closes what it
    inherited (the other copies' ends, the parent's copies' status pipes and links:
    ``Runtime.become_copy``). Dumpable or not as the runtime it was forked from (a kernel's:
    yes; a tenant's: no): the flag is inherited, so nothing to set.
    """
    sock_fd = own[0]
    inherited = [fd for fd in fds if fd != sock_fd]
    inherited += [fd for fd in runtime.copies.values() if fd is not None]
    _serve_copy(runtime, spec, sock_fd, runtime.registry_fd, inherited, hello=False)


def _serve_copy(
    runtime: Runtime,
    spec: dict[str, Any],
    sock_fd: int,
    registry_fd: int | None,
    inherited: list[int] | None = None,
    *,
    hello: bool = True,
    ready_fd: int | None = None,
) -> None:
    """A copy's runtime: take its socket and workdir, say hello and serve; never returns.

    Without *hello* it says none (a single copy: the fork's answer stands for it).
    *ready_fd* as :class:`~sunroom.prelude.runtime.Runtime`'s.
    """
    try:
        runtime.become_copy(
            sock_fd,
            nonce=spec["nonce"] if hello else None,
            workdir=spec["workdir"],
            registry_fd=registry_fd,
            inherited=inherited,
            ready_fd=ready_fd,
        )
        runtime.serve()
        _flush()
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _middle(runtime: Runtime, spec: dict[str, object], own: list[int], fds: list[int]) -> None:
    """Make an isolated copy's PID namespace and supervisor, and wait for it; never returns.

    It waits at the copy's gate first (the host moves it into the copy's cgroup), so the
    supervisor and the runtime are born in the cgroup.
    """
    _pass_gate(own[2])
    code = 1
    try:
        isolation.new_pid_namespace()
        child = os.fork()
        if child == 0:
            _copy_supervisor(runtime, spec, own, fds)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        runtime.forget_parent_links()
        isolation.forget_pid_namespace()
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _pass_gate(gate: int) -> None:
    """An isolated copy's first act: wait until the host has opened its *gate*, or exit.

    The host moves the waiting process into the copy's cgroup first, then writes one byte on
    the gate. So everything the copy's making dirties (its isolation, its supervisor, its
    runtime) is charged to the copy's cgroup: cgroup v1 leaves a page's charge where it was
    made, and a template's zygote would otherwise keep ~1.3 MB of every tenant's start.
    """
    try:
        gc.disable()  # this process only waits: it must not touch the copied heap
        if os.read(gate, 1) != b"1":  # the host let go, or went away
            raise RuntimeError("the host did not open the copy's gate")
    except BaseException:
        import traceback

        traceback.print_exc()  # to the forked kernel's output: its host sees it
        os._exit(1)


def _copy_supervisor(
    runtime: Runtime, spec: dict[str, Any], own: list[int], fds: list[int]
) -> None:
    """The copy's supervisor; never returns.

    *own* are its socket, its status pipe and, for an isolated copy, its gate, passed
    already (:func:`_pass_gate`: by this process, or by the middle one that forked it).
    """
    code = 1
    sock_fd, status_fd = own[0], own[1]
    isolated = spec.get("isolate") is not None
    try:
        gc.disable()  # this process only waits: it must not touch the copied heap
        for fd in fds:
            if fd not in own:
                with contextlib.suppress(OSError):
                    os.close(fd)
        runtime.forget_parent_links()
        if isolated:
            isolation.forget_pid_namespace()
            isolation.isolate(spec["isolate"])  # raises: the copy never runs
            os.close(own[2])
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_DUMPABLE, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        hangup = os.dup(sock_fd)
        registry_r, registry_w = registry_pair()
        watcher = None if spec.get("python_watch") else compiled()
        ready_r, ready_w = os.pipe() if watcher is not None else (None, None)
        kernel = os.fork()
        if kernel == 0:
            os.close(registry_r)
            os.close(status_fd)
            os.close(hangup)
            if ready_w is not None:
                os.close(ready_w)
            _copy_runtime(runtime, spec, sock_fd, registry_w, ready_r)
        os.close(sock_fd)
        os.close(registry_w)
        # an isolated copy's workdir is its own tmpfs, gone with it
        workdir = "" if isolated else str(spec["workdir"])
        if watcher is not None and ready_r is not None and ready_w is not None:
            os.close(ready_r)
            become_compiled(  # as the kernel's supervisor does (sunroom.prelude.supervisor)
                watcher,
                kernel,
                status_fd=status_fd,
                registry_fd=registry_r,
                forward_sigint=False,
                ready_fd=ready_w,
                hangup_fd=hangup,
                workdir=workdir,
            )
            os.close(ready_w)  # still here: this process watches, and the runtime may go on
        code = supervise(kernel, status_fd=status_fd, registry_fd=registry_r, hangup_fd=hangup)
        if workdir:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
    except BaseException:
        import traceback

        traceback.print_exc()  # to the forked kernel's output: its host sees it
    finally:
        os._exit(code)


def _copy_runtime(
    runtime: Runtime,
    spec: dict[str, Any],
    sock_fd: int,
    registry_fd: int,
    ready_fd: int | None = None,
) -> None:
    """The copy's runtime: takes its socket and workdir, says hello, serves; never returns.

    With *ready_fd* (its supervisor becomes the compiled watcher) it serves its first request
    only once that pipe has ended, as a kernel's runtime does.
    """
    try:
        # a kernel's runtime is the user's own process; a tenant's stays not dumpable (no
        # core, /proc/self/environ closed to it too), like its supervisor
        tenant = spec.get("isolate") is not None
        prctl(PR_SET_DUMPABLE, 0 if tenant else 1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        gc.enable()
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    _serve_copy(runtime, spec, sock_fd, registry_fd, ready_fd=ready_fd)
