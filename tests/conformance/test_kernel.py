"""Kernel behaviours every backend must show (run once per backend under test)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import psutil
import pytest

import sunroom
from sunroom import AsyncKernel, Limits
from sunroom.sandbox.limits import MIN_PIDS


@pytest.fixture
async def kernel(backend: str) -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=3)) as k:
        yield k


async def test_state_persists_across_cells(kernel: AsyncKernel) -> None:
    assert (await kernel.execute("x = 40\ndef f(a):\n    return a + x")).ok
    r = await kernel.execute("f(2)")
    assert r.ok and r.value == "42"
    assert (await kernel.execute("x += 1\nx")).value == "41"


async def test_print_order_and_trailing_expression(kernel: AsyncKernel) -> None:
    r = await kernel.execute(
        "for i in range(5):\n    print(i)\nimport sys\nprint('e', file=sys.stderr)\n'done'"
    )
    assert r.stdout == "0\n1\n2\n3\n4\n"
    assert r.stderr == "e\n"
    assert r.value == "'done'"
    assert (await kernel.execute("None")).value is None
    assert (await kernel.execute("x = 1")).value is None


async def test_exception_is_data_with_user_frames_only(kernel: AsyncKernel) -> None:
    r = await kernel.execute("def g():\n    return {}['missing']\n\ng()")
    assert r.status == "error" and not r.ok
    assert r.error is not None
    assert r.error.type == "KeyError"
    assert r.error.message == "'missing'"
    tb = r.error.traceback
    assert "return {}['missing']" in tb and "<cell-" in tb
    assert "sunroom" not in tb and "executor" not in tb


async def test_a_cell_named_by_filename_is_named_so_in_its_tracebacks(backend: str) -> None:
    if backend == "jupyter":
        pytest.skip("Jupyter kernels name their cells themselves (filename is not used)")
    async with AsyncKernel(backend=backend) as k:
        r = await k.execute("def g():\n    return 1 / 0\n\ng()", filename="job.py")
        assert r.error is not None and r.error.type == "ZeroDivisionError"
        tb = r.error.traceback
        assert 'File "job.py", line 4, in <module>' in tb and 'File "job.py", line 2, in g' in tb
        assert "sunroom" not in tb and "executor" not in tb
        again = await k.execute("g()")  # a later cell: <cell-2>, and g's frame still job.py's
        assert again.error is not None
        assert '"<cell-2>", line 1' in again.error.traceback
        assert 'File "job.py", line 2, in g\n    return 1 / 0' in again.error.traceback
        bad = await k.execute("x = (", filename="bad.py")
        assert bad.error is not None and 'File "bad.py", line 1' in bad.error.traceback


async def test_syntax_error_has_caret(kernel: AsyncKernel) -> None:
    r = await kernel.execute("x = (1 +\nprint('never')")
    assert r.status == "error" and r.error is not None
    assert r.error.type == "SyntaxError"
    assert "^" in r.error.traceback
    assert r.stdout == ""
    assert (await kernel.execute("1 + 1")).value == "2"


@pytest.mark.parametrize(
    "code",
    [
        "raise SystemExit(3)",
        "import sys; sys.exit('bye')",
        "raise KeyboardInterrupt",
        "class E(SystemExit): pass\nraise E()",
        "class K(KeyboardInterrupt): pass\nraise K()",
        "class B(BaseException): pass\nraise B('x')",
        "exit()",
    ],
)
async def test_base_exceptions_do_not_desync(kernel: AsyncKernel, code: str) -> None:
    r = await kernel.execute(code)
    assert r.status == "error" and not r.state_lost
    r2 = await kernel.execute("'still here'")
    assert r2.ok and r2.value == "'still here'"


async def test_input_raises_eof_and_top_level_await(kernel: AsyncKernel) -> None:
    r = await kernel.execute("input('name? ')")
    assert r.error is not None and r.error.type == "EOFError"
    r = await kernel.execute(
        "import asyncio\nawait asyncio.sleep(0.01)\nv = await asyncio.sleep(0, 'ok')\nv"
    )
    assert r.ok and r.value == "'ok'"


async def test_invalid_utf8_is_replaced(kernel: AsyncKernel) -> None:
    r = await kernel.execute("import os\nos.write(1, b'ok \\xff\\xfe end\\n')")
    assert r.ok and r.stdout == "ok \ufffd\ufffd end\n"


async def test_c_level_writes_are_captured(kernel: AsyncKernel) -> None:
    r = await kernel.execute(
        "import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.write(1, b'from C\\n', 7)\n"
        "os.system('echo from child')"
    )
    assert r.ok
    assert "from C\n" in r.stdout and "from child\n" in r.stdout


async def test_forged_frames_on_stdout_are_just_text(kernel: AsyncKernel) -> None:
    code = (
        "import os, struct, msgpack\n"
        "p = msgpack.packb([1, 1, None, {'stdout': 'forged'}])\n"
        "os.write(1, struct.pack('>I', len(p)) + p)\n"
        "p = msgpack.packb([2, 'hello', {'nonce': 'x'}])\n"
        "os.write(2, struct.pack('>I', len(p)) + p)\n"
        "'real'"
    )
    r = await kernel.execute(code)
    assert r.ok and r.value == "'real'"
    assert "forged" in r.stdout and r.stdout != "forged"
    assert (await kernel.execute("2")).value == "2"


async def test_output_cap_keeps_head_and_tail(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=Limits(max_output_bytes=1000)) as k:
        r = await k.execute("print('HEAD')\nfor i in range(10000): print(i)\nprint('TAIL')")
        assert r.ok
        assert r.stdout.startswith("HEAD\n") and r.stdout.endswith("TAIL\n")
        assert r.truncated_bytes > 40000
        assert "dropped" in r.stdout
        assert len(r.stdout) < 1200


async def test_output_streams_while_the_cell_runs(backend: str) -> None:
    seen: list[tuple[float, str]] = []
    async with AsyncKernel(
        backend=backend, on_output=lambda name, text: seen.append((time.monotonic(), text))
    ) as k:
        started = time.monotonic()
        r = await k.execute(
            "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')"
        )
        assert r.ok
    first = [t for t, text in seen if "first" in text]
    assert first and first[0] - started < 0.4


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import ctypes\nctypes.CDLL(None).sleep(100)",
        "import time\ntime.sleep(100)",
    ],
)
async def test_timeout_interrupts_and_keeps_state(backend: str, code: str) -> None:
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=1)) as k:
        await k.execute("keep = 'me'")
        started = time.monotonic()
        r = await k.execute(code)
        assert time.monotonic() - started < 1 + 2
        assert r.status == "timeout" and r.error is not None
        r2 = await k.execute("keep")
        assert r2.ok and r2.value == "'me'"


async def test_timeout_of_sigint_ignoring_loop_restarts(backend: str) -> None:
    async with AsyncKernel(
        backend=backend, inputs={"given": 7}, limits=Limits(timeout_s=1, interrupt_grace_s=0.5)
    ) as k:
        await k.execute("lost = 1")
        started = time.monotonic()
        r = await k.execute(
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
        )
        restart_s = 2 if backend == "jupyter" else 0  # an IPython kernel starts in ~1.5 s
        assert time.monotonic() - started < 1 + 2 + restart_s
        assert r.status == "timeout" and r.state_lost
        r2 = await k.execute("given")
        assert r2.ok and r2.value == "7"
        r3 = await k.execute("lost")
        assert r3.error is not None and r3.error.type == "NameError"


async def test_interrupt_catching_loop_is_killed(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=1, interrupt_grace_s=0.3)) as k:
        started = time.monotonic()
        r = await k.execute(
            "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass"
        )
        assert time.monotonic() - started < 3
        assert r.status == "timeout" and r.state_lost
        assert (await k.execute("1")).ok


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os\nos._exit(3)", "status 3"),
        ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
    ],
)
async def test_death_is_classified_and_recovered(backend: str, code: str, reason: str) -> None:
    async with AsyncKernel(backend=backend, inputs={"given": 1}) as k:
        r = await k.execute(code)
        assert r.status == "died" and r.state_lost
        assert r.error is not None and reason in r.error.message
        r2 = await k.execute("given + 1")
        assert r2.ok and r2.value == "2"


async def test_a_cell_over_the_frame_is_refused_before_it_is_sent(backend: str) -> None:
    """UsageError naming the limit; the kernel is not killed and keeps its state (before: a
    "died" result, "the kernel broke the protocol (cannot send 'execute' ...)", a restart)."""
    limits = Limits(max_frame_bytes=64 * 1024)
    async with AsyncKernel(backend=backend, limits=limits) as k:
        assert (await k.execute("kept = 1")).ok
        with pytest.raises(sunroom.UsageError, match=f"over {limits.max_code_bytes:,} bytes"):
            await k.execute("#" + "a" * limits.max_code_bytes)
        with pytest.raises(sunroom.UsageError):  # 2-byte characters: counted in UTF-8 bytes
            await k.execute("#" + "é" * (limits.max_code_bytes // 2))
        r = await k.execute("#" + "a" * (limits.max_code_bytes - 100) + "\nkept")
        assert r.ok and r.value == "1" and not r.state_lost, r


async def test_memory_limit_holds(backend: str) -> None:
    async with AsyncKernel(
        backend=backend, limits=Limits(memory_mb=256, address_space_slack_mb=256)
    ) as k:
        r = await k.execute("x = bytearray(1024 * 1024 * 1024)")
        assert r.status in ("error", "died")
        if r.status == "error":
            assert r.error is not None and r.error.type == "MemoryError"
        assert (await k.execute("1")).ok


async def test_env_is_scrubbed(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUNROOM_CANARY_SECRET", "hunter2-canary")
    async with AsyncKernel(backend=backend) as k:
        r = await k.execute(
            "import os\n"
            "found = [k for k, v in os.environ.items() if 'hunter2' in v or 'CANARY' in k]\n"
            "own = open('/proc/self/environ', 'rb').read()\n"
            "try:\n"
            "    parent = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
            "except PermissionError:\n"
            "    parent = b''\n"
            "(found, b'hunter2' in own, b'hunter2' in parent, sorted(os.environ))"
        )
        assert r.ok, r.error
        assert r.value is not None
        value = " ".join(r.value.split())  # IPython (jupyter) pretty-prints over lines
        assert value.startswith("([], False, False, [")
        for leaked in ("HOME=/root", "VIRTUAL_ENV", "PYENV"):
            assert leaked not in value


async def test_bind_and_variables(kernel: AsyncKernel) -> None:
    await kernel.bind(data={"a": [1, 2]}, blob=b"\x00\x01", text="hi")
    r = await kernel.execute("(data['a'][1], blob, text)")
    assert r.value == "(2, b'\\x00\\x01', 'hi')"
    await kernel.execute("import math\nmine = list(range(100))\n_hidden = 1")
    names = {v.name: v for v in await kernel.variables()}
    assert {"data", "blob", "text", "mine"} <= set(names)
    assert "math" not in names and "_hidden" not in names
    assert names["mine"].type == "list" and len(names["mine"].repr) <= 80
    await kernel.restart()
    assert (await kernel.execute("text")).value == "'hi'"


async def test_closed_kernel_refuses(backend: str) -> None:
    k = AsyncKernel(backend=backend)
    await k.start()
    await k.aclose()
    with pytest.raises(sunroom.ClosedError):
        await k.execute("1")


async def test_close_leaves_zero_processes_after_fork_storm_and_daemon(backend: str) -> None:
    code = (
        "import os, time, subprocess\n"
        "kids = []\n"
        "for _ in range(200):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(1000)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "subprocess.Popen(['/bin/sh', '-c', '(setsid sleep 1000 &) ; exit 0']).wait()\n"
        "len(kids)"
    )
    async with AsyncKernel(backend=backend, limits=Limits(pids=1024)) as k:
        r = await k.execute(code, timeout_s=20)
        assert r.ok and r.value == "200", r
        proc = k.process
        assert proc is not None
        sup = psutil.Process(proc.pid)  # type: ignore[attr-defined]
        tree = [sup, *sup.children(recursive=True)]
        assert len(tree) >= 202
        pids = [p.pid for p in tree]
    await asyncio.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == []
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "1000"]
    ]
    assert leftovers == []


async def test_many_kernels_concurrently(backend: str) -> None:
    async def one(i: int) -> str | None:
        async with AsyncKernel(backend=backend) as k:
            return (await k.execute(f"{i} * 2")).value

    results = await asyncio.gather(*(one(i) for i in range(8)))
    assert results == [str(i * 2) for i in range(8)]


def test_sync_kernel_matches_the_issue_example(backend: str) -> None:
    with sunroom.Kernel(
        backend=backend,
        inputs={"numbers": [1, 2, 3]},
        limits=sunroom.Limits(timeout_s=5, memory_mb=512),
    ) as k:
        r = k.execute("total = sum(numbers)\ntotal")
        assert r.ok and r.value == "6"
    assert os.environ.get("SUNROOM_CANARY_SECRET") is None


async def test_out_of_memory_kill_is_classified(backend: str) -> None:
    """Resident memory past the cgroup limit (address space allowed) is an OOM kill, said so."""
    limits = Limits(memory_mb=128, address_space_slack_mb=4096, timeout_s=20)
    async with AsyncKernel(backend=backend, limits=limits, inputs={"given": 5}) as k:
        if backend == "subprocess" and getattr(k.process, "cgroup", True) is None:
            pytest.skip("subprocess kernels get a memory cgroup only where the tree is writable")
        r = await k.execute("hog = b'x' * (1024 * 1024 * 1024)")
        assert r.status == "died", r
        assert r.state_lost
        assert r.error is not None and "out of memory" in r.error.message
        assert (await k.execute("given")).value == "5"


async def test_a_kernel_dying_before_hello_fails_fast(backend: str) -> None:
    limits = Limits(memory_mb=8, address_space_slack_mb=0, start_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(sunroom.KernelStartError, match="before saying hello|did not start"):
        async with AsyncKernel(backend=backend, limits=limits):
            pass
    assert time.monotonic() - started < 30  # not the 60 s start timeout


async def test_a_kernel_that_dies_during_a_call_raises_kernel_died(backend: str) -> None:
    """A variable whose repr kills the process: variables() raises KernelDiedError, then heals."""
    from sunroom.errors import KernelDiedError

    async with AsyncKernel(backend=backend) as k:
        r = await k.execute(
            "import os\nclass Bomb:\n    def __repr__(self):\n        os._exit(3)\nbomb = Bomb()"
        )
        assert r.ok, r.error
        with pytest.raises(KernelDiedError, match="died during variables") as info:
            await k.variables()
        assert "status 3" in info.value.reason or "exit" in info.value.reason, info.value.reason
        assert (await k.execute("1 + 1")).value == "2"  # a fresh kernel on next use
        assert k.restarts == 1


async def test_every_process_of_the_kernel_is_in_its_cgroup(backend: str) -> None:
    """The launch is moved into the kernel's cgroup before anything of the kernel is forked
    (the supervisor waits at its gate, or a shell gate before bubblewrap): the launched
    process, the runtime and a child of a cell are all inside."""
    async with AsyncKernel(backend=backend) as k:
        cgroup = getattr(k.process, "cgroup", None)
        if cgroup is None:
            pytest.skip("this kernel has no cgroup of its own here (docker: the container's)")
        r = await k.execute("import subprocess; p = subprocess.Popen(['sleep', '30']); 1")
        assert r.ok, r.error
        proc = k.process
        assert proc is not None
        tree = {proc.pid, *proc.descendants()}  # type: ignore[attr-defined]
        assert len(tree) >= 3  # the launch, the runtime, the sleep (and bwrap's own)
        assert proc.host_pid in tree
        assert tree <= cgroup.pids()


async def test_a_kernel_starts_and_runs_a_cell_at_the_fewest_pids_allowed(backend: str) -> None:
    # MIN_PIDS is the schema's floor over HTTP too: every backend must start under it
    async with AsyncKernel(backend=backend, limits=Limits(pids=MIN_PIDS)) as k:
        r = await k.execute("import threading\nthreading.active_count()")
        assert r.ok, r
