"""Kernels handed out apart are tenants of their own, on bwrap and docker (issue 26).

Two kernels from one ``Template``, two from one ``KernelPool`` of a template, and two served by
``sunroom serve`` from one template: kernel A plants a secret everywhere a tenant can
(tests/security/tenants.py) and kernel B tries every way across (files, ``/proc/<pid>/mem``,
environ, signals, abstract Unix sockets, shared memory, ``/tmp``, per-user limits). 0 leaks,
0 signals; A is still running and not stopped afterwards; and from the host, each runs as a
uid of its own that is neither root's nor the other's.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sunroom import AsyncKernel, KernelPool, Template
from sunroom.sandbox.identity import lease_identity
from sunroom.sandbox.kernel import AsyncKernel as KernelClass
from tests.conftest import _require
from tests.security.tenants import (
    assert_isolated,
    attack_code,
    new_plant,
    plant_code,
    still_running_code,
)
from tests.service.conftest import Server
from tests.service.conftest import make_server as make_server  # the fixture, re-exported

pytestmark = pytest.mark.usefixtures("no_process_left")


def _host_uid(kernel: KernelClass) -> int:
    """The host uid *kernel*'s runtime runs as."""
    proc = kernel.process
    identity = getattr(proc, "identity", None)  # docker: the container's user
    if identity is not None:
        return int(identity.uid)
    with open(f"/proc/{_host_pid(kernel)}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))


def _host_pid(kernel: KernelClass) -> int:
    pid = getattr(kernel.process, "host_pid", None)
    assert isinstance(pid, int), kernel.process
    return pid


async def _attack_between(a: KernelClass, b: KernelClass) -> None:
    plant = new_plant()
    planted = await a.execute(plant_code(plant))
    assert planted.ok, planted
    a_pid, a_inotify = ast.literal_eval(planted.value or "")
    a_pids = [a_pid] + ([_host_pid(a)] if getattr(a.process, "host_pid", None) else [])
    attacked = await b.execute(attack_code(plant, a_pids), timeout_s=60)
    assert attacked.ok, attacked
    assert_isolated(attacked.value)
    # A and its marked process were neither stopped nor killed, and A kept its state
    answer = await a.execute(still_running_code(), timeout_s=10)
    assert answer.value == repr(("S", None, plant.secret[:8])), answer
    a_uid, b_uid = _host_uid(a), _host_uid(b)
    assert 0 not in (a_uid, b_uid), (a_uid, b_uid)
    if os.geteuid() == 0:  # as root, every tenant has a host uid of its own
        assert a_uid != b_uid, (a_uid, b_uid)
    assert a_inotify > 0


async def test_two_kernels_of_one_template_are_tenants_of_their_own(
    isolated_backend: str,
) -> None:
    async with Template(setup="import json\nshared = [1, 2]", backend=isolated_backend) as t:
        a, b = await t.kernel(), await t.kernel()
        try:
            await _attack_between(a, b)
        finally:
            await a.aclose()
            await b.aclose()


async def test_two_pooled_kernels_of_one_template_are_tenants_of_their_own(
    isolated_backend: str,
) -> None:
    async with (
        Template(setup="import json", backend=isolated_backend) as t,
        KernelPool(template=t, size=2) as pool,
    ):
        await pool.wait_ready()
        async with AsyncKernel(pool=pool) as a, AsyncKernel(pool=pool) as b:
            await _attack_between(a, b)


def test_two_service_kernels_of_one_template_are_tenants_of_their_own(
    isolated_backend: str, make_server: Callable[..., Server]
) -> None:
    server = make_server(backend=isolated_backend, templates={"base": "import json"})
    ids = []
    for _ in range(2):
        r = server.client.post("/kernels", json={"template": "base"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["kernel_id"])
    a, b = ids

    def execute(kid: str, code: str) -> dict[str, object]:
        r = server.client.post(
            f"/kernels/{kid}/execute", json={"code": code, "timeout_s": 60}, timeout=90
        )
        assert r.status_code == 200, r.text
        body: dict[str, object] = r.json()
        assert body["status"] == "ok", body
        return body

    try:
        plant = new_plant()
        a_pid, _ = ast.literal_eval(str(execute(a, plant_code(plant))["value"]))
        verdict = execute(b, attack_code(plant, [a_pid]))["value"]
        assert_isolated(str(verdict))
        assert execute(a, still_running_code())["value"] == repr(("S", None, plant.secret[:8]))
        # a file uploaded to B is not among A's files, nor reachable by A's glob
        put = server.client.put(f"/kernels/{b}/files/uploaded.txt", content=plant.secret.encode())
        assert put.status_code in (200, 201), put.text
        seen = execute(
            a,
            "import glob\n[p for top in ('/work', '/forks', '/tmp', '/dev/shm', '/site', '/run')"
            " for p in glob.glob(top + '/**/uploaded.txt', recursive=True)]",
        )["value"]
        assert seen == "[]", seen
    finally:
        for kid in ids:
            server.client.delete(f"/kernels/{kid}")


UNPRIVILEGED_HOST = """
import asyncio, json
from sunroom import Template
from sunroom.sandbox.backends.bwrap import BwrapBackend
from tests.security.tenants import attack_code, new_plant, plant_code, still_running_code


async def main() -> None:
    backend = BwrapBackend(require_cgroups=False)  # an unprivileged user has no cgroup tree
    async with Template(setup="import json", backend=backend) as template:
        a, b = await template.kernel(), await template.kernel()
        plant = new_plant()
        planted = await a.execute(plant_code(plant))
        attacked = await b.execute(attack_code(plant, [2]), timeout_s=60)
        after = await a.execute(still_running_code())
        print(json.dumps([planted.value, attacked.value, after.value, plant.secret[:8]]))
        await a.aclose()
        await b.aclose()


asyncio.run(main())
"""


def test_template_kernels_are_tenants_when_sunroom_runs_unprivileged() -> None:
    # as an unprivileged user bubblewrap builds the sandbox from an outer user namespace:
    # a tenant cannot unmount what the zygote inherited (only cover it) and needs the
    # zygote's spare /proc to mount its own; every tenant keeps the user's one uid
    if os.geteuid() != 0:
        pytest.skip("needs root to run the host as an unprivileged user")
    _require("bwrap")
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to drop to a user"
    lease = lease_identity()
    try:
        uid = lease.identity.uid
        root = str(Path(__file__).resolve().parents[2])
        run = subprocess.run(
            [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
             sys.executable, "-c", UNPRIVILEGED_HOST],
            capture_output=True, text=True, timeout=120, cwd="/",
            env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", "PYTHONPATH": root},
        )  # fmt: skip
    finally:
        lease.release()
    assert run.returncode == 0, run.stderr[-3000:]
    planted, attacked, after, secret = json.loads(run.stdout.strip().splitlines()[-1])
    assert ast.literal_eval(planted)[0] == 2
    verdict = json.loads(ast.literal_eval(attacked))
    # the user's per-user limits are the user's, shared by every kernel it starts (one uid)
    assert verdict["found"] == [] and verdict["signalled"] == [], verdict
    assert after == repr(("S", None, secret)), after
