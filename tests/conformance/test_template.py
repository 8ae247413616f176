"""Templates: warm kernels with their setup done, forked for every kernel made from them."""

from __future__ import annotations

import ast
import asyncio
import os
import signal

import pytest

from sunroom import AsyncKernel, AsyncSession, KernelPool, Limits, Template
from sunroom.errors import ClosedError, ForkError, KernelStartError, UsageError
from sunroom.providers import AssistantMessage, TextPart
from sunroom.providers.fakes import ScriptedModel
from tests.conftest import _require

pytestmark = pytest.mark.usefixtures("no_process_left")


@pytest.fixture
def bwrap() -> str:
    """The bwrap backend, checked before any loop runs (templates fork only there)."""
    return _require("bwrap")


@pytest.fixture
def subprocess_backend() -> str:
    """The subprocess backend, checked before any loop runs."""
    return _require("subprocess")


def triple(x: int) -> int:
    """Three times *x*."""
    return 3 * x


def quadruple(x: int) -> int:
    """Four times *x*."""
    return 4 * x


async def test_kernels_from_a_template_start_with_its_setup_done(fork_backend: str) -> None:
    async with Template(
        setup="import json\nloaded = {'rows': [1, 2]}",
        backend=fork_backend,
        functions=[triple],
        inputs={"n": 5},
        limits=Limits(timeout_s=5),
    ) as template:
        a = await template.kernel()
        b = await template.kernel()
        try:
            r = await a.execute("loaded['rows'].append(3)\n(loaded, json.dumps(n), triple(n))")
            assert r.value == "({'rows': [1, 2, 3]}, '5', 15)", r
            assert (await b.execute("loaded['rows']")).value == "[1, 2]"
            assert a.limits == template.limits
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_template_kernel_adds_functions_and_inputs_and_restarts_from_the_template(
    fork_backend: str,
) -> None:
    async with Template(
        setup="base = 10", backend=fork_backend, functions=[triple], limits=Limits(timeout_s=5)
    ) as template:
        async with AsyncKernel(template=template, functions=[quadruple], inputs={"m": 2}) as k:
            assert (await k.execute("(base, triple(m), quadruple(m))")).value == "(10, 6, 8)"
            r = await k.execute(
                "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True: time.sleep(0.01)",
                timeout_s=0.5,
            )
            assert r.status == "timeout" and r.state_lost
            # restarted as a fork of the template: setup, functions and inputs are back
            assert (await k.execute("(base, triple(m), quadruple(m))")).value == "(10, 6, 8)"
        with pytest.raises(UsageError, match="already bound by the template"):
            AsyncKernel(template=Template(inputs={"x": 1}), inputs={"x": 2})
        with pytest.raises(UsageError, match="limits"):
            AsyncKernel(template=template, limits=Limits(timeout_s=1))


async def test_a_failing_setup_is_reported_at_creation(fork_backend: str) -> None:
    template = Template(setup="import no_such_module_here", backend=fork_backend)
    with pytest.raises(KernelStartError, match="setup failed: ModuleNotFoundError"):
        await template.start()
    await template.aclose()
    with pytest.raises(ClosedError):
        await template.kernel()


async def test_a_dead_template_kernel_is_started_again(bwrap: str) -> None:
    # only bwrap templates keep a kernel to fork from
    async with Template(
        setup="import os\nready = os.urandom(8).hex()", backend="bwrap"
    ) as template:
        first = await template.kernel()
        zygote_pid = (await first.execute("ready")).value
        await first.aclose()
        zygote = template._zygote  # noqa: SLF001
        assert zygote is not None
        pid = getattr(zygote.process, "kernel_pid", None)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if template._zygote is None or not template._zygote.running:  # noqa: SLF001
                break
            await asyncio.sleep(0.02)
        second = await template.kernel()
        try:
            assert (await second.execute("ready")).value != zygote_pid
            assert template.restarts == 1
        finally:
            await second.aclose()


async def test_many_kernels_at_once_from_one_template(fork_backend: str) -> None:
    async with Template(setup="state = []", backend=fork_backend) as template:
        kernels = await asyncio.gather(*(template.kernel() for _ in range(8)))
        try:
            results = await asyncio.gather(
                *(k.execute(f"state.append({i})\nstate") for i, k in enumerate(kernels))
            )
            assert [r.value for r in results] == [f"[{i}]" for i in range(8)]
        finally:
            await asyncio.gather(*(k.aclose() for k in kernels))


async def test_a_session_runs_in_a_kernel_from_a_template(fork_backend: str) -> None:
    model = ScriptedModel(
        [
            AssistantMessage(content=[TextPart("```python\nsubmit(str(warm + 1))\n```")]),
        ]
    )
    async with (
        Template(setup="warm = 41", backend=fork_backend) as template,
        AsyncSession(model=model, template=template) as session,
    ):
        result = await session.run("add one")
        assert result.ok, result
        assert result.output == "42"


async def test_a_pool_keeps_forks_of_a_template_ready(fork_backend: str) -> None:
    async with (
        Template(setup="warm = [1]", backend=fork_backend, functions=[triple]) as template,
        KernelPool(template=template, size=2) as pool,
    ):
        await pool.wait_ready()
        assert pool.limits == template.limits
        async with AsyncKernel(pool=pool, functions=[quadruple], inputs={"m": 2}) as k:
            assert (await k.execute("(warm, triple(m), quadruple(m))")).value == "([1], 6, 8)"
            await k.execute("warm.append(2)")
            r = await k.execute("while True: pass", timeout_s=0.3)
            assert r.status == "timeout" and not r.state_lost
            await k.restart()  # takes another ready fork: the setup is there, fresh
            assert (await k.execute("(warm, triple(m), quadruple(m))")).value == "([1], 6, 8)"
        assert pool.cold_starts == 0
        with pytest.raises(UsageError, match="its limits"):
            KernelPool(template=template, limits=Limits(timeout_s=1))
        with pytest.raises(UsageError, match="pool or from a template"):
            AsyncKernel(pool=pool, template=template)


async def test_kernels_of_a_template_that_cannot_fork_are_started_apart(
    subprocess_backend: str,
) -> None:
    # subprocess and docker cannot give a fork a uid and namespaces of its own: every kernel
    # is started on its own and runs the setup, so none shares memory with another
    async with Template(
        setup="import os\nready = os.urandom(8).hex()", backend="subprocess"
    ) as template:
        assert not template.warm and template._zygote is None  # noqa: SLF001
        a, b = await template.kernel(), await template.kernel()
        try:
            first, second = [(await k.execute("ready")).value for k in (a, b)]
            assert first != second
            assert template.restarts == 0
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_bwrap_template_kernel_is_a_tenant_of_its_own(bwrap: str) -> None:
    async with Template(
        setup="import os\nopen('made-by-setup.txt', 'w').write('hi')\nos.makedirs('/tmp/z')",
        backend="bwrap",
        max_kernels=2,
    ) as template:
        a, b = await template.kernel(), await template.kernel()
        try:
            probe = (
                "import os\n(os.getpid(), os.getcwd(), sorted(os.listdir('/forks')),"
                " open('made-by-setup.txt').read(), os.stat('made-by-setup.txt').st_uid"
                " == os.getuid(), os.path.exists('/tmp/z'),"
                " open('/proc/self/status').read().split('CapEff:')[1].split()[0],"
                " sorted(p for p in os.listdir('/proc') if p.isdigit()),"
                " __import__('ctypes').CDLL(None).prctl(3, 0, 0, 0, 0))"
            )
            value = (await a.execute(probe)).value
            assert value is not None
            pid, cwd, forks, text, owned, tmp_z, caps, pids, dumpable = ast.literal_eval(value)
            assert (pid, cwd, forks, text, owned) == (2, "/work", [], "hi", True)
            assert not tmp_z  # /tmp is its own, fresh
            assert caps == "0000000000000000"
            assert pids == ["1", "2"]
            assert dumpable == 0  # PR_GET_DUMPABLE
            # a third live kernel is refused until one is closed; its uid is then free again
            with pytest.raises(KernelStartError, match="all 2 kernels of this template"):
                await template.kernel()
            await b.aclose()
            c = await template.kernel()
            await c.aclose()
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_setup_that_leaves_a_descriptor_open_is_refused_tenants(bwrap: str) -> None:
    # an inherited descriptor is the same open file for every kernel of the template: a
    # channel between tenants, so a template on bwrap refuses to make kernels from it
    async with Template(setup="kept = open('shared.log', 'a')", backend="bwrap") as template:
        with pytest.raises(ForkError, match=r"left 1 descriptor\(s\) open \(/work/shared.log\)"):
            await template.kernel()
    async with Template(
        setup="with open('shared.log', 'a') as f:\n    f.write('made')", backend="bwrap"
    ) as template:
        k = await template.kernel()
        try:
            assert (await k.execute("open('shared.log').read()")).value == "'made'"
        finally:
            await k.aclose()


async def test_a_zygotes_cgroup_has_room_for_what_its_tenants_leave_charged_to_it(
    bwrap: str,
) -> None:
    # a tenant is born in the zygote's cgroup (cgroup v1 cannot clone into another), so some
    # of its pages stay charged there while it lives: the zygote's limit has room for them,
    # and what each tenant leaves stays within that room (~950 tenants OOM-killed a zygote
    # with none)
    from sunroom.sandbox.backends.bwrap import ZYGOTE_CHARGE_PER_TENANT_MB
    from sunroom.sandbox.process import SupervisedProcess

    tenants = 8
    async with Template(
        setup="import json", backend=bwrap, limits=Limits(memory_mb=512), max_kernels=tenants
    ) as template:
        await (await template.kernel()).aclose()  # the zygote is up, and has forked once
        zygote = template._zygote  # noqa: SLF001 - its cgroup, read as the host sees it
        assert zygote is not None
        root = zygote.process
        root = getattr(root, "root", root)  # its family's root once it has forked
        assert isinstance(root, SupervisedProcess)
        cgroup = root.cgroup
        if cgroup is None or cgroup.memory_dir is None:
            pytest.skip("no memory cgroup to read here")
        memory = cgroup.memory_dir
        limit_file = "memory.limit_in_bytes" if cgroup.version == 1 else "memory.max"
        usage_file = "memory.usage_in_bytes" if cgroup.version == 1 else "memory.current"
        limit = int((memory / limit_file).read_text())
        assert limit == (512 + tenants * ZYGOTE_CHARGE_PER_TENANT_MB) * 1024 * 1024
        before = int((memory / usage_file).read_text())
        kernels = [await template.kernel() for _ in range(tenants)]
        try:
            for k in kernels:
                assert (await k.execute("1 + 1")).value == "2"
            grown = int((memory / usage_file).read_text()) - before
            assert grown < tenants * ZYGOTE_CHARGE_PER_TENANT_MB * 1024 * 1024, grown
        finally:
            await asyncio.gather(*(k.aclose() for k in kernels))
