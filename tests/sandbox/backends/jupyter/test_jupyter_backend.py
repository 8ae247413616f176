"""The jupyter backend end to end: real ipykernel and bash_kernel, in bwrap and unsandboxed.

What IPython adds (magics, ``!`` lines, rich display), sunroom's contract mapped from the
Jupyter protocol (caps, errors, timeouts), host functions, inputs and submit in an agent
session, a non-Python kernel, and bad input: unknown kernelspecs, kernels that die at start or
never answer, display floods, ``%pip install`` with no network.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sunroom import AsyncKernel, JupyterBackend, Limits
from sunroom.agent import AsyncSession
from sunroom.errors import KernelStartError, UsageError
from sunroom.providers import ScriptedModel
from sunroom.sandbox.backends.jupyter import kernelspecs
from tests.agent.conftest import code, last_output
from tests.security.test_host_dos import PeakRss

LIMITS = Limits(timeout_s=20, interrupt_grace_s=1.0, start_timeout_s=20)


def add(a: int, b: int) -> int:
    """Add two numbers on the host."""
    return a + b


@pytest.fixture(params=["bwrap", "docker", "none"])
def sandbox(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_ipython_features_and_sunroom_functions_in_one_kernel(sandbox: str) -> None:
    backend = JupyterBackend("python3", sandbox=sandbox)
    async with AsyncKernel(
        backend=backend, functions=[add], inputs={"rows": [1, 2, 3]}, limits=LIMITS
    ) as k:
        r = await k.execute("x = add(40, 2)\nprint('sum', sum(rows))\nx")
        assert r.ok, r
        assert r.stdout == "sum 6\n"
        assert r.value == "42"
        magic = await k.execute("%time y = x + 1\ny")
        assert magic.ok and magic.value == "43", magic
        assert "Wall time" in magic.stdout
        shell = await k.execute("!echo from-a-shell-line")
        assert shell.ok and "from-a-shell-line" in shell.stdout, shell
        rich = await k.execute(
            "from IPython.display import HTML, display\n"
            "display(HTML('<b>bold</b>'))\n"
            "class T:\n"
            "    def _repr_html_(self): return '<table/>'\n"
            "T()"
        )
        assert rich.ok, rich
        html = [o.data["text/html"] for o in rich.outputs if "text/html" in o.data]
        assert html == ["<b>bold</b>", "<table/>"]
        names = {v.name for v in await k.variables()}
        assert {"x", "y", "rows"} <= names
        assert not names & {"In", "Out", "get_ipython", "exit", "quit"}


async def test_errors_input_and_output_caps() -> None:
    limits = Limits(timeout_s=20, start_timeout_s=20, max_output_bytes=1000)
    async with AsyncKernel(backend=JupyterBackend(sandbox="none"), limits=limits) as k:
        err = await k.execute("def f():\n    return 1 / 0\nf()")
        assert err.status == "error"
        assert err.error is not None
        assert err.error.type == "ZeroDivisionError"
        assert "\x1b[" not in err.error.traceback and "1 / 0" in err.error.traceback
        eof = await k.execute("input('name? ')")
        assert eof.error is not None and eof.error.type == "EOFError", eof
        flood = await k.execute("for i in range(100_000):\n    print('line', i)")
        assert flood.ok
        assert len(flood.stdout) < 1200
        assert flood.truncated_bytes > 1_000_000
        assert flood.stdout.startswith("line 0\n") and flood.stdout.endswith("line 99999\n")
        after = await k.execute("'still here'")
        assert after.value == "'still here'"


async def test_a_display_flood_is_capped_and_counted() -> None:
    limits = Limits(timeout_s=30, start_timeout_s=20, max_display_bytes=20_000)
    async with AsyncKernel(backend=JupyterBackend(sandbox="none"), limits=limits) as k:
        r = await k.execute(
            "from IPython.display import display, HTML\n"
            "for i in range(500):\n"
            "    display(HTML('x' * 1000))"
        )
        assert r.ok, r
        assert 0 < len(r.outputs) <= 20
        assert len(r.outputs) + r.dropped_outputs == 500


async def test_timeouts_interrupt_then_kill_and_restart(sandbox: str) -> None:
    limits = Limits(timeout_s=1.5, interrupt_grace_s=1.0, start_timeout_s=20)
    async with AsyncKernel(backend=JupyterBackend(sandbox=sandbox), limits=limits) as k:
        await k.execute("kept = 7")
        busy = await k.execute("while True:\n    pass")
        assert busy.status == "timeout", busy
        assert not busy.state_lost
        assert (await k.execute("kept")).value == "7"
        stuck = await k.execute(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
        )
        assert stuck.status == "timeout" and stuck.state_lost, stuck
        assert k.restarts == 1
        fresh = await k.execute("'kept' in dir()")
        assert fresh.value == "False"


async def test_a_dead_kernel_is_reported_and_restarted() -> None:
    async with AsyncKernel(backend=JupyterBackend(sandbox="none"), limits=LIMITS) as k:
        died = await k.execute("import os\nos._exit(3)")
        assert died.status == "died" and died.state_lost, died
        assert (await k.execute("1 + 1")).value == "2"


async def test_pip_install_without_network_is_an_error_not_a_hang() -> None:
    limits = Limits(timeout_s=60, start_timeout_s=20)
    async with AsyncKernel(backend=JupyterBackend(sandbox="bwrap"), limits=limits) as k:
        r = await k.execute(
            "%pip install --no-cache-dir --retries 0 --timeout 3 sunroom-no-such-package-xyz"
        )
    assert r.status != "timeout", r
    text = r.stdout + r.stderr
    assert "ERROR" in text or "error" in text.lower(), r


async def test_the_bash_kernel_runs_sandboxed_and_refuses_sunroom_functions() -> None:
    backend = JupyterBackend("bash", sandbox="bwrap")
    assert not backend.python
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute("echo hello-$((6 * 7)) && id -u && ls /")
        assert r.ok, r
        assert "hello-42" in r.stdout
        assert r.stdout.splitlines()[1] == "1000"  # the sandbox user, never root
        fail = await k.execute("false")
        assert fail.status == "error", fail
        await k.files.write("note.txt", b"from the host")
        assert (await k.execute("cat note.txt")).stdout.strip() == "from the host"
        with pytest.raises(UsageError, match="variables need a Python kernel"):
            await k.variables()
        with pytest.raises(UsageError, match="inputs need a Python kernel"):
            await k.bind(x=1)
    with pytest.raises(UsageError, match="need a Python kernel"):
        AsyncKernel(backend=backend, functions=[add])
    with pytest.raises(UsageError, match="need a Python kernel"):
        AsyncKernel(backend=backend, inputs={"x": 1})


async def test_an_agent_session_runs_unchanged_on_jupyter() -> None:
    model = ScriptedModel([code("total = add(20, 22)\nprint(total)"), code("submit(total)")])
    async with AsyncSession(
        model=model,
        backend=JupyterBackend(sandbox="bwrap"),
        functions=[add],
        output={"type": "integer"},
        limits=LIMITS,
    ) as s:
        result = await s.run("add them")
    assert result.status == "success" and result.output == 42, result
    assert "42" in last_output(model.requests[1])


# -- bad kernelspecs ------------------------------------------------------------------------


def _spec(root: Path, name: str, argv: list[str], language: str = "other") -> None:
    d = root / "kernels" / name
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": name, "language": language})
    )


def test_an_unknown_kernelspec_is_refused_naming_the_installed_ones() -> None:
    installed = {s.name for s in kernelspecs()}
    assert {"python3", "bash"} <= installed
    with pytest.raises(UsageError, match=r"no Jupyter kernel named 'nope'.*python3"):
        JupyterBackend("nope")
    with pytest.raises(UsageError, match="unknown backend|unknown sandbox"):
        JupyterBackend(sandbox="vm")


async def test_a_kernel_that_dies_or_stays_silent_at_start_is_a_start_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _spec(
        tmp_path, "dies", ["python", "-c", "import sys; print('bye', file=sys.stderr); sys.exit(3)"]
    )
    _spec(tmp_path, "silent", ["python", "-c", "import time; time.sleep(120)"])
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    with pytest.raises(KernelStartError, match="did not start: it ended") as died:
        async with AsyncKernel(backend=JupyterBackend("dies", sandbox="none"), limits=LIMITS):
            pass
    assert "exited with status 3" in str(died.value) and "bye" in str(died.value)
    quick = Limits(start_timeout_s=2)
    with pytest.raises(KernelStartError, match="did not answer kernel_info within 2 s"):
        async with AsyncKernel(backend=JupyterBackend("silent", sandbox="bwrap"), limits=quick):
            pass
    assert sys.executable  # the fake specs ran sunroom's interpreter, in the sandbox too


async def test_the_memory_limit_holds_for_an_ipython_kernel() -> None:
    """The cgroup's 512 MB binds (address space has room for ipykernel's threads)."""
    limits = Limits(memory_mb=512, timeout_s=30, start_timeout_s=20)
    async with AsyncKernel(backend=JupyterBackend(sandbox="bwrap"), limits=limits) as k:
        r = await k.execute("x = bytearray(1536 * 1024 * 1024)\nx[::4096] = b'1' * len(x[::4096])")
        assert r.status in ("error", "died"), r
        if r.status == "error":
            assert r.error is not None and r.error.type == "MemoryError"
        else:
            assert "memory" in (r.error.message if r.error else ""), r
        assert (await k.execute("1 + 1")).value == "2"


async def test_a_kernel_that_sends_a_huge_message_itself_cannot_balloon_the_host() -> None:
    """Past the stream cap: kernel code sends a 300 MB message on IOPub with ipykernel's own
    session. The host's sockets refuse messages over the cap (ZMQ_MAXMSGSIZE), so its peak
    memory stays bounded; the cell ends one way or another and the kernel is usable after."""
    limits = Limits(timeout_s=10, interrupt_grace_s=1, start_timeout_s=20)
    async with AsyncKernel(backend=JupyterBackend(sandbox="bwrap"), limits=limits) as k:
        await k.execute("x = 1")
        with PeakRss() as peak:
            r = await k.execute(
                "k = get_ipython().kernel\n"
                "text = 'x' * (300 << 20)\n"
                "k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': text},"
                " parent=k.get_parent('shell'))\n"
                "'sent'"
            )
        assert peak.growth_mb < 64, f"the host's peak RSS grew by {peak.growth_mb:.0f} MB"
        assert r.status in ("ok", "timeout", "died"), r
        assert r.truncated_bytes < 300 << 20  # the huge message never reached the mapping
        assert (await k.execute("1 + 1")).value == "2"
