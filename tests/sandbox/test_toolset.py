"""``mcp=`` and the toolset seam: what a kernel takes, and what it needs installed for it."""

from __future__ import annotations

import subprocess
import sys

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
