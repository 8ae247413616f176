"""rlm's environment contract: sunroom's SunroomEnv against rlm's own LocalREPL, in one run.

For each environment, interleaved round by round: building it (with a small context) and
cleaning it up; one ``execute_code("x = 1")``; one cell making an ``llm_query`` through rlm's
LM handler (a model answering at once, so the figure is the environment's own cost); binding a
large string context. Prints the median and p90 of each and the ratio SunroomEnv/LocalREPL.
LocalREPL runs the code in the host process itself (no isolation at all); it is the floor, not
a like-for-like sandbox. DockerREPL is measured with ``--docker`` (it needs the
``python:3.11-slim`` image and pip in the container).

    python benchmarks/integrations_rlm.py [--rounds 20] [--cells 200] [--context-mb 100]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlm.clients.base_lm import BaseLM  # noqa: E402
from rlm.core.lm_handler import LMHandler  # noqa: E402
from rlm.core.types import ModelUsageSummary, UsageSummary  # noqa: E402
from rlm.environments.local_repl import LocalREPL  # noqa: E402

from sunroom.integrations.rlm import SunroomEnv  # noqa: E402


class EchoLM(BaseLM):  # type: ignore[misc]  # rlm ships no type information
    """Answers at once, so a sub-call's time is the environment's path to the handler."""

    def __init__(self) -> None:
        super().__init__(model_name="echo")

    def completion(self, prompt: Any, model: str | None = None) -> str:
        return "ok"

    async def acompletion(self, prompt: Any, model: str | None = None) -> str:
        return "ok"

    def get_usage_summary(self) -> UsageSummary:
        return UsageSummary({"echo": ModelUsageSummary(1, 1, 1)})

    def get_last_usage(self) -> ModelUsageSummary:
        return ModelUsageSummary(1, 1, 1)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="environments built per kind")
    parser.add_argument("--cells", type=int, default=200, help="cells timed per measure")
    parser.add_argument("--context-mb", type=int, default=100)
    parser.add_argument("--docker", action="store_true", help="also rlm's DockerREPL")
    args = parser.parse_args()

    handler = LMHandler(EchoLM())
    handler.start()
    address = handler.address
    kinds: dict[str, Callable[..., Any]] = {
        "SunroomEnv (bwrap)": lambda **kw: SunroomEnv(lm_handler_address=address, **kw),
        "LocalREPL": lambda **kw: LocalREPL(lm_handler_address=address, **kw),
    }
    if args.docker:
        from rlm.environments.docker_repl import DockerREPL

        kinds["DockerREPL"] = lambda **kw: DockerREPL(lm_handler_address=address, **kw)

    times: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}

    def add(kind: str, measure: str, value: float) -> None:
        times[kind].setdefault(measure, []).append(value)

    for _ in range(args.rounds):
        for kind, make in kinds.items():
            start = time.perf_counter()
            env = make(context_payload="small")
            env.execute_code("x = 1")
            env.cleanup()
            add(kind, "build + first cell + cleanup", time.perf_counter() - start)

    envs = {kind: make() for kind, make in kinds.items()}
    try:
        for _ in range(args.cells):
            for kind, env in envs.items():
                add(kind, 'execute_code("x = 1")', _timed(lambda e=env: e.execute_code("x = 1")))
                add(
                    kind,
                    "cell with one llm_query",
                    _timed(lambda e=env: e.execute_code("r = llm_query('hi')")),
                )
        big = "x" * (args.context_mb * 1_000_000)
        for _ in range(max(3, args.rounds // 4)):
            for kind, env in envs.items():
                add(
                    kind,
                    f"add_context of {args.context_mb} MB",
                    _timed(lambda e=env: e.add_context(big)),
                )
    finally:
        for env in envs.values():
            env.cleanup()
        handler.stop()

    print(
        f"rlm environments: {platform.machine()}, {os.cpu_count()} cpus, python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    base = "LocalREPL"
    for measure in times[base]:
        print(f"\n{measure}")
        for kind in kinds:
            values = times[kind][measure]
            med = statistics.median(values)
            ratio = med / statistics.median(times[base][measure])
            print(
                f"  {kind:20s} median {med * 1e3:9.3f} ms  p90 {_p90(values) * 1e3:9.3f} ms"
                f"  ({ratio:.2f}x LocalREPL, n={len(values)})"
            )


if __name__ == "__main__":
    main()
