"""The ``bwrap`` backend: a bubblewrap namespace sandbox. The default for untrusted code on Linux.

Each kernel runs in fresh user, pid, network, ipc, uts, cgroup and mount namespaces with
``--die-with-parent`` and ``--new-session``, no capabilities, ``no_new_privs``, a seccomp filter
(:mod:`sunroom.sandbox.seccomp`), a read-only system (``/usr`` and the interpreter), only the code
the kernel needs (the ``sunroom`` package and site-packages, read-only), a private size-capped
tmpfs workdir and ``/tmp``, no host home, no ``/etc`` secrets, and no network at all. The RPC
socket is an inherited fd. cgroup memory, pids and CPU limits are applied before the sandbox
starts (the launch waits in a gate until the host has put it in the cgroup, then execs
bubblewrap, so every process inside is counted). ``/proc/sys`` is read-only and the ``/proc``
entries that expose host state (:data:`MASKED_PROC_FILES`, :data:`MASKED_PROC_DIRS`) are covered.

When sunroom runs as root, bubblewrap itself is started as the kernel's own leased unprivileged
uid (:mod:`sunroom.sandbox.identity`), so the user namespace it creates maps the sandbox user to
that uid, never to host root; as an unprivileged user it maps to that user.

Fail closed: if bubblewrap, user namespaces, libseccomp or a writable cgroup tree is missing,
:class:`~sunroom.errors.SandboxUnavailableError` says what to install or enable. There is no
fallback to a weaker backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, final

from sunroom.errors import KernelStartError, SandboxUnavailableError
from sunroom.sandbox.backend import (
    KERNEL_SITE,
    SAFE_PATH,
    SITE_ENV,
    KernelProcess,
    LaunchSpec,
    Tenancy,
    kernel_env,
)
from sunroom.sandbox.backends.subprocess import (
    boot_argv,
    installed_in_site,
    kernel_sys_path,
    package_root,
)
from sunroom.sandbox.fdready import readable
from sunroom.sandbox.fontcache import KERNEL_DIR, font_cache, font_dirs
from sunroom.sandbox.identity import (
    BlockLease,
    IdentityLease,
    lease_block,
    lease_if_root_off_loop,
    require_reachable,
)
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import NET_DIR, EgressRun
from sunroom.sandbox.process import LocalLaunch, SupervisedProcess
from sunroom.sandbox.seccomp import compile_bpf

SANDBOX_UID: Final = 1000
PYTHON_DIR: Final = "/opt/sunroom/python"
LIB_DIR: Final = "/opt/sunroom/lib"
WORKDIR: Final = "/work"
FORKS_DIR: Final = "/forks"
IPC_DIR: Final = "/run/sunroom"
"""Where a foreign kernel program's IPC directory (host: ``<rundir>/ipc``) is bound."""
TMP_MB: Final = 64
MASKED_PROC_FILES: Final = (
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "sysrq-trigger",
    "cmdline",
    "kallsyms",
    "config.gz",
    "sys/kernel/random/boot_id",
)
"""``/proc`` files covered with an empty file inside the sandbox (``/proc/sys`` is read-only)."""
MASKED_PROC_DIRS: Final = ("acpi", "scsi", "asound", "irq", "bus", "fs", "driver")
"""``/proc`` directories covered with an empty read-only tmpfs."""


_PROBED: set[tuple[str, bool]] = set()
"""(bubblewrap, as a leased uid) pairs :func:`_probe` passed in this process. What a probe
checks (that the host lets an unprivileged uid build namespaces) is the same for every uid of
the range, so one leased uid's probe stands for all: a probe per leased uid was a sandbox more
per start (a fork of the host and a bubblewrap run: 150 ms with 384 kernels running)."""


@functools.cache
def _probe(bwrap: str, uid: int | None) -> None:
    """Check once per process (and identity) that bubblewrap can build its namespaces here.

    *uid* is the unprivileged uid kernels run as when sunroom runs as root (None: our own).
    """
    creds: dict[str, Any] = {}
    if uid is not None:
        creds = {"user": uid, "group": uid, "extra_groups": []}
    try:
        proc = subprocess.run(
            [
                bwrap,
                "--unshare-all",
                "--unshare-user",
                "--die-with-parent",
                *_system_binds(),
                "--proc",
                "/proc",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            env={"PATH": SAFE_PATH},
            cwd="/",
            **creds,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailableError(f"bubblewrap could not run: {exc}") from None
    if proc.returncode != 0:
        raise SandboxUnavailableError(
            "bubblewrap cannot create namespaces here"
            + (f" as the unprivileged kernel uid {uid}" if uid is not None else "")
            + f": {proc.stderr.strip() or proc.returncode}. Enable unprivileged user namespaces "
            "(sysctl -w kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; "
            "on Ubuntu 24.04+ also kernel.apparmor_restrict_unprivileged_userns=0) or run "
            "where namespaces are allowed (in Docker: --security-opt seccomp=unconfined)."
        )


def _proc_masks(empty: str) -> list[str]:
    """Arguments for bubblewrap that make ``/proc/sys`` read-only and hide what leaks host state.

    Files are covered with *empty* (a read-only empty regular file: device nodes cannot be
    opened on the ``nodev`` proc mount), directories with an empty read-only tmpfs.
    """
    args = ["--ro-bind", "/proc/sys", "/proc/sys"]
    for name in MASKED_PROC_FILES:
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", empty, f"/proc/{name}"]
    for name in MASKED_PROC_DIRS:
        if os.path.isdir(f"/proc/{name}"):
            args += ["--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
    return args


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


ZYGOTE_CAPS: Final = (
    "CAP_SYS_ADMIN",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_CHOWN",
    "CAP_SETPCAP",
    "CAP_SYS_RESOURCE",
)
"""What a template's zygote keeps, inside its own user namespace only, to make each copy a
tenant of its own (:mod:`sunroom.prelude.isolation`); every copy drops them all."""

ZYGOTE_CHARGE_PER_TENANT_MB: Final = 4
"""Memory a template's zygote's cgroup may hold for each tenant it can have (``tenants``).

Measured ~1.3-1.6 MB a live tenant: pages are charged to the cgroup of the process that first
dirties them, and a tenant is born in the zygote's cgroup (cgroup v1 has no
``CLONE_INTO_CGROUP``). What it dirties before the host moves it (Python's own after-fork
work) and the zygote's copies of pages it shares with its tenants stay charged to the
zygote until those pages are freed (the tenant ends). Without this headroom a zygote with
~950 live tenants was OOM-killed at its 2 GB limit. Its own code (the setup, and whatever
that left running) may use this headroom too: ``memory_mb`` plus this per tenant bounds it.
"""


SPARE_PROC: Final = "/run/sunroom-proc"
"""Where a zygote started unprivileged keeps an unmasked ``/proc``: its tenants' mounts of
the zygote's are locked (they come from bubblewrap's outer user namespace), and the kernel
lets a tenant mount a ``/proc`` of its own only while one with nothing locked over it is
mounted. Each tenant covers it at once (:mod:`sunroom.prelude.isolation`)."""

TENANT_UID: Final = 2000
"""The first tenant uid inside a zygote's user namespace (mapped to the leased block)."""

MAP_TIMEOUT_S: Final = 10.0


def _open_parents(argv: list[str]) -> list[str]:
    """*argv* with every directory bubblewrap would make on the way to a mount made ``0755``.

    Bubblewrap makes the missing parents of a mount point (``/opt``, ``/inputs``, ...) with
    mode ``0700``, owned by the sandbox user: in a zygote, whose tenants run as other uids,
    they would stop every tenant at the door of its own interpreter.
    """
    out: list[str] = []
    made: set[str] = set()
    i = 0
    while i < len(argv):
        op = argv[i]
        if op in ("--ro-bind", "--bind") and i + 2 < len(argv):
            parts = Path(argv[i + 2]).parts
            for depth in range(2, len(parts)):
                parent = str(Path(*parts[:depth]))
                if parent not in made and not parent.startswith(("/proc", "/dev")):
                    made.add(parent)
                    out += ["--perms", "0755", "--dir", parent]
        elif op == "--dir" and i + 1 < len(argv):
            made.add(argv[i + 1])
            out += ["--perms", "0755"]
        out.append(op)
        i += 1
    return out


@final
class _UserMapping:
    """The host's part in a zygote's user namespace: write its uid and gid maps.

    Bubblewrap creates the namespace, reports its pid on the info pipe and waits on the block
    pipe; the host (root: only it may map more than one uid) writes the maps, then lets it go.
    """

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()

    def arguments(self) -> list[str]:
        return ["--userns-block-fd", str(self.block_r), "--info-fd", str(self.info_w)]

    def kernel_fds(self) -> tuple[int, int]:
        return self.block_r, self.info_w

    def close_kernel_fds(self) -> None:
        for fd in self.kernel_fds():
            with contextlib.suppress(OSError):
                os.close(fd)

    def write(self, own_uid: int, block: BlockLease, within_s: float) -> None:
        """Map the sandbox user to *own_uid* and the tenants to *block*; raises KernelStartError."""
        info = self._info(within_s)
        pid = info.get("child-pid")
        if not isinstance(pid, int) or pid <= 0:
            raise KernelStartError("bubblewrap reported no namespace to map")
        lines = f"{SANDBOX_UID} {own_uid} 1\n{TENANT_UID} {block.first} {block.count}\n"
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(lines)
        except OSError as exc:
            raise KernelStartError(
                f"cannot map the template's kernel uids into its sandbox: {exc.strerror}"
            ) from exc
        os.write(self.block_w, b"1")

    def _info(self, within_s: float) -> dict[str, Any]:
        end = time.monotonic() + within_s
        data = b""
        while True:
            left = end - time.monotonic()
            if left <= 0 or not readable(self.info_r, left):
                raise KernelStartError("bubblewrap did not report its namespaces in time")
            chunk = os.read(self.info_r, 4096)
            if not chunk:
                raise KernelStartError("bubblewrap ended before it reported its namespaces")
            data += chunk
            with contextlib.suppress(ValueError):
                found = json.loads(data)
                if isinstance(found, dict):
                    return found

    def close(self) -> None:
        for fd in (self.info_r, self.block_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Binds:
    """What a launch binds into the sandbox besides the system (host paths, bwrap arguments).

    Attributes:
        prefix: the interpreter's prefix (bound at :data:`PYTHON_DIR`).
        code: the ``--ro-bind`` arguments of the package and site-packages.
        empty: an empty file that covers the masked ``/proc`` files.
        fonts: the kernel's font cache, if any.
        ipc: a foreign program's IPC directory's arguments (or none).
        net: the network proxy's directory's arguments (or none).
    """

    prefix: str
    code: list[str]
    empty: str
    fonts: Path | None
    ipc: list[str]
    net: list[str]


def _seccomp_memfd(program: bytes) -> int:
    """A memfd holding the seccomp *program*, at offset 0 (bubblewrap reads it)."""
    seccomp_fd = os.memfd_create("sunroom-seccomp", 0)
    os.write(seccomp_fd, program)
    os.lseek(seccomp_fd, 0, os.SEEK_SET)
    return seccomp_fd


async def _open_network(
    spec: LaunchSpec,
    local: LocalLaunch,
    env: dict[str, str],
    config: dict[str, Any],
    seccomp_fd: int,
) -> tuple[EgressRun | None, list[str]]:
    """Open the kernel's proxy (when it has a network policy); its bind arguments.

    Adds the proxy's environment to *env* and its ``forward`` to the supervisor's *config*.
    On failure *seccomp_fd* is closed and the run directory abandoned.
    """
    if spec.network is None:
        return None, []
    try:
        proxy = await spec.network.open(local.rundir / "net", local.identity)
    except BaseException:
        os.close(seccomp_fd)
        local.abandon()
        raise
    env.update(spec.network.environment())
    config["forward"] = spec.network.supervisor_config()
    return proxy, ["--ro-bind", str(local.rundir / "net"), NET_DIR]


async def _spawn(
    local: LocalLaunch,
    argv: list[str],
    limits: Limits,
    seccomp_fd: int,
    mapping: _UserMapping | None,
    proxy: EgressRun | None,
    block: BlockLease | None,
) -> tuple[SupervisedProcess, socket.socket]:
    """Run bubblewrap in the run directory (the seccomp memfd and the map's fds inherited).

    The memfd and the kernel's ends of the map are closed here either way; on failure the
    proxy is closed and the block of tenant uids released.
    """
    try:
        return await local.spawn(
            argv,
            cwd=local.rundir,
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
            workdir=local.rundir / "work",  # the real one is a tmpfs inside the sandbox
            memory_mb=limits.memory_mb,
            extra_fds=(seccomp_fd, *(mapping.kernel_fds() if mapping is not None else ())),
            stop_signal=signal.SIGKILL,
            stop_inner=True,  # the namespace's first process: bubblewrap exits once all are gone
        )
    except BaseException:
        if proxy is not None:
            await proxy.aclose()
        if block is not None:
            block.release()
        raise
    finally:
        os.close(seccomp_fd)
        if mapping is not None:
            mapping.close_kernel_fds()


async def _map_tenants(
    proc: SupervisedProcess,
    sock: socket.socket,
    mapping: _UserMapping,
    lease: IdentityLease,
    block: BlockLease,
    within_s: float,
) -> None:
    """Write a zygote's uid map (its own uid and *block*) while bubblewrap waits.

    The kernel is killed when that fails; the mapping's pipes are closed either way.
    """
    try:
        await asyncio.to_thread(mapping.write, lease.identity.uid, block, within_s)
    except BaseException:
        sock.close()
        await proc.kill()
        raise
    finally:
        mapping.close()


@final
class BwrapBackend:
    """Launch kernels inside bubblewrap namespace sandboxes."""

    name = "bwrap"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        python: str | None = None,
        require_cgroups: bool = True,
    ) -> None:
        """Build the backend.

        Args:
            bwrap: the bubblewrap binary (default: ``bwrap`` on PATH).
            python: the interpreter to run (default: the one running sunroom). Its installation
                prefix is mounted read-only.
            require_cgroups: refuse to start without a writable cgroup tree (default). With
                False, memory is bounded by RLIMIT_AS only and processes by nothing but the
                PID namespace (RLIMIT_NPROC does not bind root): documented as weaker.
        """
        found = bwrap or shutil.which("bwrap", path=SAFE_PATH + ":/usr/sbin:/sbin")
        if found is None:
            raise SandboxUnavailableError(
                "bubblewrap is not installed: apt-get install bubblewrap (or dnf install "
                "bubblewrap); the bwrap backend will not fall back to a weaker sandbox"
            )
        self._bwrap = found
        self._python = Path(python or sys.executable).resolve()
        self._require_cgroups = require_cgroups

    def _python_layout(self) -> tuple[str, str]:
        prefix = Path(sys.base_prefix).resolve()
        try:
            rel = self._python.relative_to(prefix)
        except ValueError:
            raise SandboxUnavailableError(
                f"the interpreter {self._python} is not inside its prefix {prefix}; "
                "pass python= an interpreter under sys.base_prefix"
            ) from None
        return str(prefix), f"{PYTHON_DIR}/{rel}"

    def _font_cache(
        self, prefix: str, python_inside: str, code_binds: list[str], sys_path: list[str]
    ) -> Path | None:
        """The matplotlib font cache for kernels of this layout (see fontcache.py), or None."""
        sandbox = [
            self._bwrap, "--unshare-all", "--unshare-user", "--die-with-parent",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            *_system_binds(), "--ro-bind", prefix, PYTHON_DIR, *code_binds, *font_dirs(),
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/etc",
        ]  # fmt: skip
        sources = [code_binds[i + 1] for i in range(0, len(code_binds), 3)]
        return font_cache(sandbox, python_inside, sys_path, sources)

    def _code_binds(self) -> tuple[list[str], list[str]]:
        """The read-only binds of the kernel's code and the sys.path that finds it inside.

        From a checkout only the ``sunroom`` directory is bound (not the whole project); from
        an installed wheel the package's root is site-packages, bound whole like every other
        entry of :func:`kernel_sys_path` so that msgpack and the rest are found beside it.
        """
        root = package_root()
        binds: list[str] = []
        path: list[str] = []
        checkout = not installed_in_site()
        if checkout:
            binds += ["--ro-bind", str(Path(root) / "sunroom"), f"{LIB_DIR}/sunroom"]
            path.append(LIB_DIR)
        for i, entry in enumerate(kernel_sys_path()):
            if checkout and entry == root:
                continue
            target = f"/opt/sunroom/site/{i}"
            binds += ["--ro-bind", entry, target]
            path.append(target)
        return binds, path

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start a sandboxed kernel (or a template's zygote); see ``Backend.launch``.

        A zygote (``spec.tenants``) keeps :data:`ZYGOTE_CAPS` inside its own user namespace
        and runs under the zygote variant of the seccomp policy; when sunroom runs as root, a
        block of ``spec.tenants`` more uids is leased and mapped into that namespace (the host
        writes the maps while bubblewrap waits), one per isolated copy. See
        :mod:`sunroom.prelude.isolation` and docs/security.md.

        The steps, in order: lease the kernel's uid (and a zygote's block) and probe
        bubblewrap as it; the font cache; the run directory and its cgroup; the seccomp
        program in a memfd; the environment and the supervisor's config; the network proxy;
        bubblewrap's arguments; the spawn; a zygote's uid map; the companions.
        """
        zygote = spec.tenants > 0
        if zygote and (spec.program is not None or spec.network is not None):
            raise SandboxUnavailableError(
                "a template's kernel runs sunroom's runtime with no network policy"
            )
        program = compile_bpf(network=spec.network is not None, zygote=zygote)
        limits = spec.limits
        prefix, python_inside = self._python_layout()
        code_binds, sys_path = self._code_binds()
        lease, block = await self._lease_and_probe(spec, prefix, code_binds)
        fonts = await asyncio.to_thread(
            self._font_cache, prefix, python_inside, code_binds, sys_path
        )
        local = await self._prepare_rundir(spec, lease, block)
        empty = local.private_file("empty")
        seccomp_fd = _seccomp_memfd(program)
        ipc_binds: list[str] = []
        env = kernel_env(Path(WORKDIR), {"MPLCONFIGDIR": KERNEL_DIR, **spec.env})
        env[SITE_ENV] = KERNEL_SITE
        if spec.program is not None:
            ipc_host = local.make_ipc_dir(spec.program, IPC_DIR)
            ipc_binds = ["--bind", str(ipc_host), IPC_DIR]
            env["PYTHONPATH"] = os.pathsep.join(sys_path)
        config = local.supervisor_config(
            nonce=spec.nonce, limits=limits, program=spec.program, python=python_inside, ipc=IPC_DIR
        )
        proxy, net_binds = await _open_network(spec, local, env, config, seccomp_fd)
        caps = [arg for cap in ZYGOTE_CAPS for arg in ("--cap-add", cap)] if zygote else []
        mapping = _UserMapping() if block is not None else None
        if mapping is not None:  # bubblewrap leaves them open to what it runs
            config["close_fds"] = list(mapping.kernel_fds())
        binds = _Binds(
            prefix=prefix,
            code=code_binds,
            empty=str(empty),
            fonts=fonts,
            ipc=ipc_binds,
            net=net_binds,
        )
        argv = self._sandbox_argv(spec, binds, mapping=mapping, caps=caps, spare_proc=lease is None)
        if zygote:
            argv = _open_parents(argv)
        for key, value in env.items():
            argv += ["--setenv", key, value]
        argv += ["--seccomp", str(seccomp_fd), "--"]
        argv += boot_argv(python_inside, sys_path, config)
        proc, sock = await _spawn(local, argv, limits, seccomp_fd, mapping, proxy, block)
        if zygote:
            if block is not None:
                proc.companions.append(block)  # released once every process of it is gone
            proc.tenancy = Tenancy(
                range(TENANT_UID, TENANT_UID + block.count) if block is not None else None,
                spec.tenants,
            )
        if mapping is not None and block is not None and lease is not None:
            await _map_tenants(proc, sock, mapping, lease, block, limits.start_timeout_s)
        if proxy is not None:
            proc.companions.append(proxy)
        if ipc_binds:
            proc.ipc_dir = Path(ipc_binds[1])
        return proc, sock

    async def _lease_and_probe(
        self, spec: LaunchSpec, prefix: str, code_binds: list[str]
    ) -> tuple[IdentityLease | None, BlockLease | None]:
        """The kernel's uid lease (as root) and a zygote's block of tenant uids.

        Checks that the leased uid can reach the interpreter and the code, and probes
        bubblewrap as that uid first: once per process (:data:`_PROBED`). The lease is released
        when a step fails.
        """
        lease = await lease_if_root_off_loop()
        block: BlockLease | None = None
        try:
            if lease is not None:
                sources = [prefix, *(code_binds[i + 1] for i in range(0, len(code_binds), 3))]
                require_reachable(sources, self.name)
            as_leased = lease is not None
            if (self._bwrap, as_leased) not in _PROBED:
                await asyncio.to_thread(
                    _probe, self._bwrap, lease.identity.uid if lease is not None else None
                )
                _PROBED.add((self._bwrap, as_leased))
            if spec.tenants > 0 and lease is not None:
                block = await asyncio.to_thread(lease_block, spec.tenants)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        return lease, block

    async def _prepare_rundir(
        self, spec: LaunchSpec, lease: IdentityLease | None, block: BlockLease | None
    ) -> LocalLaunch:
        """The kernel's run directory and cgroup (which holds *lease* from here on).

        Refused without a cgroup when cgroups are required; *block* is released on failure.
        """
        limits = spec.limits
        if spec.tenants > 0:  # a zygote's cgroup keeps a share of each live tenant's pages
            memory = limits.memory_mb + spec.tenants * ZYGOTE_CHARGE_PER_TENANT_MB
            limits = replace(limits, memory_mb=memory)
        try:
            local = await LocalLaunch.prepare(
                prefix="sunroom-bwrap-",
                nonce=spec.nonce,
                limits=limits,
                cgroups=True,
                lease=lease,
            )
        except BaseException:
            if block is not None:
                block.release()
            raise
        cgroup = local.cgroup
        if cgroup is None and self._require_cgroups:
            if block is not None:
                block.release()
            local.abandon()
            raise SandboxUnavailableError(
                "the bwrap backend needs a writable cgroup tree (v1 or v2) for its memory and "
                "process limits; run as root or delegate a cgroup v2 subtree to this user "
                "(systemd-run --user --scope -p Delegate=yes ...), or pass "
                "BwrapBackend(require_cgroups=False) to accept weaker limits"
            )
        return local

    def _sandbox_argv(
        self,
        spec: LaunchSpec,
        binds: _Binds,
        *,
        mapping: _UserMapping | None,
        caps: list[str],
        spare_proc: bool,
    ) -> list[str]:
        """Bubblewrap's arguments up to ``--clearenv``: namespaces, identity, mounts.

        *spare_proc*: a zygote run unprivileged keeps a spare ``/proc`` (see
        :mod:`sunroom.prelude.isolation`).
        """
        zygote = spec.tenants > 0
        limits = spec.limits
        return [
            self._bwrap,
            "--unshare-all",
            "--unshare-user",
            *(mapping.arguments() if mapping is not None else []),
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--cap-drop",
            "ALL",
            *caps,
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sunroom",
            *_system_binds(),
            "--ro-bind",
            binds.prefix,
            PYTHON_DIR,
            *binds.code,
            *font_dirs(),
            *(arg for m in spec.mounts for arg in ("--ro-bind", m.source, m.target)),
            "--proc",
            "/proc",
            *(["--proc", SPARE_PROC] if zygote and spare_proc else []),
            *_proc_masks(binds.empty),
            "--dev",
            "/dev",
            "--size",
            str(limits.disk_mb * 1024 * 1024),
            "--tmpfs",
            WORKDIR,
            "--size",
            str(limits.disk_mb * 1024 * 1024),
            "--tmpfs",
            FORKS_DIR,  # the workdirs of this kernel's copies (sunroom.sandbox.forking)
            "--size",
            str(TMP_MB * 1024 * 1024),
            "--tmpfs",
            "/tmp",
            "--size",
            str(spec.site_bytes),
            "--tmpfs",
            KERNEL_SITE,
            *(
                ["--ro-bind", str(binds.fonts), f"{KERNEL_DIR}/{binds.fonts.name}"]
                if binds.fonts
                else []
            ),
            *binds.ipc,
            *binds.net,
            "--dir",
            "/etc",
            "--remount-ro",
            "/",
            "--chdir",
            WORKDIR,
            "--clearenv",
        ]
