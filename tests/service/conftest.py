"""A real uvicorn server on loopback, in a thread, with injected models and host functions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import uvloop

from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Model,
    Price,
    Request,
    ToolCall,
    UserMessage,
)
from sunroom.service import ServiceConfig, bind, serve

TOKEN = "test-token-0123456789abcdef"


def code(text: str, i: int = 0) -> AssistantMessage:
    return AssistantMessage([ToolCall(f"call_{i}", "execute_code", {"code": text})])


def sub_input(request: Request) -> str:
    """The input a ``predict`` sub-call was given (its last message's text)."""
    message = request.messages[-1]
    assert isinstance(message, UserMessage)
    return message.text


def agent_model(cells: list[str], price: Price | None = None) -> FunctionModel:
    """One model for a root and its sub-calls: the root runs *cells*, one per turn, then
    answers "done"; a sub-call (a request offering no tools) answers ``leaf:<input>``."""

    def reply(request: Request) -> str | AssistantMessage:
        if not request.tools:
            return "leaf:" + sub_input(request)
        turns = sum(isinstance(m, AssistantMessage) for m in request.messages)
        return code(cells[turns]) if turns < len(cells) else "done"

    return FunctionModel(reply, name="agent", price=price)


class Server:
    def __init__(
        self,
        config: ServiceConfig,
        resolve: Callable[[str, str | None], Model],
        functions: list[Any],
        event_loop: str = "asyncio",
    ) -> None:
        self.config = config
        self.sock = bind(config)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._started = threading.Event()
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None

        def run() -> None:
            async def main() -> None:
                self._loop = asyncio.get_running_loop()
                await serve(
                    config,
                    sock=self.sock,
                    resolve=resolve,
                    functions=functions,
                    started=self._on_started,
                )

            try:
                if event_loop == "uvloop":
                    uvloop.run(main())
                else:
                    asyncio.run(main())
            except BaseException as exc:  # surfaced by start()
                self._error = exc
                self._started.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the server did not start")
        if self._error is not None:
            raise self._error
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        self.anon = httpx.Client(base_url=self.url, timeout=30)

    def _on_started(self, server: uvicorn.Server) -> None:
        self._server = server
        self._started.set()

    def stop(self) -> None:
        self.client.close()
        self.anon.close()
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the server did not stop"


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(
        model: Model | Callable[[], Model] | None = None,
        *,
        functions: list[Any] | None = None,
        resolve: Callable[[str, str | None], Model] | None = None,
        default_model: str = "fake:test",
        event_loop: str = "asyncio",
        **overrides: Any,
    ) -> Server:
        options: dict[str, Any] = {
            "port": 0,
            "token": TOKEN,
            "db_path": tmp_path / "sunroom.db",
            "backend": "subprocess",
            "model": default_model,
            "lease_s": 2.0,
        }
        options.update(overrides)
        config = ServiceConfig(**options)

        def injected(spec: str, base_url: str | None) -> Model:
            assert model is not None, "this server has no model"
            return model() if callable(model) and not isinstance(model, Model) else model

        server = Server(config, resolve or injected, functions or [], event_loop)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()
