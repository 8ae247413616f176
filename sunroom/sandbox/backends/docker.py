"""The ``docker`` backend: one container per kernel, through the Docker SDK for Python.

Each kernel runs in its own container with ``--network none``, a read-only root, a size-capped
private tmpfs workdir (``/work``, mode 0700, owned by the kernel user) and ``/tmp``, no
capabilities (``cap_drop=ALL``), ``no-new-privileges``, memory (no swap), pids and CPU limits,
its own unprivileged uid/gid leased from the range reserved for sunroom (never root, never a
host user's: :mod:`sunroom.sandbox.identity`), an empty ``/etc/resolv.conf``, the daemon's
default seccomp profile and no init: the sunroom supervisor is PID 1, reaps every orphan and
sweeps all descendants before it exits. The environment is
:func:`~sunroom.sandbox.backend.kernel_env` only, never the host's. An optional OCI runtime
(gVisor's ``runsc``) is passed through per backend.

The RPC socket: the host binds a listening Unix socket in a fresh directory inside a private
(0700, root-only) temporary directory, bind-mounts only that inner directory read-only at
``/run/sunroom`` and starts the container, whose supervisor connects to it. The host accepts
exactly one connection (the hello nonce is checked by :class:`~sunroom.sandbox.kernel.AsyncKernel`)
and then closes the listener and removes the socket file and both directories at once. On the
host, no user but root can traverse the private parent, so no other host user can reach the
socket, not even one that happens to share the kernel's uid; inside the container the mounted
directory is owned by the kernel uid with mode 0700 and the socket is 0600.

Two images:

* ``host_mounts=True`` (default, the *offline* image ``sunroom-kernel:offline`` built by
  ``sunroom docker-image`` with ``docker import``, no registry: docker_image.py): it holds only
  ``/etc/passwd``, ``/etc/group`` and empty mount points. The host's ``/usr`` (and any top-level
  ``/bin``, ``/lib``... that is a real directory rather than a merged-/usr symlink),
  ``/etc/ld.so.cache``, ``/etc/alternatives``, the interpreter's prefix (at
  ``/opt/sunroom/python``), the ``sunroom`` package (at ``/opt/sunroom/lib/sunroom``) and each
  site-packages directory of :func:`~sunroom.sandbox.backends.subprocess.kernel_sys_path` (at
  ``/opt/sunroom/site/<n>``) are bind-mounted read-only: nothing else of the host. A relocated
  interpreter finds its standard library relative to its executable; an interpreter built with a
  shared ``libpython`` (pyenv) gets ``LD_LIBRARY_PATH`` set to the container-side ``lib``
  directory, because its absolute RUNPATH names the host prefix.
* ``host_mounts=False`` (a production image built from ``images/kernel.Dockerfile``): the image
  provides ``/usr/local/bin/python3`` and ``/opt/sunroom/lib`` holding ``sunroom`` (``rpc`` and
  ``prelude``) and ``msgpack``; nothing of the host is mounted but the socket directory.

Containers are labelled ``sunroom.kernel=1`` with their owner (pid, its start time, hostname)
and are always removed: ``kill()`` force-removes the container; a watchdog process started by
the first launch in each host process removes that process's containers as soon as it dies
(``kill -9`` included, even while a kernel is busy); and the first launch in a process removes
every labelled container of this host whose owner process is gone (what a crashed host whose
watchdog died too leaves behind).

Fail closed: a missing ``docker`` package, an unreachable daemon, a missing image or an unknown
runtime raise :class:`~sunroom.errors.SandboxUnavailableError` saying what to do. There is no
fallback to a weaker backend. The Docker daemon must run on this host (bind mounts name host
paths). SDK calls block, so they run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, final

from sunroom.errors import KernelStartError, SandboxUnavailableError, UsageError
from sunroom.extras import require
from sunroom.rpc.settle import settle
from sunroom.sandbox.backend import KERNEL_SITE, SITE_ENV, KernelProcess, LaunchSpec, kernel_env
from sunroom.sandbox.backends.docker_janitor import (
    LABEL_HOST,
    LABEL_KERNEL,
    LABEL_OWNER_PID,
    LABEL_OWNER_STARTED,
    _hostname,
    _started,
    sweep_once,
)
from sunroom.sandbox.backends.docker_layout import LIB_DIR, host_layout
from sunroom.sandbox.backends.docker_process import DockerKernelProcess, _logs, _remove
from sunroom.sandbox.backends.subprocess import boot_argv
from sunroom.sandbox.identity import Identity, IdentityLease, lease_identity
from sunroom.sandbox.network import NET_DIR
from sunroom.sandbox.process import Companion, exec_config, make_ipc_dir
from sunroom.sandbox.rundirs import make_rundir, remove_tree
from sunroom.sandbox.seccomp import docker_profile
from sunroom.sandbox.watcher import watch_config

if TYPE_CHECKING:
    import docker  # type: ignore[import-untyped, unused-ignore]  # stubs: types-docker

DEFAULT_IMAGE: Final = "sunroom-kernel:offline"
WORKDIR: Final = "/work"
FORKS_DIR: Final = "/forks"
RUN_DIR: Final = "/run/sunroom"
IPC_DIR: Final = "/run/sunroom-ipc"
"""Where a foreign kernel program's IPC directory is mounted, read-write (``ExecSpec``)."""
SOCKET_NAME: Final = "kernel.sock"
RESOLV_NAME: Final = "resolv.conf"
IMAGE_PYTHON: Final = "/usr/local/bin/python3"
TMP_MB: Final = 64
SHM_MB: Final = 64

SETUP_HINT: Final = (
    "run `sunroom docker-image` (builds the offline kernel image from this host, no registry; "
    "from a checkout, `bash scripts/docker-setup.sh` also installs docker.io and starts dockerd)"
)
_POLL_S: Final = 0.25

_api_version: str | None = None


def docker_sdk() -> ModuleType:
    """Import the Docker SDK lazily; fail closed with how to install it."""
    require("docker", "the docker backend", SandboxUnavailableError)
    import docker  # type: ignore[import-untyped, unused-ignore]

    module: ModuleType = docker
    return module


def _probe_daemon() -> None:
    """Fail closed, without touching the SDK, when ``DOCKER_HOST``'s Unix socket does not answer.

    Other schemes (tcp, ssh) are left to the SDK.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        return
    path = host[len("unix://") :]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5.0)
        try:
            probe.connect(path)
        except OSError as exc:
            raise SandboxUnavailableError(
                f"no Docker daemon answers at {path} ({exc.strerror or exc}); start it "
                f"(dockerd, or systemctl start docker), or {SETUP_HINT}"
            ) from None


def _parse_user(user: str) -> tuple[int, int]:
    try:
        uid_s, _, gid_s = user.partition(":")
        uid, gid = int(uid_s), int(gid_s or uid_s)
    except ValueError:
        raise UsageError(f"user must be numeric 'uid:gid', got {user!r}") from None
    if uid <= 0 or gid <= 0:
        raise UsageError("the docker backend refuses to run kernels as root (uid/gid 0)")
    return uid, gid


@final
class DockerBackend:
    """Launch each kernel in its own locked-down Docker container.

    Args:
        image: the kernel image (default ``$SUNROOM_DOCKER_IMAGE`` or ``sunroom-kernel:offline``).
        runtime: an OCI runtime registered with the daemon, e.g. ``"runsc"`` for gVisor
            (default ``$SUNROOM_DOCKER_RUNTIME`` or the daemon's default, normally runc).
        client: a ``docker.DockerClient`` to use; the caller keeps ownership and closes it.
            Default: a client from the environment (``DOCKER_HOST``...) per kernel, closed
            when the kernel is killed.
        host_mounts: True (default, ``$SUNROOM_DOCKER_HOST_MOUNTS`` may say 0) for the offline
            image, which runs the host's interpreter and code mounted read-only; False for a
            production image that carries Python, msgpack and ``sunroom`` itself.
        user: numeric ``uid:gid`` every kernel runs as (never 0). Default: each kernel gets
            its own uid/gid leased from the range reserved for sunroom
            (:mod:`sunroom.sandbox.identity`), so kernels never share per-user limits and no
            host user has their uid. A fixed ``user`` shares one uid between all kernels.
        socket_dir: where the private socket directories are made (default
            ``$SUNROOM_DOCKER_RUNDIR`` or the temp dir). The daemon resolves bind mounts on the
            host, so when sunroom itself runs in a container this must be a directory mounted
            at the same path in both (see ``docker-compose.yml``).

    Raises SandboxUnavailableError (at launch) when the SDK, the daemon, the image or the
    runtime is missing; UsageError for a malformed ``user``.
    """

    name = "docker"

    def __init__(
        self,
        *,
        image: str | None = None,
        runtime: str | None = None,
        client: docker.DockerClient | None = None,
        host_mounts: bool | None = None,
        user: str | None = None,
        socket_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.image = image or os.environ.get("SUNROOM_DOCKER_IMAGE") or DEFAULT_IMAGE
        self.runtime = runtime or os.environ.get("SUNROOM_DOCKER_RUNTIME") or None
        if host_mounts is None:
            host_mounts = os.environ.get("SUNROOM_DOCKER_HOST_MOUNTS", "1") not in ("0", "")
        self.host_mounts = host_mounts
        self._fixed = _parse_user(user) if user is not None else None
        self.user = user
        self._client = client
        self._socket_dir = socket_dir or os.environ.get("SUNROOM_DOCKER_RUNDIR") or None

    # -- client ----------------------------------------------------------------------------

    def _connect(self) -> tuple[docker.DockerClient, bool]:
        """A reachable client (and whether this backend owns it), after the one-time sweep.

        Without a client of the caller's, the daemon's socket is probed first: the SDK leaks a
        socket when it builds a client against a daemon that does not answer.
        """
        global _api_version
        sdk = docker_sdk()
        owned = self._client is None
        if owned:
            _probe_daemon()
        try:
            client: docker.DockerClient = (
                self._client
                if self._client is not None
                else sdk.DockerClient.from_env(version=_api_version or "auto")
            )
        except sdk.errors.DockerException as exc:
            raise SandboxUnavailableError(
                f"no Docker daemon answers ({exc}); start it (dockerd, or systemctl start "
                f"docker), or {SETUP_HINT}"
            ) from None
        try:
            _api_version = _api_version or client.api.api_version
            sweep_once(client)
        except Exception as exc:
            if owned:
                client.close()
            if isinstance(exc, sdk.errors.APIError):
                raise KernelStartError(f"the Docker daemon refused a request: {exc}") from None
            raise SandboxUnavailableError(
                f"the Docker daemon cannot be reached ({exc}); start it, or {SETUP_HINT}"
            ) from None
        return client, owned

    # -- launch ----------------------------------------------------------------------------

    def _command(self, spec: LaunchSpec) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
        limits = spec.limits
        config: dict[str, Any] = {
            "connect": f"{RUN_DIR}/{SOCKET_NAME}",
            "nonce": spec.nonce,
            "max_frame": limits.max_frame_bytes,
            "rlimits": limits.rlimits(),
            "forward_sigint": True,
            **watch_config(),
        }
        env = kernel_env(Path(WORKDIR), spec.env)
        env[SITE_ENV] = KERNEL_SITE
        if self.host_mounts:
            layout = host_layout()
            python, sys_path, mounts = layout.python, list(layout.sys_path), list(layout.mounts)
            env.update(layout.env)
        else:
            python, sys_path, mounts = IMAGE_PYTHON, [LIB_DIR], []
        if spec.program is not None:
            config["exec"] = exec_config(spec.program, python=python, ipc=IPC_DIR)
            env["PYTHONPATH"] = os.pathsep.join(sys_path)
        if spec.network is not None:
            env.update(spec.network.environment())
            config["forward"] = spec.network.supervisor_config()
        argv = boot_argv(python, sys_path, config)
        return argv, mounts, env

    def _make_socket(self, ident: Identity) -> tuple[Path, Path, socket.socket]:
        """The private parent dir, the mounted socket dir and the listening socket in it.

        The parent also holds ``resolv.conf``, an empty file mounted over the container's own
        (which Docker would fill with the host's nameservers).
        """
        parent = make_rundir("sunroom-docker-", parent=self._socket_dir)
        try:
            sockdir = parent / "s"
            sockdir.mkdir(mode=0o700)
            path = sockdir / SOCKET_NAME
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(str(path))
                if os.geteuid() == 0:
                    os.chmod(path, 0o600)
                    os.chown(path, ident.uid, ident.gid)
                    os.chown(sockdir, ident.uid, ident.gid)
                else:
                    # cannot chown: the 0700 parent still keeps every other host user out;
                    # inside the container only the mounted directory is visible
                    os.chmod(path, 0o666)
                    os.chmod(sockdir, 0o711)
                listener.listen(1)
                listener.setblocking(False)
                resolv = parent / RESOLV_NAME
                resolv.write_bytes(b"")
                os.chmod(resolv, 0o444)
            except BaseException:
                listener.close()
                raise
        except BaseException:
            shutil.rmtree(parent, ignore_errors=True)
            raise
        return parent, sockdir, listener

    def _create(
        self,
        client: docker.DockerClient,
        spec: LaunchSpec,
        sockdir: Path,
        ident: Identity,
        ipc: Path | None = None,
        net: Path | None = None,
    ) -> tuple[str, str]:
        """Create and start the container (blocking); return its id and name."""
        sdk = docker_sdk()
        import requests  # type: ignore[import-untyped, unused-ignore]  # the SDK's dependency

        limits = spec.limits
        argv, binds, env = self._command(spec)
        mounts = [sdk.types.Mount(t, s, type="bind", read_only=True) for s, t in binds]
        mounts.append(sdk.types.Mount(RUN_DIR, str(sockdir), type="bind", read_only=True))
        mounts += [
            sdk.types.Mount(m.target, m.source, type="bind", read_only=True) for m in spec.mounts
        ]
        if ipc is not None:  # a foreign kernel's sockets: the only writable host directory
            mounts.append(sdk.types.Mount(IPC_DIR, str(ipc), type="bind", read_only=False))
        if net is not None:  # the egress proxy's socket (a network policy)
            mounts.append(sdk.types.Mount(NET_DIR, str(net), type="bind", read_only=True))
        resolv = str(sockdir.parent / RESOLV_NAME)
        mounts.append(sdk.types.Mount("/etc/resolv.conf", resolv, type="bind", read_only=True))
        me = os.getpid()
        labels = {
            LABEL_KERNEL: "1",
            LABEL_OWNER_PID: str(me),
            LABEL_OWNER_STARTED: _started(me),
            LABEL_HOST: _hostname(),
        }
        host_config = client.api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=[
                "no-new-privileges",
                f"seccomp={docker_profile(network=spec.network is not None)}",
            ],
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.pids,
            init=False,
            auto_remove=False,
            runtime=self.runtime,
            ipc_mode="private",
            shm_size=f"{SHM_MB}m",
            tmpfs={
                WORKDIR: f"rw,exec,nosuid,nodev,size={limits.disk_mb}m,mode=0700,"
                f"uid={ident.uid},gid={ident.gid}",
                # the workdirs of this kernel's copies (sunroom.sandbox.forking)
                FORKS_DIR: f"rw,exec,nosuid,nodev,size={limits.disk_mb}m,mode=0700,"
                f"uid={ident.uid},gid={ident.gid}",
                "/tmp": f"rw,exec,nosuid,nodev,size={TMP_MB}m,mode=1777",
                KERNEL_SITE: f"rw,exec,nosuid,nodev,size={spec.site_bytes},mode=0700,"
                f"uid={ident.uid},gid={ident.gid}",
            },
            mounts=mounts,
            log_config=sdk.types.LogConfig(
                type="json-file", config={"max-size": "1m", "max-file": "1"}
            ),
            nano_cpus=int(limits.cpu_quota * 1e9) if limits.cpu_quota else None,
        )
        name = f"sunroom-kernel-{spec.nonce[:4]}{os.urandom(4).hex()}"
        try:
            created = client.api.create_container(
                self.image,
                argv,
                name=name,
                hostname="sunroom",
                user=f"{ident.uid}:{ident.gid}",
                environment=env,
                working_dir=WORKDIR,
                labels=labels,
                host_config=host_config,
                stdin_open=False,
                tty=False,
            )
        except sdk.errors.ImageNotFound:
            hint = SETUP_HINT if self.image == DEFAULT_IMAGE else "build or load it first"
            raise SandboxUnavailableError(
                f"the kernel image {self.image!r} is not present in the Docker daemon: {hint} "
                "(docs/docker.md)"
            ) from None
        except requests.exceptions.ConnectionError as exc:
            raise SandboxUnavailableError(
                f"the Docker daemon cannot be reached ({exc}); start it, or {SETUP_HINT}"
            ) from None
        except sdk.errors.APIError as exc:
            text = str(exc)
            if self.runtime and "runtime" in text.lower():
                raise SandboxUnavailableError(
                    f"the Docker daemon has no runtime {self.runtime!r} ({exc}); register it in "
                    '/etc/docker/daemon.json ("runtimes") and restart dockerd'
                ) from None
            raise KernelStartError(f"docker could not create the kernel container: {exc}") from None
        cid: str = created["Id"]
        try:
            client.api.start(cid)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                client.api.remove_container(cid, force=True, v=True)
            if isinstance(exc, sdk.errors.APIError):
                raise KernelStartError(f"docker could not start the kernel: {exc}") from None
            raise
        return cid, name

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start a kernel container; see ``Backend.launch``.

        Returns the container's handle (kill it to remove the container; that also closes the
        client this backend opened for it) and the accepted socket.
        """
        if spec.tenants:
            raise SandboxUnavailableError(
                "docker kernels cannot isolate a template's forks from each other; only bwrap "
                "forks a template's kernels (elsewhere each is started apart and runs the setup)"
            )
        watch_config()  # a bad watcher choice is refused before anything is made
        client, owned = await asyncio.to_thread(self._connect)
        lease: IdentityLease | None = None
        ipc: Path | None = None
        net: Path | None = None
        proxy: Companion | None = None
        conn: socket.socket | None = None
        try:
            if self._fixed is not None:
                ident = Identity(*self._fixed)
            else:
                lease = await asyncio.to_thread(lease_identity)
                ident = lease.identity
            try:
                parent, sockdir, listener = self._make_socket(ident)
            except OSError as exc:
                raise KernelStartError(f"cannot make the kernel's socket: {exc}") from exc
            try:
                if spec.program is not None:
                    ipc = make_rundir("sunroom-docker-ipc-", parent=self._socket_dir) / "ipc"
                    make_ipc_dir(ipc, spec.program, IPC_DIR, ident)
                if spec.network is not None:
                    net = make_rundir("sunroom-docker-net-", parent=self._socket_dir) / "net"
                    proxy = await spec.network.open(net, ident)
                cid, name = await asyncio.to_thread(
                    self._create, client, spec, sockdir, ident, ipc, net
                )
                try:
                    conn, pid = await self._accept(
                        client, cid, listener, spec.limits.start_timeout_s
                    )
                except BaseException:
                    with contextlib.suppress(Exception):  # keep the start error; the sweep retries
                        await asyncio.to_thread(_remove, client, cid)
                    raise
            finally:
                listener.close()
                await asyncio.to_thread(shutil.rmtree, parent, True)
        except BaseException:
            if conn is not None:  # accepted, then the start was given up (cancelled)
                conn.close()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(_remove, client, cid)
            if proxy is not None:
                await proxy.aclose()
            for directory in (ipc, net):
                if directory is not None:
                    await asyncio.to_thread(remove_tree, directory.parent)
            if owned:
                client.close()
            if lease is not None:
                # a container that failed to start may outlive its removal attempt: its
                # processes keep the uid out of use (lease_identity skips live uids)
                lease.release()
            raise
        handle = DockerKernelProcess(
            client=client,
            owns_client=owned,
            container_id=cid,
            name=name,
            pid=pid,
            workdir=parent / "work",
            memory_mb=spec.limits.memory_mb,
            identity=ident,
            lease=lease,
        )
        handle.ipc_dir = ipc
        handle.net_dir = net
        if proxy is not None:
            handle.companions.append(proxy)
        return handle, conn

    async def _accept(
        self,
        client: docker.DockerClient,
        cid: str,
        listener: socket.socket,
        start_timeout_s: float,
    ) -> tuple[socket.socket, int]:
        """Accept exactly one connection while watching the container; return it and State.Pid."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + start_timeout_s
        accept = asyncio.ensure_future(loop.sock_accept(listener))
        first = asyncio.ensure_future(asyncio.to_thread(client.api.inspect_container, cid))
        taken = False
        try:
            while True:
                left = deadline - loop.time()
                await asyncio.wait({accept}, timeout=max(0.0, min(_POLL_S, left)))
                if accept.done():
                    conn, _ = accept.result()
                    taken = True
                    break
                info = await asyncio.to_thread(client.api.inspect_container, cid)
                state = info.get("State") or {}
                if not state.get("Running"):
                    logs = await asyncio.to_thread(_logs, client, cid)
                    raise KernelStartError(
                        f"the kernel container exited (status {state.get('ExitCode')}) before "
                        f"connecting{logs}"
                    )
                if loop.time() >= deadline:
                    logs = await asyncio.to_thread(_logs, client, cid)
                    raise KernelStartError(
                        f"the kernel container did not connect within {start_timeout_s:g} s{logs}"
                    )
            try:
                info = await first
            except BaseException:
                conn.close()
                raise
        finally:
            if not taken and accept.done() and not accept.cancelled() and not accept.exception():
                accept.result()[0].close()  # it connected as this start was given up
            for fut in (accept, first):
                if not fut.done():
                    fut.cancel()
            await settle(first)  # its end is not news; a cancel of the caller's own task is
        pid = int((info.get("State") or {}).get("Pid") or 0)
        return conn, pid
