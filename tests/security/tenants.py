"""The cross-tenant attack set: what one kernel plants, and what another tries to reach of it.

Two kernels handed out apart (from one template, one pool, one service template) must be as
isolated as two kernels started apart. :func:`plant_code` leaves a secret in kernel A's
variables, environment, workdir, ``/tmp``, ``/dev/shm``, package site, a SysV shared memory
segment and an abstract Unix socket name, takes every inotify instance its user may have, and
starts a marked process; :func:`attack_code` runs in kernel B and reports each secret it reached, each process of
another tenant it could signal, and whether its own per-user limits were spent by A. The
verdict is data (a JSON object), checked by :func:`assert_isolated`.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass

SHM_KEY = 0x5EC2E7


@dataclass(frozen=True)
class Plant:
    """What kernel A planted (its secret) and where B may look for it."""

    secret: str

    @property
    def abstract_name(self) -> str:
        return f"tenant-{self.secret[:12]}"


def new_plant() -> Plant:
    return Plant(secrets.token_hex(16))


def plant_code(plant: Plant) -> str:
    """Kernel A's cell: plant the secret everywhere a tenant can put it; the value is A's pid."""
    return f"""
import ctypes, os, socket
SECRET = {plant.secret!r}
held_secret = SECRET * 4
os.environ["TENANT_SECRET"] = SECRET
with open("secret-file.txt", "w") as f:
    f.write(SECRET)
with open("/tmp/secret-tmp.txt", "w") as f:
    f.write(SECRET)
if os.path.isdir("/dev/shm"):
    with open("/dev/shm/secret-shm", "w") as f:
        f.write(SECRET)
site = os.environ.get("SUNROOM_SITE")  # where install() puts packages
if site:
    with open(os.path.join(site, "secret-site.txt"), "w") as f:
        f.write(SECRET)
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm_id = libc.shmget({SHM_KEY}, 4096, 0o1666)
if shm_id >= 0:
    address = libc.shmat(shm_id, None, 0)
    ctypes.memmove(address, SECRET.encode(), len(SECRET))
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\\0" + {plant.abstract_name!r})
listener.listen()
inotify_fds = []
while len(inotify_fds) < 600:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    inotify_fds.append(fd)
import subprocess
marked = subprocess.Popen(["tenant-marker-" + SECRET, "600"], executable="/bin/sleep")
(os.getpid(), len(inotify_fds))
"""


def still_running_code() -> str:
    """Kernel A's cell after the attack: its marked process is neither stopped nor gone."""
    return """
with open(f"/proc/{marked.pid}/status") as f:
    state = next(line.split()[1] for line in f if line.startswith("State:"))
(state.replace("R", "S"), marked.poll(), held_secret[:8])
"""


def attack_code(plant: Plant, a_pids: list[int]) -> str:
    """Kernel B's cell: look for A's secret and A's processes; the value is a JSON verdict."""
    return f"""
import ctypes, json, os, signal, socket, stat
SECRET = {plant.secret!r}.encode()
me = os.getpid()
found = []
signalled = []
skip = ("/proc", "/sys", "/usr", "/opt", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
for top, dirs, files in os.walk("/"):
    if top.startswith(skip) and top != "/":
        dirs[:] = []
        continue
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    for name in files:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_size < 2**20:
                with open(path, "rb") as f:
                    if SECRET in f.read():
                        found.append("file " + path)
        except OSError:
            pass
visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in visible:
    if pid == me:
        continue
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{{pid}}/{{part}}", "rb") as f:
                if SECRET in f.read():
                    found.append(f"{{part}} of {{pid}}")
        except OSError:
            pass
    try:
        with open(f"/proc/{{pid}}/maps") as maps, open(f"/proc/{{pid}}/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("r"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(start)
                    if SECRET in mem.read(min(end - start, 2**26)):
                        found.append(f"memory of {{pid}}")
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
for pid in visible:  # whatever of A's we can see, we try to stop
    if pid == me:
        continue
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            marked = b"tenant-marker-" + SECRET in f.read()
    except OSError:
        marked = False
    if marked:
        try:
            os.kill(pid, signal.SIGSTOP)
            signalled.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
for pid in {a_pids!r}:  # A's pids as A and the host know them: can we reach one?
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        continue
    try:  # a process of our own uid that took that number here is ours, not A's
        with open(f"/proc/{{pid}}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
        continue
    if uid != os.getuid():
        signalled.append(pid)
probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    probe.connect("\\0" + {plant.abstract_name!r})
    found.append("abstract socket")
except OSError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget({SHM_KEY}, 0, 0) >= 0:
    found.append("sysv shared memory")
inotify = libc.inotify_init1(0)
json.dumps({{"found": found, "signalled": signalled, "inotify": inotify >= 0, "pid": me}})
"""


def assert_isolated(verdict_repr: str | None) -> None:
    """B reached none of A's secrets, could signal none of A's processes, kept its limits."""
    assert verdict_repr is not None
    verdict = json.loads(ast.literal_eval(verdict_repr))
    assert verdict["found"] == [], verdict
    assert verdict["signalled"] == [], verdict
    assert verdict["inotify"], verdict
