from __future__ import annotations

import subprocess
import sys

import sunroom


def test_public_names_resolve() -> None:
    for name in sunroom.__all__:
        assert getattr(sunroom, name) is not None
    assert {"AsyncKernel", "Kernel", "Limits", "ExecutionResult", "host_function"} <= set(
        sunroom.__all__
    )


def test_kernel_side_imports_no_host_dependencies() -> None:
    code = (
        "import sys\n"
        "import sunroom.prelude.runtime, sunroom.prelude.supervisor\n"
        "bad = [m for m in ('pydantic', 'psutil', 'typer', 'sunroom.sandbox') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
