"""A template kernel's copy made a tenant of its own: its uid, PID, mount, IPC, network, UTS.

A template's kernel on bwrap is a *zygote* (:mod:`sunroom.sandbox.template`): its user
namespace maps, besides its own uid, a block of host uids leased for its tenants, and it holds
``CAP_SYS_ADMIN``, ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_CHOWN`` and ``CAP_SETPCAP`` in that
namespace (never outside it), under a seccomp filter that lets namespace and mount calls through.
Every copy it makes for a tenant (:mod:`sunroom.prelude.forking`) goes through this module
before the copy's runtime exists, in this order:

1. :func:`new_pid_namespace` in the zygote, then ``fork()``: the copy's supervisor is PID 1 of
   a PID namespace of its own (when it ends, the kernel kills everything in it), and
   :func:`restore_pid_namespace` puts the zygote's next children back in its own.
2. :func:`isolate` in the copy's supervisor: new mount, IPC, network and UTS namespaces; every
   writable mount it inherited (the workdir, ``/tmp``, ``/dev/shm``, the copies' directory, the
   package site) is unmounted and replaced by a tmpfs of the same size that only this copy
   mounts (the workdir and the site keep a copy of the zygote's files); a ``/proc`` of its own
   PID namespace with the sandbox's masks; then the tenant's uid and gid, no supplementary
   groups, every capability dropped (bounding, ambient, permitted, effective, inheritable),
   no new privileges, not dumpable, and the kernel's full seccomp policy installed on top of
   the zygote's (which forbids every mount and namespace call again).

Only then is the copy's runtime forked, so nothing a model wrote ever runs with a capability, in
a namespace it shares with another tenant, or without the full filter. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import struct

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_pidns_fd: list[int] = []
"""The zygote's own PID namespace, opened at its first isolated fork (see below)."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _let_go(target: str) -> None:
    """Unmount *target*, or leave it to be covered when it is locked.

    Mounts the zygote was given from a more privileged user namespace (bubblewrap started
    unprivileged sets the sandbox up from an outer one) are locked to the copy: it cannot
    unmount them, only mount over them; without a capability, nothing below can come back.
    """
    try:
        _umount(target)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def _prctl(option: int, a: int = 0, b: int = 0) -> None:
    _check(
        _libc.prctl(option, ctypes.c_ulong(a), ctypes.c_ulong(b), ctypes.c_ulong(0), 0),
        f"prctl({option})",
    )


_restorable: list[bool] = []
"""Whether the zygote may ``setns`` back into its own PID namespace (probed once)."""


def can_restore_pid_namespace() -> bool:
    """Whether :func:`restore_pid_namespace` will work here, probed before it is needed.

    As root, the zygote's PID namespace belongs to its own user namespace and it may go back;
    started by an unprivileged user, bubblewrap made that namespace from an outer user
    namespace in which the zygote holds nothing, so a middle process must make each copy's
    namespace instead (:mod:`sunroom.prelude.forking`).
    """
    if not _restorable:
        if not _pidns_fd:
            _pidns_fd.append(os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC))
        _restorable.append(_libc.setns(_pidns_fd[0], CLONE_NEWPID) == 0)
    return _restorable[0]


def new_pid_namespace() -> None:
    """The next child this process forks is PID 1 of a new PID namespace."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")


def restore_pid_namespace() -> None:
    """In the zygote, after the fork: its later children are born in its own namespace again."""
    _check(_libc.setns(_pidns_fd[0], CLONE_NEWPID), "setns(CLONE_NEWPID)")


def held_fds() -> list[int]:
    """The descriptors this module holds open (the zygote's own PID namespace)."""
    return list(_pidns_fd)


def forget_pid_namespace() -> None:
    """In the copy: close the zygote's namespace descriptor (before anything else runs)."""
    while _pidns_fd:
        os.close(_pidns_fd.pop())


def _size(path: str) -> int:
    info = os.statvfs(path)
    return info.f_blocks * info.f_frsize


def _tmpfs(target: str, size: int, mode: int) -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode:o}")


def _submounts(target: str) -> list[str]:
    """The mount points strictly under *target* in this mount namespace, outermost first."""
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(target.rstrip("/") + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"))


def _replace(target: str, staging: str, *, keep: bool, mode: int, parking: str = "") -> list[str]:
    """Mount a new tmpfs of *target*'s size over it, with a copy of its files when *keep*.

    Read-only mounts inside *target* (the font cache in ``/tmp``) are moved to *parking* and
    back onto the new tmpfs, so the tenant keeps them without the zygote's tmpfs under them.
    Returns the directories made on the way to them (the tenant's to own).
    """
    size = _size(target)
    inner = _submounts(target) if parking else []
    parked: list[tuple[str, str, bool]] = []
    for i, point in enumerate(inner):
        spot = f"{parking}/{i}"
        is_dir = os.path.isdir(point)
        if is_dir:
            os.mkdir(spot)
        else:
            open(spot, "wb").close()  # noqa: SIM115 - a mount point file
        _mount(point, spot, None, MS_BIND)  # a bind: a locked mount cannot be moved
        parked.append((point, spot, is_dir))
    if keep and os.listdir(target):
        os.mkdir(staging)
        _tmpfs(staging, size, mode)
        shutil.copytree(target, staging, symlinks=True, dirs_exist_ok=True)
        _let_go(target)
        _mount(staging, target, None, MS_MOVE)
        os.rmdir(staging)
    else:
        _let_go(target)
        _tmpfs(target, size, mode)
    made: list[str] = []
    for point, spot, is_dir in parked:
        parent = os.path.dirname(point)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o755)
            made.append(parent)
        if is_dir:
            os.makedirs(point, mode=0o755, exist_ok=True)
        elif not os.path.exists(point):
            open(point, "wb").close()  # noqa: SIM115 - a mount point file
        _mount(spot, point, None, MS_MOVE)  # the parked bind, on the new tmpfs
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        if is_dir:
            os.rmdir(spot)
        else:
            os.unlink(spot)
    return made


def _chown_tree(root: str, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def _proc(
    staging: str, masked_files: list[str], masked_dirs: list[str], empty: str, share: int
) -> None:
    """A ``/proc`` of this PID namespace in place of the zygote's, masked as the sandbox's."""
    os.mkdir(staging)
    # a new proc is allowed while a proc with nothing locked over it is mounted here: the
    # zygote's own (as root), or the spare one it keeps (sunroom unprivileged)
    _mount("proc", staging, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _split_user_limits(f"{staging}/sys", share)  # before /proc/sys is read-only
    _let_go("/proc")
    _mount(staging, "/proc", None, MS_MOVE)
    os.rmdir(staging)
    _readonly_bind("/proc/sys", "/proc/sys")
    for name in masked_files:
        if os.path.lexists(f"/proc/{name}"):
            _readonly_bind(empty, f"/proc/{name}")
    for name in masked_dirs:
        if os.path.isdir(f"/proc/{name}"):
            _mount("tmpfs", f"/proc/{name}", "tmpfs", MS_NOSUID | MS_NODEV, "size=0,mode=555")
            _mount(None, f"/proc/{name}", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


SHARED_COUNTS = {
    "user/max_inotify_instances": "fs/inotify/max_user_instances",
    "user/max_inotify_watches": "fs/inotify/max_user_watches",
    "user/max_fanotify_groups": "fs/fanotify/max_user_groups",
    "user/max_fanotify_marks": "fs/fanotify/max_user_marks",
}
"""Per-uid counts of the zygote's user namespace, and the host limits they are a share of."""

SHARED_RLIMITS = ("RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_MEMLOCK", "RLIMIT_NPROC")
"""Limits the host kernel charges up the user-namespace chain to the zygote's own uid."""


def _split_user_limits(sysctl: str, share: int) -> None:
    """Cap every tenant's part of what is charged to the zygote's uid at one *share*th.

    The host kernel counts inotify and fanotify objects, queued signals, message-queue bytes,
    locked memory and processes per user *and* per namespace owner up the chain, so every
    tenant's count also lands on the zygote's uid: without a cap, one tenant could spend
    them all and starve the others. Namespace-scoped counts are capped in the zygote's user
    namespace (``/proc/sys/user``, per uid), the rest by this process's rlimits.
    """
    for local, host in SHARED_COUNTS.items():
        try:
            with open(f"{sysctl}/{host}") as f:
                total = int(f.read())
        except (OSError, ValueError):
            continue  # a kernel without it (fanotify's limits are newer)
        with open(f"{sysctl}/{local}", "w") as f:
            f.write(str(max(1, total // share)))
    import resource

    for name in SHARED_RLIMITS:
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        if hard == resource.RLIM_INFINITY:
            continue  # nothing to split (processes are capped by each kernel's pids cgroup)
        part = max(1, hard // share)
        resource.setrlimit(which, (min(soft, part), part))


def _readonly_bind(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount(None, target, None, flags)


def _drop_capabilities() -> None:
    last = int(open("/proc/sys/kernel/cap_last_cap").read())  # noqa: SIM115 - tiny proc file
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = struct.pack("=Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two __user_cap_data_struct of zeros: effective, permitted, inheritable
    _check(_libc.capset(header, data), "capset")


def _seccomp(program: bytes) -> None:
    count = len(program) // 8
    buf = ctypes.create_string_buffer(program, len(program))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Fprog(count, ctypes.cast(buf, ctypes.c_void_p))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(
        _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0),
        "seccomp",
    )


def isolate(spec: dict[str, Any]) -> None:
    """Make this process (a new PID namespace's first) a tenant of its own; see the module.

    *spec* (from the host, checked there): ``uid``/``gid`` (the tenant's ids in the zygote's
    user namespace, or None to keep the zygote's: sunroom started unprivileged), ``share``
    (into how many parts the zygote's per-user limits are split, see
    :func:`_split_user_limits`),
    ``workdir``, ``forks``, ``tmp``, ``site``, ``shm`` (paths), ``spare_proc`` (where the
    zygote keeps an unmasked ``/proc``, or None), ``masked_files``,
    ``masked_dirs`` (under ``/proc``) and ``seccomp`` (the kernel's BPF program). Raises
    OSError when a step fails: the caller must then exit, never run the copy.
    """
    _check(
        _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS),
        "unshare",
    )
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    forks = spec["forks"]
    _replace(forks, "", keep=False, mode=0o700)  # other tenants' copies were made there
    _replace(spec["workdir"], f"{forks}/.work", keep=True, mode=0o700)
    _replace(spec["site"], f"{forks}/.site", keep=True, mode=0o755)
    os.mkdir(f"{forks}/.park")
    made = _replace(spec["tmp"], "", keep=False, mode=0o1777, parking=f"{forks}/.park")
    os.rmdir(f"{forks}/.park")
    if os.path.isdir(spec["shm"]):
        _tmpfs(spec["shm"], _size(spec["tmp"]), 0o1777)
    empty = f"{forks}/.empty"
    with open(empty, "wb"):
        pass
    os.chmod(empty, 0o444)
    masked_files, masked_dirs = list(spec["masked_files"]), list(spec["masked_dirs"])
    _proc(f"{forks}/.proc", masked_files, masked_dirs, empty, int(spec["share"]))
    os.unlink(empty)  # the binds keep the inode
    spare = spec.get("spare_proc")
    if spare:  # the zygote's unmasked proc (see BwrapBackend), which made ours possible
        _tmpfs(spare, 0, 0o555)
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is not None and gid is not None:
        for path in (forks, spec["workdir"], spec["site"]):
            _chown_tree(path, uid, gid)
        for path in made:
            os.chown(path, uid, gid, follow_symlinks=False)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    _drop_capabilities()
    _prctl(PR_SET_DUMPABLE, 0)
    _seccomp(bytes(spec["seccomp"]))
    os.chdir(spec["workdir"])
