"""Adapter overhead vs the raw SDK call, against the same local replay server.

For each adapter: the median wall time of one whole-reply request, and of one streamed event
(a recorded stream with its delta event repeated to STREAM_DELTAS events), through the raw
official SDK and through the sunroom adapter, interleaved call by call. Prints the medians
and the ratio adapter/raw (target: <= 1.2x).

    python benchmarks/providers.py [--requests 300] [--streams 30]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sunroom.providers import Request, RetryPolicy, UserMessage  # noqa: E402
from sunroom.providers import model as resolve  # noqa: E402

_spec = importlib.util.spec_from_file_location("replay", ROOT / "tests/providers/replay.py")
assert _spec is not None and _spec.loader is not None
replay = importlib.util.module_from_spec(_spec)
sys.modules["replay"] = replay
_spec.loader.exec_module(replay)

STREAM_DELTAS = 400
KEY = "bench-key"


def long_stream(name: str, marker: str, *, sep: str = "\n\n") -> Any:
    """A recorded stream whose first block containing ``marker`` is repeated."""
    reply = replay.reply_from(name)
    blocks = reply.body.split(sep)
    i = next(n for n, b in enumerate(blocks) if marker in b)
    reply.body = sep.join(blocks[:i] + [blocks[i]] * STREAM_DELTAS + blocks[i + 1 :])
    if not reply.body.endswith(sep):
        reply.body += sep
    return reply


def gemini_stream() -> Any:
    reply = replay.reply_from("google/stream_generate_content_text")
    blocks = [b for b in reply.body.split("\r\n\r\n") if b]
    reply.body = "\r\n\r\n".join([blocks[0]] * STREAM_DELTAS + [blocks[-1]]) + "\r\n\r\n"
    return reply


async def drain(stream: Any) -> int:
    n = 0
    async for _ in stream:
        n += 1
    return n


async def sdk_stream(stream: Any) -> int:
    try:
        return await drain(stream)
    finally:
        close = getattr(stream, "close", None) or stream.aclose
        await close()


class Case:
    def __init__(
        self,
        name: str,
        raw: Callable[[], Awaitable[Any]],
        adapter: Callable[[], Awaitable[Any]],
    ) -> None:
        self.name, self.raw, self.adapter = name, raw, adapter


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def measure(case: Case, rounds: int) -> tuple[float, float]:
    for _ in range(5):  # warm up pools and caches
        await case.raw()
        await case.adapter()
    raw, ours = [], []
    for _ in range(rounds):
        raw.append(await timed(case.raw))
        ours.append(await timed(case.adapter))
    return statistics.median(raw), statistics.median(ours)


async def main(requests: int, streams: int) -> None:
    import anthropic
    import openai
    from google import genai
    from google.genai import types

    with replay.ReplayServer() as server:
        url = server.url
        add = server.add
        add("/v1/messages", replay.reply_from("anthropic/messages_text"), times=None)
        add("/v1/responses", replay.reply_from("openai/responses_text"), times=None)
        add("/v1/chat/completions", replay.reply_from("openai/chat_text"), times=None)
        gpath = "/v1beta/models/gemini-2.5-flash:"
        add(
            gpath + "generateContent", replay.reply_from("google/generate_content_text"), times=None
        )

        a_raw = anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0)
        o_raw = openai.AsyncOpenAI(api_key=KEY, base_url=url + "/v1", max_retries=0)
        g_raw = genai.Client(
            api_key=KEY,
            http_options=types.HttpOptions(
                base_url=url, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)
            ),
        )
        opts: dict[str, Any] = {"api_key": KEY, "retry": RetryPolicy(max_attempts=1)}
        a = resolve("anthropic:claude-haiku-4-5", base_url=url, **opts)
        o = resolve("openai:gpt-4o", base_url=url + "/v1", **opts)
        c = resolve("openai-compatible:gpt-4o", base_url=url + "/v1", **opts)
        g = resolve("gemini:gemini-2.5-flash", base_url=url, **opts)
        req = Request([UserMessage("hello")])
        msgs: Any = [{"role": "user", "content": "hello"}]

        request_cases = [
            Case(
                "anthropic messages",
                lambda: a_raw.messages.create(
                    model="claude-haiku-4-5", max_tokens=8192, messages=msgs
                ),
                lambda: a.complete(req),
            ),
            Case(
                "openai responses",
                lambda: o_raw.responses.create(model="gpt-4o", input=msgs),
                lambda: o.complete(req),
            ),
            Case(
                "openai-compatible chat",
                lambda: o_raw.chat.completions.create(model="gpt-4o", messages=msgs),
                lambda: c.complete(req),
            ),
            Case(
                "gemini generateContent",
                lambda: g_raw.aio.models.generate_content(
                    model="gemini-2.5-flash", contents="hello"
                ),
                lambda: g.complete(req),
            ),
        ]

        def restream() -> None:
            server_streams = {
                "/v1/messages": long_stream("anthropic/messages_text_stream", "text_delta"),
                "/v1/responses": long_stream(
                    "openai/responses_text_stream", "response.output_text.delta"
                ),
                "/v1/chat/completions": long_stream("openai/chat_text_stream", '"content":"'),
                gpath + "streamGenerateContent": gemini_stream(),
            }
            for path, reply in server_streams.items():
                server.replace(path, reply)

        async def a_stream_raw() -> int:
            s = await a_raw.messages.create(
                model="claude-haiku-4-5", max_tokens=8192, messages=msgs, stream=True
            )
            return await sdk_stream(s)

        async def o_stream_raw() -> int:
            return await sdk_stream(
                await o_raw.responses.create(model="gpt-4o", input=msgs, stream=True)
            )

        async def c_stream_raw() -> int:
            s = await o_raw.chat.completions.create(
                model="gpt-4o",
                messages=msgs,
                stream=True,
                stream_options={"include_usage": True},
            )
            return await sdk_stream(s)

        async def g_stream_raw() -> int:
            s = await g_raw.aio.models.generate_content_stream(
                model="gemini-2.5-flash", contents="hello"
            )
            return await sdk_stream(s)

        stream_cases = [
            Case("anthropic stream", a_stream_raw, lambda: drain(a.stream(req))),
            Case("openai responses stream", o_stream_raw, lambda: drain(o.stream(req))),
            Case("openai-compatible stream", c_stream_raw, lambda: drain(c.stream(req))),
            Case("gemini stream", g_stream_raw, lambda: drain(g.stream(req))),
        ]

        print(f"whole-reply request, median of {requests} (interleaved raw/adapter)")
        print(f"{'case':28} {'raw SDK':>10} {'sunroom':>10} {'ratio':>7}")
        for case in request_cases:
            raw, ours = await measure(case, requests)
            print(f"{case.name:28} {raw * 1e3:8.3f}ms {ours * 1e3:8.3f}ms {ours / raw:6.2f}x")

        restream()
        print(f"\nstreamed event ({STREAM_DELTAS} deltas per stream), median of {streams}")
        print(f"{'case':28} {'raw SDK':>10} {'sunroom':>10} {'ratio':>7}")
        for case in stream_cases:
            events = await case.raw()
            raw, ours = await measure(case, streams)
            per_raw, per_ours = raw / events * 1e6, ours / events * 1e6
            print(f"{case.name:28} {per_raw:8.1f}us {per_ours:8.1f}us {ours / raw:6.2f}x")

        for m in (a, o, c, g):
            await m.aclose()
        await a_raw.close()
        await o_raw.close()
        await g_raw.aio.aclose()
        g_raw.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.streams))
