"""A throwaway PostgreSQL cluster on 127.0.0.1, for the tests and benchmarks that need one.

:func:`find_bindir` finds the server binaries (``pg_config --bindir``,
``/usr/lib/postgresql/*/bin``, then ``PATH``); :func:`cluster` runs ``initdb`` into a new
temporary directory, starts ``postgres`` on a free loopback port (and a Unix socket in the same
directory, which its own setup uses, so it never talks to another cluster that took the port
first), waits until it accepts connections, yields a :class:`Cluster` and, on the way out,
stops it with an immediate shutdown (SIGQUIT, what ``pg_ctl stop -m immediate`` sends) and
removes the directory. Nothing is kept: it is a scratch server.

PostgreSQL refuses to run as root: when this process is root, the server runs as ``nobody``
and owns its directory (made outside any private directory, so ``nobody`` can reach it).

Authentication: ``trust`` for the superuser ``postgres`` on the socket and on loopback (a
scratch cluster), and ``scram-sha-256`` for :data:`PASSWORD_ROLE`, whose password is
:attr:`Cluster.password`, so a test can connect with a password in its DSN.

The tests use it through ``tests/pgserver.py``; ``benchmarks/store_append.py`` directly (it
imports ``_pg`` from its own directory, as the other benchmarks import ``_server``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

PASSWORD_ROLE = "sunroom_pw"
"""The role that logs in with a password (scram-sha-256) on loopback."""

_HBA = f"""\
local all all trust
host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


class ClusterError(RuntimeError):
    """The cluster could not be set up (initdb or the server failed); the message says why."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None when there is none here."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    newest_first = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True)
    candidates += [Path(p) for p in newest_first]
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def _major(path: str) -> int:
    version = Path(path).parent.name
    return int(version) if version.isdigit() else 0


@dataclass(frozen=True, slots=True)
class Cluster:
    """A running scratch cluster: its port on 127.0.0.1, its directory and its process."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    password: str

    def dsn(self, dbname: str = "postgres", *, password: bool = False) -> str:
        """A DSN for *dbname*: as ``postgres`` (trust), or as the password role."""
        if password:
            return f"postgresql://{PASSWORD_ROLE}:{self.password}@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, prefix: str = "test") -> str:
        """A new empty database (owned by the password role, so it may use it); its name."""
        name = f"{prefix}_{uuid.uuid4().hex}"
        with psycopg.connect(_socket_dsn(self.directory, self.port), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" OWNER {PASSWORD_ROLE}')
        return name

    def drop_database(self, name: str) -> None:
        """Drop database *name*, disconnecting whoever is still connected to it."""
        with psycopg.connect(_socket_dsn(self.directory, self.port), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def cluster(bindir: Path, *, fsync: bool = False, attempts: int = 3) -> Iterator[Cluster]:
    """Run a scratch cluster from *bindir* until the block ends (see the module docstring).

    *fsync* False turns off the server's fsync (fast, not crash-safe for the SERVER: a test
    kills client processes, never the server, so nothing relies on it). Raises ClusterError
    when initdb fails, or when the server does not accept connections within 30 s in any of
    *attempts* tries (each on a newly chosen free port).
    """
    directory = Path(tempfile.mkdtemp(prefix="sunroom-pg-", dir="/tmp"))
    as_nobody = os.geteuid() == 0
    try:
        if as_nobody:
            nobody = pwd.getpwnam("nobody")
            os.chown(directory, nobody.pw_uid, nobody.pw_gid)
        data = directory / "data"
        password = secrets.token_urlsafe(16)
        _initdb(bindir, data, as_nobody)
        (data / "pg_hba.conf").write_text(_HBA)
        last = ""
        for _ in range(attempts):
            port = _free_port()
            process = _start(bindir, directory, port, fsync, as_nobody)
            try:
                if _wait_ready(process, directory, port):
                    with psycopg.connect(_socket_dsn(directory, port)) as c:
                        c.execute(
                            f"CREATE ROLE {PASSWORD_ROLE} LOGIN CREATEDB PASSWORD '{password}'"
                        )
                    yield Cluster(
                        port=port, directory=directory, process=process, password=password
                    )
                    return
                last = (directory / "server.log").read_text(errors="replace")[-2000:]
            finally:
                _stop(process)
        raise ClusterError(f"postgres did not start in {attempts} tries; its log ends:\n{last}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _initdb(bindir: Path, data: Path, as_nobody: bool) -> None:
    done = subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
         "-E", "UTF8", "--locale=C", "--no-sync"],
        capture_output=True, text=True, timeout=120, user=_user(as_nobody),
        group=_group(as_nobody), extra_groups=[] if as_nobody else None,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def _start(
    bindir: Path, directory: Path, port: int, fsync: bool, as_nobody: bool
) -> subprocess.Popen[bytes]:
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - the child holds it
    with log:
        return subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(directory / "data"), "-k", str(directory),
             "-p", str(port), "-c", "listen_addresses=127.0.0.1",
             "-c", f"fsync={'on' if fsync else 'off'}",
             "-c", f"full_page_writes={'on' if fsync else 'off'}",
             "-c", "shared_buffers=32MB", "-c", "max_connections=200"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            user=_user(as_nobody), group=_group(as_nobody),
            extra_groups=[] if as_nobody else None,
        )  # fmt: skip


def _user(as_nobody: bool) -> str | None:
    return "nobody" if as_nobody else None


def _group(as_nobody: bool) -> int | None:
    return pwd.getpwnam("nobody").pw_gid if as_nobody else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _socket_dsn(directory: Path, port: int) -> str:
    """The superuser's DSN over the cluster's own Unix socket: never another cluster's."""
    return f"host={directory} port={port} user=postgres dbname=postgres"


def _wait_ready(process: subprocess.Popen[bytes], directory: Path, port: int) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with psycopg.connect(_socket_dsn(directory, port), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGQUIT)  # immediate shutdown, as pg_ctl stop -m immediate
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
