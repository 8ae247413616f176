"""The seams: ``mcp=`` and the toolset (what a kernel takes, and needs installed), a backend's
optional members."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

from sunroom.sandbox.backend import KernelProcess, LaunchSpec, features
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.toolset import Toolset, toolset_for

WITHOUT_SDK = "import sys\nsys.modules['mcp'] = None  # as if sunroom[mcp] were not installed\n"


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_SDK + code], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_a_kernel_without_mcp_servers_needs_no_mcp_sdk() -> None:
    code = (
        "import sunroom\n"
        "sunroom.AsyncKernel(backend='subprocess')\n"
        "sunroom.AsyncKernel(backend='subprocess', mcp=[])\n"
        "print('made')"
    )
    assert _run(code) == "made"


def test_mcp_servers_without_the_sdk_say_what_to_install() -> None:
    code = (
        "import sunroom\n"
        "from sunroom.errors import UsageError\n"
        "server = sunroom.mcp.stdio('true', name='tools')\n"
        "try:\n"
        "    sunroom.AsyncKernel(backend='subprocess', mcp=[server])\n"
        "except UsageError as exc:\n"
        "    print(exc)"
    )
    assert "pip install 'sunroom[mcp]'" in _run(code)


def test_the_sandbox_takes_servers_only_through_the_factory_the_mcp_package_installs() -> None:
    code = (
        "import sys\n"
        "from sunroom.errors import UsageError\n"
        "from sunroom.sandbox.kernel import AsyncKernel\n"
        "assert not [m for m in sys.modules if m.startswith('sunroom.mcp')], 'imported'\n"
        "try:\n"
        "    AsyncKernel(backend='subprocess', mcp=['not a server'])\n"
        "except UsageError as exc:\n"
        "    print(exc)"
    )
    assert _run(code) == "mcp= takes servers made by sunroom.mcp.stdio() or sunroom.mcp.http()"


class _Tools:
    """A toolset of no tools, as anything satisfying the protocol may be."""

    def __init__(self) -> None:
        self.held = 1

    @property
    def pending(self) -> bool:
        return False

    async def bind(self, *, lazy: bool = False) -> bool:
        return False

    @property
    def functions(self) -> tuple[HostFunction, ...]:
        return ()

    def module_docs(self) -> dict[str, str]:
        return {}

    def hold(self) -> None:
        self.held += 1

    async def aclose(self) -> None:
        self.held -= 1


def test_a_toolset_is_taken_as_it_is_and_released_at_close() -> None:
    tools = _Tools()
    assert isinstance(tools, Toolset)
    assert toolset_for(tools) is tools
    assert toolset_for(()) is None

    async def main() -> None:
        async with AsyncKernel(backend="subprocess", mcp=tools) as k:
            assert (await k.execute("1 + 1")).value == "2"
        assert tools.held == 0

    asyncio.run(main())


class _Plain:
    """A backend that implements only the protocol's required members."""

    name = "plain"

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        raise NotImplementedError


def test_a_backend_that_does_not_derive_the_base_has_the_defaults() -> None:
    described = features(_Plain())
    assert described.python is True
    assert described.kernel_name == described.inputs_backend == "plain"
    assert described.sandbox is None
