"""A crashed host leaves no kernel processes behind; a 1 GB flood keeps the host bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from sunroom import AsyncKernel, Limits
from tests.conftest import _live

HOST_SCRIPT = """
import json, sys, time, psutil, sunroom
k = sunroom.Kernel(backend=sys.argv[1])
k.start()
r = k.execute(
    "import os, subprocess, time\\n"
    "for _ in range(20):\\n"
    "    if os.fork() == 0:\\n"
    "        time.sleep(1003)\\n"
    "        os._exit(0)\\n"
    "subprocess.Popen(['/bin/sh', '-c', '(setsid sleep 1003 &) ; exit 0']).wait()\\n"
    "time.sleep(0.2)"
)
assert r.ok, r
sup = psutil.Process(k.core.process.pid)
pids = [sup.pid] + [p.pid for p in sup.children(recursive=True)]
print(json.dumps(pids), flush=True)
print(str(getattr(k.core.process, "rundir", "")), flush=True)
time.sleep(600)
"""


NEXT_HOST = "import sys, sunroom; k = sunroom.Kernel(backend=sys.argv[1]); k.start(); k.close()"


def _strays() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and "1003" in p.info["cmdline"] and "sleep" in p.info["cmdline"][0]
    ]


def test_kill_9_of_the_host_leaves_no_kernel_processes(backend: str) -> None:
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, backend], stdout=subprocess.PIPE, text=True
    )
    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        pids = json.loads(line)
        rundir = host.stdout.readline().strip()
        assert len(pids) >= 22
        assert _live(set(pids))
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
        deadline = time.monotonic() + 10
        while (_live(set(pids)) or _strays()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _live(set(pids)) == set()
        assert _strays() == []
        if rundir:  # local backends: the dead host could not remove its run directory...
            assert os.path.isdir(rundir)
            # ...and the next host process sweeps it at its first launch
            subprocess.run([sys.executable, "-c", NEXT_HOST, backend], check=True, timeout=60)
            assert not os.path.exists(rundir)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if host.stdout is not None:
            host.stdout.close()


async def test_one_gigabyte_of_output_keeps_host_memory_bounded(backend: str) -> None:
    me = psutil.Process()
    streamed = 0

    def count(name: str, text: str) -> None:
        nonlocal streamed
        streamed += len(text)

    async with AsyncKernel(backend=backend, on_output=count, limits=Limits(timeout_s=120)) as k:
        await k.execute("x = 1")
        before = me.memory_info().rss
        r = await k.execute(
            "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    os.write(1, chunk)\n"
            "print('py', flush=True)\n"
            "for _ in range(64):\n    print('y' * (1 << 20))\n'end'"
        )
        grown = me.memory_info().rss - before
    assert r.ok and r.value == "'end'"
    assert r.truncated_bytes >= (1024 + 64) * (1 << 20) - 2 * Limits().max_output_bytes
    assert len(r.stdout) < 2 * Limits().max_output_bytes
    assert streamed <= Limits().max_output_bytes
    assert grown < 64 * 1024 * 1024, f"host RSS grew by {grown / 1e6:.1f} MB"
