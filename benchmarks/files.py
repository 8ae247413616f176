"""I/O benchmarks. Section ``files``: moving files into and out of a kernel's workdir.

``files`` (run with ``--files``, the default when no section is named):

* through the service: ``sunroom serve`` in a subprocess (subprocess backend by default), one
  raw kernel, a file of ``--mb`` MB (default 1000, made on the fly in a temporary directory and
  removed after) uploaded with ``PUT /kernels/{id}/files/{path}`` and downloaded with ``GET``,
  by two clients in turn: httpx in this process (upload streamed from disk, download streamed
  to a file on disk: a realistic Python client, whose own parsing and writing count) and curl
  (upload from the file, download to ``/dev/null``: the least client cost, so the figure is
  the server's). Each of ``--runs`` rounds also times a plain ``cp`` of the same file (the
  reference: the disk's own cost), and ``sync`` runs before every timed step so no step pays
  for the writeback of the one before. Reports the medians of the seconds of each (target: at
  most 3 s each way for 1 GB on loopback), their ratio to ``cp``, the CPU seconds of server
  and kernel, and the growth of the server's resident memory over its resting size, sampled
  every 20 ms (target: at most 64 MB); the load average before and after says how busy the
  machine was;
* the Python API: ``AsyncKernel.files.write`` / ``read_stream`` of the same file in this
  process, with ``Limits(disk_mb=..., file_size_mb=...)`` raised to fit it (bwrap and docker
  keep the workdir in a size-capped tmpfs).

Other sections of this file (other measures) live in their own functions below.

    .venv/bin/python benchmarks/files.py [--files] [--mb 1000] [--backend subprocess] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psutil
from _server import serve

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024

# -- files -----------------------------------------------------------------------------------------


def make_file(path: Path, mb: int) -> None:
    """Write *mb* MB (10**6 bytes each) of incompressible bytes to *path*."""
    block = os.urandom(MIB)
    left = mb * 1_000_000
    with path.open("wb") as out:
        while left:
            n = min(left, len(block))
            out.write(block[:n])
            left -= n


def pieces(path: Path, size: int = MIB) -> Iterator[bytes]:
    """*path* in pieces of *size* bytes."""
    with path.open("rb") as f:
        while piece := f.read(size):
            yield piece


class RssPeak:
    """Samples the RSS of process *pid* every 20 ms in a thread; ``peak`` in bytes."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> int:
        """Stop sampling; the peak RSS seen."""
        self._stop.set()
        self._thread.join()
        return self.peak


def files_service(src: Path, dst: Path, *, backend: str, runs: int) -> dict[str, float]:
    """Upload *src* and download it to *dst* through a ``sunroom serve`` subprocess.

    Each of *runs* rounds times, in this order, a plain ``cp`` of *src* (the reference), an
    upload and a download with httpx, and an upload and a download with curl; every figure is
    the median over the rounds.
    """
    size = src.stat().st_size
    env = {
        "SUNROOM_MAX_FILE_BYTES": str(size + MIB),
        "SUNROOM_READ_TIMEOUT_S": "120",  # the upload must arrive within it
    }
    seen: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        seen.setdefault(key, []).append(value)

    with serve("--backend", backend, env=env, db=src.parent / "s.db") as server:
        url, token, headers = server.url, server.token, server.headers
        with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            kid = http.post("/kernels", json={}).raise_for_status().json()["kernel_id"]
            base = f"/kernels/{kid}/files"
            http.put(f"{base}/warm", content=b"x" * MIB).raise_for_status()
            proc = psutil.Process(server.process.pid)
            kernels = proc.children(recursive=True)
            resting = proc.memory_info().rss
            rss = RssPeak(server.process.pid)
            for _ in range(runs):
                copy = dst.with_suffix(".cp")
                os.sync()  # each timed step starts with no dirty pages of the one before
                t0 = time.perf_counter()
                subprocess.run(["cp", str(src), str(copy)], check=True)
                note("cp_s", time.perf_counter() - t0)
                copy.unlink()
                for client in ("httpx", "curl"):
                    http.delete(f"{base}/big.bin")  # room for the next (bwrap, docker: tmpfs)
                    os.sync()
                    cpu0 = _cpu(proc), _cpu(*kernels)
                    t0 = time.perf_counter()
                    if client == "httpx":
                        length = {"content-length": str(size)}  # a file's size is known
                        r = http.put(f"{base}/big.bin", content=pieces(src), headers=length)
                        r.raise_for_status()
                        assert r.json()["size"] == size, r.text
                    else:
                        said = _curl(["-T", str(src)], url + f"{base}/big.bin", token)
                        assert f'"size":{size}' in said, said
                    note(f"{client}_upload_s", time.perf_counter() - t0)
                    os.sync()
                    cpu1 = _cpu(proc), _cpu(*kernels)
                    t0 = time.perf_counter()
                    if client == "httpx":
                        with http.stream("GET", f"{base}/big.bin") as resp, dst.open("wb") as out:
                            resp.raise_for_status()
                            for chunk in resp.iter_raw(MIB):
                                out.write(chunk)
                    else:
                        said = _curl(["-o", "/dev/null"], url + f"{base}/big.bin", token)
                        got = int(said.split()[-1])
                    note(f"{client}_download_s", time.perf_counter() - t0)
                    cpu2 = _cpu(proc), _cpu(*kernels)
                    if client == "httpx":
                        got = dst.stat().st_size
                        dst.unlink()
                    assert got == size, (client, got, size)
                    note(f"{client}_upload_server_cpu_s", cpu1[0] - cpu0[0])
                    note(f"{client}_upload_kernel_cpu_s", cpu1[1] - cpu0[1])
                    note(f"{client}_download_server_cpu_s", cpu2[0] - cpu1[0])
                    note(f"{client}_download_kernel_cpu_s", cpu2[1] - cpu1[1])
            peak = rss.stop()
    out = {key: statistics.median(values) for key, values in seen.items()}
    for client in ("httpx", "curl"):
        for way in ("upload", "download"):
            out[f"{client}_{way}_x_cp"] = out[f"{client}_{way}_s"] / out["cp_s"]
            out[f"{client}_{way}_MBps"] = size / 1e6 / out[f"{client}_{way}_s"]
    out["server_rss_growth_MB"] = (peak - resting) / 1e6
    return out


def _curl(args: list[str], url: str, token: str) -> str:
    """Run curl on *url* with *args* (the token passed on stdin, not on the command line).

    Returns what it printed: the response body unless ``-o`` sends it elsewhere, then the
    bytes downloaded on a line of their own.
    """
    done = subprocess.run(
        ["curl", "-sS", "--fail", "--max-time", "120", "-H", "@-",
         "-w", "\\n%{size_download}", *args, url],
        input=f"Authorization: Bearer {token}\n", text=True, check=True, capture_output=True,
    )  # fmt: skip
    return done.stdout


def _cpu(*procs: psutil.Process) -> float:
    """User + system CPU seconds of *procs* so far (a process gone meanwhile counts 0)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def files_api(src: Path, size: int, *, backend: str) -> dict[str, float]:
    """Write *src* (*size* bytes) into a kernel and read it back with the Python API, in this process."""
    sys.path.insert(0, str(ROOT))
    from sunroom import AsyncKernel, Limits

    mb = size // MIB + 64
    limits = Limits(disk_mb=mb, file_size_mb=mb, memory_mb=max(2048, mb + 512))

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces(src):
            yield piece

    async with AsyncKernel(backend=backend, limits=limits) as kernel:
        t0 = time.perf_counter()
        assert await kernel.files.write("big.bin", body()) == size
        write = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = 0
        async for chunk in kernel.files.read_stream("big.bin"):
            got += len(chunk)
        read = time.perf_counter() - t0
        assert got == size
    return {
        "write_s": write,
        "read_s": read,
        "write_MBps": size / 1e6 / write,
        "read_MBps": size / 1e6 / read,
    }


def run_files(mb: int, backend: str, runs: int) -> None:
    """The ``files`` section: print its figures (medians of *runs*), one per line."""
    with tempfile.TemporaryDirectory(prefix="sunroom-io-") as tmp:
        src, dst = Path(tmp) / "src.bin", Path(tmp) / "dst.bin"
        make_file(src, mb)
        print(f"files: {mb} MB, backend {backend}, {os.cpu_count()} cores, medians of {runs}")
        print(f"  load average at the start: {os.getloadavg()[0]:.2f}")
        service = files_service(src, dst, backend=backend, runs=runs)
        for key, value in service.items():
            print(f"  service {key}: {value:.2f}")
        apis = [
            asyncio.run(files_api(src, src.stat().st_size, backend=backend)) for _ in range(runs)
        ]
        for key in apis[0]:
            print(f"  api {key}: {statistics.median(a[key] for a in apis):.2f}")
        print(f"  load average at the end: {os.getloadavg()[0]:.2f}")
        budget = 3 * mb / 1000  # 3 s per GB
        for client in ("httpx", "curl"):
            ok = service[f"{client}_upload_s"] <= budget
            ok = ok and service[f"{client}_download_s"] <= budget
            ok = ok and service["server_rss_growth_MB"] <= 64
            print(f"  targets (<= 3 s per GB each way, <= 64 MB RSS growth), {client}: {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", action="store_true", help="run the files section")
    ap.add_argument("--mb", type=int, default=1000, help="size of the file, in MB")
    ap.add_argument("--backend", default="subprocess")
    ap.add_argument("--runs", type=int, default=3, help="rounds; figures are their medians")
    args = ap.parse_args()
    run_files(args.mb, args.backend, args.runs)


if __name__ == "__main__":
    main()
