"""Embeddings as host functions: what calling ``embed`` from a kernel costs, load time, memory.

Three figures, one run, one embedder (the test model, all-MiniLM-L6-v2 as
``sunroom embed --fetch`` builds it, from ``tests/embeddings/testmodel.py``; or ``--model``):

* **throughput**: ``--n`` (10,000) short generated sentences embedded in batches of
  ``--batch`` (2,000) texts, (a) by the embedder called directly on the host, in this process,
  and (b) by code in a kernel calling the host function ``embed`` (subprocess and bwrap), the
  rows landing in the kernel as lists of floats. Each method runs ``--rounds`` times,
  interleaved; the best round of each counts. The ratio kernel / host is the cost of the
  channel (packing, one frame per batch, rebuilding the rows). Target: at most 1.15x.
* **channel**: the same kernel loop over a stub embedder that returns stored vectors (no
  inference): what moving ``--n`` vectors of the model's size through the channel costs alone
  (best of 5). Added to the host's time it estimates the kernel's, without the noise of
  inference on a shared machine.
* **load**: ``OnnxEmbedder(model)`` wall time (median of 3). Target: at most 1 s.
* **memory**: this process's RSS with the embedder loaded, then with 1 and with ``--sessions``
  (20) agent sessions open at once, each bound to the same embedder and having called
  ``embed``; the growth per extra session shows the model is not copied (one copy is the
  size of model.onnx).

    python benchmarks/embeddings.py                       # the test model (built on first use)
    python benchmarks/embeddings.py --model DIR --n 2000 --rounds 1 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sunroom import AsyncKernel, AsyncSession, Limits  # noqa: E402
from sunroom.embeddings import OnnxEmbedder  # noqa: E402
from sunroom.embeddings.functions import embedding_functions  # noqa: E402
from sunroom.providers import AssistantMessage, ScriptedModel, ToolCall  # noqa: E402

_WORDS = (
    "river", "garden", "quietly", "engineer", "market", "stone", "letter", "winter", "bright",
    "carried", "old", "harbour", "painted", "teacher", "slowly", "window", "bridge", "found",
    "music", "lantern", "travelled", "small", "city", "morning", "forgot", "green", "station",
)  # fmt: skip


def sentences(n: int, seed: int = 0) -> list[str]:
    """*n* distinct short sentences (5 to 12 words), seeded."""
    rng = random.Random(seed)
    return [
        f"{i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 12))) + "."
        for i in range(n)
    ]


def host_run(emb: OnnxEmbedder, texts: list[str], batch: int) -> float:
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        emb.embed(texts[i : i + batch])
    return time.perf_counter() - started


KERNEL_CODE = """\
import time
_t = time.perf_counter()
vectors = []
for _i in range(0, len(texts), {batch}):
    vectors.extend(embed(texts[_i:_i + {batch}]))
_took = time.perf_counter() - _t
assert len(vectors) == len(texts) and type(vectors[0][0]) is float
_took
"""


async def kernel_run(kernel: AsyncKernel, batch: int) -> float:
    """Seconds the kernel's loop took (timed inside the kernel, the cell's own overhead out)."""
    result = await kernel.execute(KERNEL_CODE.format(batch=batch))
    if not result.ok or result.value is None:
        raise RuntimeError(f"the kernel's embed loop failed: {result.error}")
    await kernel.execute("del vectors")
    return float(result.value)


async def throughput(
    emb: OnnxEmbedder, texts: list[str], *, batch: int, rounds: int, backends: Sequence[str]
) -> dict[str, Any]:
    times: dict[str, list[float]] = {"host": [], **{b: [] for b in backends}}
    async with contextlib.AsyncExitStack() as stack:
        kernels = {}
        for b in backends:
            kernels[b] = await stack.enter_async_context(
                AsyncKernel(
                    backend=b,
                    functions=embedding_functions(emb),
                    inputs={"texts": texts},
                    limits=Limits(timeout_s=900),
                )
            )
        emb.embed(texts[:batch])  # warm: ONNX Runtime's first run allocates
        for _ in range(rounds):
            times["host"].append(await asyncio.to_thread(host_run, emb, texts, batch))
            print(f"  host {times['host'][-1]:.2f} s", file=sys.stderr, flush=True)
            for b, k in kernels.items():
                times[b].append(await kernel_run(k, batch))
                print(f"  {b} {times[b][-1]:.2f} s", file=sys.stderr, flush=True)
    best = {m: min(ts) for m, ts in times.items()}
    return {
        "n": len(texts),
        "batch": batch,
        "rounds": rounds,
        "seconds": times,
        "best_s": best,
        "texts_per_s": {m: len(texts) / s for m, s in best.items()},
        "ratio": {b: best[b] / best["host"] for b in backends},
    }


class _Stored:
    """An embedder that returns stored vectors: the channel's cost without inference."""

    def __init__(self, dim: int, n: int) -> None:
        self.name = "stored"
        self.dim = dim
        self._rows = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)

    async def aembed(
        self, texts: Sequence[str], *, kind: str = "document", prefix: Any = None
    ) -> Any:
        return _Result(self._rows[: len(texts)])


@dataclasses.dataclass(frozen=True)
class _Result:
    vectors: Any


async def channel(
    dim: int, texts: list[str], *, batch: int, backends: Sequence[str]
) -> dict[str, Any]:
    stub = _Stored(dim, batch)
    out: dict[str, Any] = {}
    for b in backends:
        async with AsyncKernel(
            backend=b,
            functions=embedding_functions(stub),
            inputs={"texts": texts},
            limits=Limits(timeout_s=900),
        ) as k:
            out[b] = min([await kernel_run(k, batch) for _ in range(5)])
    return out


def load_times(model: str, runs: int = 3) -> dict[str, Any]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        emb = OnnxEmbedder(model)
        took.append(time.perf_counter() - started)
        emb.close()
    return {"runs_s": took, "median_s": statistics.median(took)}


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


async def memory(emb: OnnxEmbedder, sessions: int, backend: str) -> dict[str, Any]:
    def model() -> ScriptedModel:
        call = ToolCall("c1", "execute_code", {"code": "submit(len(embed(['hello', 'world'])))"})
        return ScriptedModel([AssistantMessage([call])])

    emb.embed(["warm"])
    base = _rss()
    async with contextlib.AsyncExitStack() as stack:
        opened = []
        rss_by_count = {}
        for i in range(sessions):
            s = await stack.enter_async_context(
                AsyncSession(model=model(), preset="rlm", backend=backend, embeddings=emb)
            )
            result = await s.run("embed two words")
            if result.output != 2:
                raise RuntimeError(f"session {i} failed: {result.status} {result.error}")
            opened.append(s)
            if i + 1 in (1, sessions):
                rss_by_count[i + 1] = _rss()
    one, many = rss_by_count[1], rss_by_count[sessions]
    model_bytes = (emb.directory / "model.onnx").stat().st_size
    return {
        "sessions": sessions,
        "backend": backend,
        "rss_embedder_loaded_mb": base / 2**20,
        "rss_one_session_mb": one / 2**20,
        "rss_all_sessions_mb": many / 2**20,
        "per_extra_session_mb": (many - one) / max(sessions - 1, 1) / 2**20,
        "model_onnx_mb": model_bytes / 2**20,
    }


def _default_model() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.embeddings import testmodel

    return str(testmodel.model_dir())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory or repo id (default: the test model)")
    p.add_argument("--n", type=int, default=10_000, help="sentences to embed")
    p.add_argument("--batch", type=int, default=2_000, help="texts per embed call")
    p.add_argument("--rounds", type=int, default=3, help="rounds per method (best counts)")
    p.add_argument("--backends", default="subprocess,bwrap", help="kernel backends, comma list")
    p.add_argument("--sessions", type=int, default=20, help="sessions sharing the embedder")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    model = args.model or _default_model()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    load = load_times(model)
    emb = OnnxEmbedder(model)
    texts = sentences(args.n)
    tp = asyncio.run(
        throughput(emb, texts, batch=args.batch, rounds=args.rounds, backends=backends)
    )
    chan = asyncio.run(channel(emb.dim, texts, batch=args.batch, backends=backends))
    mem = asyncio.run(memory(emb, args.sessions, backends[0]))
    emb.close()
    load_avg = os.getloadavg()
    print(f"embeddings benchmark  model: {model}  dim: {emb.dim}  cpus: {os.cpu_count()}  "
          f"load average: {load_avg[0]:.2f}")  # fmt: skip
    print(f"load: median {load['median_s']:.3f} s of {len(load['runs_s'])} (target <= 1 s)")
    print(f"throughput: {tp['n']:,} sentences, batches of {tp['batch']:,}, best of {tp['rounds']}")
    for method, rate in tp["texts_per_s"].items():
        ratio = "" if method == "host" else f"  ratio {tp['ratio'][method]:.3f}x (target <= 1.15x)"
        print(f"  {method:<10} {tp['best_s'][method]:7.2f} s  {rate:8.0f} texts/s{ratio}")
    for b, took in chan.items():
        est = (tp["best_s"]["host"] + took) / tp["best_s"]["host"]
        print(f"channel alone ({b}): {took:.2f} s for {tp['n']:,} vectors of {emb.dim}; "
              f"host + channel = {est:.3f}x the host's time")  # fmt: skip
    print(
        f"memory ({mem['backend']}): RSS {mem['rss_embedder_loaded_mb']:.0f} MB with the "
        f"embedder, {mem['rss_one_session_mb']:.0f} MB with 1 session, "
        f"{mem['rss_all_sessions_mb']:.0f} MB with {mem['sessions']}: "
        f"{mem['per_extra_session_mb']:.1f} MB per extra session "
        f"(model.onnx is {mem['model_onnx_mb']:.0f} MB)"
    )
    if args.json is not None:
        out = {
            "model": model,
            "load": load,
            "throughput": tp,
            "channel_s": chan,
            "memory": mem,
            "load_avg": load_avg,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
