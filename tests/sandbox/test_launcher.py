"""The compiled launcher (``sunroom-launch``): the command line a local kernel starts with, and
the program itself (drop to the kernel's ids, wait at the gate, exec; refuse otherwise).

Kernels started through it are every subprocess and bwrap test run as root; the fork
conformance cases run once more with ``SUNROOM_WATCHER=python``, which starts them through
``setpriv`` and a shell gate instead (tests/conformance/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom.errors import SandboxUnavailableError
from sunroom.sandbox.identity import Identity, IdentityLease, lease_identity
from sunroom.sandbox.process import GATE, first_argv, refuse_inheritable_capabilities
from sunroom.sandbox.watcher import (
    BUILT,
    ENV_CHOICE,
    LAUNCH_SOURCE,
    LAUNCHER,
    LAUNCHER_NAME,
    build,
    compiled_launcher,
    stale,
)

pytestmark = pytest.mark.kernel  # runs the launcher, a process of its own

KERNEL = Identity(2_000_000_123, 2_000_000_123)
PROGRAM = ["/usr/bin/python3.11", "-I", "-S", "-c", "pass"]

WHO = (
    "import os, sys; "
    "status = open('/proc/self/status').read(); "
    "cap = [l.split()[1] for l in status.splitlines() if l.startswith('CapEff:')][0]; "
    "print(os.getresuid(), os.getresgid(), os.getgroups(), cap, repr(sys.stdin.read()))"
)


def test_with_the_launcher_one_exec_drops_to_the_kernel_and_gates() -> None:
    for gate, flag in ((True, "1"), (False, "0")):
        argv, creds = first_argv(
            PROGRAM, identity=KERNEL, gate=gate, launcher="/x/sunroom-launch", setpriv="/s"
        )
        assert argv == ["/x/sunroom-launch", str(KERNEL.uid), str(KERNEL.gid), flag, *PROGRAM]
        assert creds == {}


def test_without_it_setpriv_and_a_shell_gate_or_popen_credentials() -> None:
    gated = ["/bin/sh", "-c", GATE, "sunroom-gate", *PROGRAM]
    setpriv = ["/s", f"--reuid={KERNEL.uid}", f"--regid={KERNEL.gid}", "--clear-groups",
               "--inh-caps=-all", "--ambient-caps=-all", "--"]  # fmt: skip
    assert first_argv(PROGRAM, identity=KERNEL, gate=True, launcher=None, setpriv="/s") == (
        [*setpriv, *gated],
        {},
    )
    assert first_argv(PROGRAM, identity=KERNEL, gate=False, launcher=None, setpriv="/s") == (
        [*setpriv, *PROGRAM],
        {},
    )
    assert first_argv(PROGRAM, identity=KERNEL, gate=True, launcher=None, setpriv=None) == (
        gated,
        {"user": KERNEL.uid, "group": KERNEL.gid, "extra_groups": []},
    )


def test_no_identity_no_launcher_and_a_relative_program_is_not_launched() -> None:
    # unprivileged (no identity): nothing to drop, the shell gates if asked
    assert first_argv(PROGRAM, identity=None, gate=False, launcher="/l", setpriv="/s") == (
        PROGRAM,
        {},
    )
    assert first_argv(PROGRAM, identity=None, gate=True, launcher="/l", setpriv="/s")[0][:3] == [
        "/bin/sh",
        "-c",
        GATE,
    ]
    # the launcher execs an absolute path only; a bare name goes through setpriv's search
    argv, _ = first_argv(["python3"], identity=KERNEL, gate=False, launcher="/l", setpriv="/s")
    assert argv[0] == "/s" and argv[-1] == "python3"


def test_the_checkout_has_the_launcher_built_and_chooses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scripts/setup.sh builds it; a missing or stale one means kernels start via setpriv."""
    assert LAUNCHER.name == LAUNCHER_NAME
    assert LAUNCHER.is_file() and os.access(LAUNCHER, os.X_OK), f"{LAUNCHER} was not built"
    assert not stale(LAUNCHER, LAUNCH_SOURCE), f"{LAUNCHER} was not built from launch.c as it is"
    monkeypatch.delenv(ENV_CHOICE, raising=False)
    assert compiled_launcher() == str(LAUNCHER)
    monkeypatch.setenv(ENV_CHOICE, "python")
    assert compiled_launcher() is None


def test_the_build_command_the_refusal_names_runs_as_written() -> None:
    # "run sunroom build-helpers"; both are built from their sources here already
    done = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "build-helpers"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"compiled: {path} is up to date" for path in (BUILT, LAUNCHER)
    ]


SHOW_CAPS = "print(*[l for l in open('/proc/self/status') if l.startswith('Cap')], sep='', end='')"
"""Code that prints its process's capability sets, as /proc says them."""
KEEPING = ["--securebits=+no_setuid_fixup", "--inh-caps=+net_raw", "--ambient-caps=+net_raw"]
"""setpriv's options for a host that keeps capabilities across leaving uid 0, with an ambient
(so also inheritable) CAP_NET_RAW."""


@pytest.fixture
def lease() -> Iterator[IdentityLease]:
    if os.geteuid() != 0:
        pytest.skip("the launcher drops from root: run as root")
    taken = lease_identity()
    yield taken
    taken.release()


def _launch(
    lease: IdentityLease, gate: str, code: str, stdin: bytes
) -> subprocess.CompletedProcess[bytes]:
    ident = lease.identity
    return subprocess.run(
        [str(LAUNCHER), str(ident.uid), str(ident.gid), gate, sys.executable, "-I", "-S", "-c",
         code],
        input=stdin, capture_output=True, timeout=30, check=False, cwd="/",
    )  # fmt: skip


def test_it_runs_the_program_as_the_kernel_with_no_group_and_no_capability(
    lease: IdentityLease,
) -> None:
    done = _launch(lease, "0", WHO, b"what the program reads")
    assert done.returncode == 0, done.stderr
    ids = (lease.identity.uid,) * 3
    gids = (lease.identity.gid,) * 3
    expected = f"{ids} {gids} [] 0000000000000000 'what the program reads'\n"
    assert done.stdout.decode() == expected


def test_at_the_gate_it_waits_for_a_line_and_the_program_reads_nothing_of_it(
    lease: IdentityLease,
) -> None:
    done = _launch(lease, "1", WHO, b"go\nand what came after the line")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().endswith(" 0000000000000000 ''\n")  # stdin is /dev/null


def test_when_the_host_lets_go_before_the_gate_nothing_runs(lease: IdentityLease) -> None:
    shared = Path(tempfile.mkdtemp(prefix="sunroom-launch-test-", dir="/tmp"))
    try:
        os.chmod(shared, 0o777)  # the kernel's uid may create the mark here
        mark = shared / "ran"
        for stdin in (b"", b"no newline"):
            done = _launch(lease, "1", f"open({str(mark)!r}, 'w')", stdin)
            assert done.returncode == 1 and done.stderr == b""
            assert not mark.exists()
        done = _launch(lease, "1", f"open({str(mark)!r}, 'w')", b"go\n")  # the control
        assert done.returncode == 0, done.stderr
        assert mark.stat().st_uid == lease.identity.uid
    finally:
        shutil.rmtree(shared)


def test_it_refuses_a_malformed_command_line_in_one_line() -> None:
    for argv in (
        [],
        ["1000", "1000", "0"],  # no program
        ["0", "1000", "0", "/bin/true"],  # never root
        ["1000", "0", "0", "/bin/true"],
        ["-1", "1000", "0", "/bin/true"],
        ["x", "1000", "0", "/bin/true"],
        ["1000", "1000", "2", "/bin/true"],
        ["1000", "1000", "1", "true"],  # a relative program
    ):
        done = subprocess.run([str(LAUNCHER), *argv], capture_output=True, text=True, check=False)
        assert done.returncode == 64, argv
        assert done.stderr.startswith("sunroom-launch: usage: sunroom-launch UID GID GATE"), argv
        assert done.stderr.count("\n") == 1
        assert done.stdout == ""


def test_it_refuses_to_run_anything_when_it_cannot_drop(lease: IdentityLease) -> None:
    # started by a user that is not root, it cannot change its ids: nothing runs
    other = lease.identity.uid
    done = subprocess.run(
        [str(LAUNCHER), str(other + 1), str(other + 1), "0", "/bin/echo", "ran"],
        capture_output=True, text=True, check=False, user=other, group=other, extra_groups=[],
    )  # fmt: skip
    assert done.returncode == 127
    assert done.stdout == ""
    assert done.stderr == (
        "sunroom-launch: cannot drop the supplementary groups: Operation not permitted\n"
    )


def test_it_leaves_no_capability_where_the_hosts_securebits_would_keep_them(
    lease: IdentityLease,
) -> None:
    # a host whose securebits keep capabilities across leaving uid 0 (no_setuid_fixup), with
    # an ambient one that would even survive the exec: the program gets none of them, started
    # through the launcher or through setpriv
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) sets the securebits for this test"
    ident = lease.identity
    keeping = [setpriv, *KEEPING, "--"]
    program = [sys.executable, "-I", "-S", "-c", SHOW_CAPS]
    control = subprocess.run(
        [*keeping, setpriv, f"--reuid={ident.uid}", f"--regid={ident.gid}", "--clear-groups",
         "--", *program],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "CapAmb:\t0000000000002000" in control.stdout  # setpriv alone lets it through
    for launcher in (str(LAUNCHER), None):  # None: setpriv, as without the launcher
        argv, creds = first_argv(
            program, identity=ident, gate=False, launcher=launcher, setpriv=setpriv
        )
        assert creds == {}
        done = subprocess.run([*keeping, *argv], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        for line in done.stdout.splitlines():
            name, value = line.split(":\t")
            assert name == "CapBnd" or int(value, 16) == 0, (launcher, done.stdout)


def test_a_program_that_is_not_there_is_said_and_nothing_runs(lease: IdentityLease) -> None:
    ident = lease.identity
    done = subprocess.run(
        [str(LAUNCHER), str(ident.uid), str(ident.gid), "0", "/nonexistent/python"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 127
    assert done.stderr == "sunroom-launch: /nonexistent/python: No such file or directory\n"


def test_build_builds_the_launcher_from_its_source(tmp_path: Path) -> None:
    out = tmp_path / LAUNCHER_NAME
    assert build(out, source=LAUNCH_SOURCE) is None
    assert out.stat().st_mode & 0o777 == 0o755
    done = subprocess.run([str(out)], capture_output=True, text=True, check=False)
    assert done.returncode == 64 and done.stderr.startswith("sunroom-launch: usage:")


def test_without_a_launcher_or_setpriv_a_host_with_inheritable_capabilities_is_refused(
    lease: IdentityLease, tmp_path: Path
) -> None:
    # Popen's user= and group= cannot clear capabilities: the control shows an inheritable
    # and an ambient one reaching the program; sunroom refuses to start a kernel that way
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) sets the securebits for this test"
    ident = lease.identity
    drop = (
        "import subprocess, sys; "
        f"subprocess.run([sys.executable, '-I', '-S', '-c', {SHOW_CAPS!r}], check=True, "
        f"user={ident.uid}, group={ident.gid}, extra_groups=[])"
    )
    control = subprocess.run(
        [setpriv, *KEEPING, "--", sys.executable, "-I", "-c", drop],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "CapInh:\t0000000000002000" in control.stdout, control.stdout
    assert "CapAmb:\t0000000000002000" in control.stdout, control.stdout
    start = (
        "import sunroom\n"
        "try:\n"
        "    with sunroom.Kernel(backend='subprocess') as k:\n"
        "        print('ran', k.execute('1').value)\n"
        "except sunroom.SandboxUnavailableError as exc:\n"
        "    print('refused:', exc)\n"
    )
    # no launcher (SUNROOM_WATCHER=python) and no setpriv on PATH
    env = {**os.environ, ENV_CHOICE: "python", "PATH": str(tmp_path)}
    for keep, said in (([], "ran 1"), (KEEPING, "refused: this host holds inheritable")):
        done = subprocess.run(
            [setpriv, *keep, "--", sys.executable, "-c", start],
            capture_output=True, text=True, check=False, env=env, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(said), done.stdout
    assert done.stdout == (
        "refused: this host holds inheritable capabilities (CapInh 0x2000), which a kernel "
        "started without a launcher would keep: run sunroom build-helpers (needs a C compiler) "
        "or install setpriv (util-linux)\n"
    )


def test_inheritable_capabilities_are_read_from_the_status_and_unknown_is_refused(
    tmp_path: Path,
) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapInh:\t0000000000000000\nCapAmb:\t0000000000000000\n")
    refuse_inheritable_capabilities(str(status))  # none: nothing to refuse
    for text, said in (
        ("CapInh:\t0000000000000400\n", "holds inheritable capabilities (CapInh 0x400)"),
        ("Name:\tpython\n", "cannot tell"),
        ("CapInh:\tzz\n", "cannot tell"),
    ):
        status.write_text(text)
        with pytest.raises(SandboxUnavailableError, match=r"^[^\n]+$") as caught:
            refuse_inheritable_capabilities(str(status))
        assert said in str(caught.value)
    with pytest.raises(SandboxUnavailableError, match="cannot tell"):
        refuse_inheritable_capabilities(str(tmp_path / "absent"))
