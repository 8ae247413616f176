"""The seccomp policy of isolated kernels, compiled to BPF with libseccomp (``pyseccomp``).

The filter allows by default and denies, with ``EPERM``, what a kernel never needs and an
attacker wants: sockets other than ``AF_UNIX``, tracing and cross-process memory access,
io_uring, bpf, perf, the kernel keyring, mounts, namespace changes, kexec, module loading,
personality changes (only ``personality(0)`` passes) and a few more (see ``DENIED``).
``clone3`` answers ``ENOSYS`` so libc falls back to ``clone``, whose namespace flags are then
checked. Syscalls of a foreign architecture
(32-bit entry points) kill the whole process.

:func:`docker_profile` renders the same rules as a Docker seccomp profile. The BPF program is
compiled on the host and handed to bubblewrap (``--seccomp FD``), which installs
it in the sandbox just before exec; nothing in the kernel can remove it.
"""

from __future__ import annotations

import errno
import functools
import json
import platform
import tempfile
from typing import Any, Final

from sunroom.errors import SandboxUnavailableError

DENIED: Final = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "userfaultfd",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "lookup_dcookie",
    "vhangup",
)
"""Syscalls refused outright with EPERM."""

AF_UNIX: Final = 1
AF_INET: Final = 2
SOCK_STREAM: Final = 1
SOCK_TYPE_MASK: Final = 0xF
OTHER_SOCK_TYPES: Final = (0, 2, 3, 4, 5, 6, 10)
"""``SOCK_*`` types other than ``SOCK_STREAM`` (datagram, raw, seqpacket, packet, ...)."""
TIOCSTI: Final = 0x5412
PER_LINUX: Final = 0
NAMESPACE_FLAGS: Final = (
    0x10000000  # CLONE_NEWUSER
    | 0x00020000  # CLONE_NEWNS
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x08000000  # CLONE_NEWIPC
    | 0x04000000  # CLONE_NEWUTS
    | 0x02000000  # CLONE_NEWCGROUP
)


def _library() -> Any:
    try:
        import pyseccomp  # type: ignore[import-untyped]
    except ImportError:
        raise SandboxUnavailableError(
            "the bwrap backend needs libseccomp's Python bindings: pip install pyseccomp"
        ) from None
    try:
        pyseccomp.system_arch()
    except (OSError, AttributeError) as exc:
        raise SandboxUnavailableError(
            f"libseccomp could not be loaded ({exc}); install it: apt-get install libseccomp2"
        ) from None
    return pyseccomp


def _deny(sc: Any, filt: Any, name: str, *args: Any, code: int = errno.EPERM) -> None:
    """Add one deny rule; a syscall this architecture lacks is skipped, any other failure raises."""
    if sc.resolve_syscall(sc.system_arch(), name) < 0:
        return  # not a syscall on this architecture (e.g. a newer one on an old libseccomp)
    try:
        filt.add_rule(sc.ERRNO(code), name, *args)
    except (ValueError, RuntimeError, OSError) as exc:
        raise SandboxUnavailableError(f"cannot build the seccomp rule for {name}: {exc}") from exc


ZYGOTE_ALLOWED: Final = ("mount", "umount2", "unshare", "setns")
"""What a zygote's filter lets through (see :func:`compile_bpf`), narrowed by arguments."""

CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWCGROUP: Final = 0x02000000


@functools.cache
def compile_bpf(network: bool = False, zygote: bool = False) -> bytes:
    """The policy as a BPF program (cached per process). Raises SandboxUnavailableError.

    With *zygote* (a template's kernel on bwrap, :mod:`sunroom.prelude.isolation`), the
    program also lets through what the zygote needs to give each of its copies namespaces
    of its own before the copy installs the full policy on top: ``mount``, ``umount2``,
    ``unshare`` (never with ``CLONE_NEWUSER`` or ``CLONE_NEWCGROUP``) and ``setns`` (only
    back into a PID namespace). Nothing a model wrote ever runs under it alone.

    With *network* (a kernel with a network policy), ``AF_INET`` stream sockets are allowed
    too, for the proxy's listener on 127.0.0.1 (:mod:`sunroom.prelude.egress`) and the
    clients that reach it; datagram and raw ``AF_INET`` sockets and every other family
    (``AF_INET6``, ``AF_NETLINK``, ``AF_PACKET``, ...) stay refused. The sandbox's network
    namespace has only ``lo`` either way.
    """
    sc = _library()
    filt = sc.SyscallFilter(defaction=sc.ALLOW)
    # a syscall through a foreign (32-bit) entry point kills the whole process, not just the
    # thread: a half-dead kernel would only hang until its timeout
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED:
        if not (zygote and name in ZYGOTE_ALLOWED):
            _deny(sc, filt, name)
    if zygote:
        for flag in (CLONE_NEWUSER, CLONE_NEWCGROUP):
            _deny(sc, filt, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        _deny(sc, filt, "setns", sc.Arg(1, sc.NE, CLONE_NEWPID))
    if network:
        _deny(sc, filt, "socket", sc.Arg(0, sc.LT, AF_UNIX), code=errno.EAFNOSUPPORT)
        _deny(sc, filt, "socket", sc.Arg(0, sc.GT, AF_INET), code=errno.EAFNOSUPPORT)
        for kind in OTHER_SOCK_TYPES:
            _deny(
                sc,
                filt,
                "socket",
                sc.Arg(0, sc.EQ, AF_INET),
                sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind),
                code=errno.EAFNOSUPPORT,
            )
    else:
        _deny(sc, filt, "socket", sc.Arg(0, sc.NE, AF_UNIX), code=errno.EAFNOSUPPORT)
    _deny(sc, filt, "socketpair", sc.Arg(0, sc.NE, AF_UNIX), code=errno.EAFNOSUPPORT)
    _deny(sc, filt, "clone", sc.Arg(0, sc.MASKED_EQ, NAMESPACE_FLAGS, 0x10000000))
    for flag in (0x00020000, 0x20000000, 0x40000000, 0x08000000, 0x04000000, 0x02000000):
        _deny(sc, filt, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _deny(sc, filt, "clone3", code=errno.ENOSYS)
    _deny(sc, filt, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    # personality(0) is allowed; any other persona or flag (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC,
    # and the 0xffffffff query too, which libseccomp cannot except in the same rule) is refused
    _deny(sc, filt, "personality", sc.Arg(0, sc.GT, PER_LINUX))
    with tempfile.TemporaryFile() as sink:
        filt.export_bpf(sink)
        sink.seek(0)
        program = sink.read()
    if not program:
        raise SandboxUnavailableError("libseccomp produced an empty seccomp program")
    return program


_SCMP_ARCH: Final = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def _rule(names: list[str], code: int, *args: tuple[int, str, int, int]) -> dict[str, Any]:
    rule: dict[str, Any] = {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": code}
    if args:
        rule["args"] = [
            {"index": i, "op": op, "value": value, "valueTwo": two} for i, op, value, two in args
        ]
    return rule


@functools.cache
def docker_profile(network: bool = False) -> str:
    """The kernel's seccomp policy as a Docker profile (JSON), the same policy as ``bwrap``'s.

    The same rules as :func:`compile_bpf`, compiled by the container runtime with libseccomp:
    allow by default; refuse ``DENIED`` with EPERM, non-``AF_UNIX`` sockets with EAFNOSUPPORT,
    namespace flags to ``clone`` with EPERM, ``clone3`` with ENOSYS, ``TIOCSTI`` and any
    persona but ``PER_LINUX``; with *network*, ``AF_INET`` stream sockets pass too (see
    :func:`compile_bpf`). Only the native architecture is listed, so syscalls through a
    foreign (32-bit) entry point hit libseccomp's bad-architecture action and are refused.
    It replaces the daemon's default profile. Raises SandboxUnavailableError on an
    architecture it does not know.
    """
    arch = _SCMP_ARCH.get(platform.machine())
    if arch is None:
        raise SandboxUnavailableError(
            f"the docker backend has no seccomp profile for {platform.machine()!r}"
        )
    clone_flags = [0x00020000, 0x20000000, 0x40000000, 0x08000000, 0x04000000, 0x02000000]
    rules = [
        _rule(list(DENIED), errno.EPERM),
        *(
            [
                _rule(["socket"], errno.EAFNOSUPPORT, (0, "SCMP_CMP_LT", AF_UNIX, 0)),
                _rule(["socket"], errno.EAFNOSUPPORT, (0, "SCMP_CMP_GT", AF_INET, 0)),
                *(
                    _rule(
                        ["socket"],
                        errno.EAFNOSUPPORT,
                        (0, "SCMP_CMP_EQ", AF_INET, 0),
                        (1, "SCMP_CMP_MASKED_EQ", SOCK_TYPE_MASK, kind),
                    )
                    for kind in OTHER_SOCK_TYPES
                ),
            ]
            if network
            else [_rule(["socket"], errno.EAFNOSUPPORT, (0, "SCMP_CMP_NE", AF_UNIX, 0))]
        ),
        _rule(["socketpair"], errno.EAFNOSUPPORT, (0, "SCMP_CMP_NE", AF_UNIX, 0)),
        _rule(["clone"], errno.EPERM, (0, "SCMP_CMP_MASKED_EQ", NAMESPACE_FLAGS, 0x10000000)),
        *(
            _rule(["clone"], errno.EPERM, (0, "SCMP_CMP_MASKED_EQ", flag, flag))
            for flag in clone_flags
        ),
        _rule(["clone3"], errno.ENOSYS),
        _rule(["ioctl"], errno.EPERM, (1, "SCMP_CMP_MASKED_EQ", 0xFFFFFFFF, TIOCSTI)),
        _rule(["personality"], errno.EPERM, (0, "SCMP_CMP_GT", PER_LINUX, 0)),
    ]
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}
    return json.dumps(profile, separators=(",", ":"))
