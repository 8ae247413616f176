from __future__ import annotations

import subprocess
import sys

import sunroom


def test_public_names_resolve() -> None:
    for name in sunroom.__all__:
        assert getattr(sunroom, name) is not None
    assert {
        "AsyncKernel",
        "Kernel",
        "Limits",
        "ExecutionResult",
        "host_function",
        "File",
        "Directory",
        "DisplayItem",
    } <= set(sunroom.__all__)


def test_kernel_side_imports_no_host_dependencies() -> None:
    code = (
        "import sys\n"
        "import sunroom.prelude.runtime, sunroom.prelude.supervisor\n"
        "bad = [m for m in ('pydantic', 'psutil', 'typer', 'sunroom.sandbox') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_matches_the_lazy_exports_and_the_typing_imports() -> None:
    import ast
    from pathlib import Path

    exports = sunroom._EXPORTS
    subpackages = {"mcp"}  # sunroom.mcp: reachable after a bare `import sunroom`
    assert set(sunroom.__all__) == set(exports) | subpackages
    assert sunroom.mcp.stdio is not None
    assert len(sunroom.__all__) == len(set(sunroom.__all__))
    # the names imported for type checkers are exactly the exported ones
    tree = ast.parse(Path(sunroom.__file__).read_text())
    typed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module != "typing":
                    typed.update(a.asname or a.name for a in stmt.names)
    assert typed == set(exports) | subpackages


def test_kernel_side_imports_only_the_stdlib_and_msgpack() -> None:
    """Every kernel-side module (sunroom.prelude and the rpc parts it uses) is allow-listed."""
    import json

    from sunroom.sandbox.backends.subprocess import kernel_sys_path

    code = (
        "import json, pkgutil, sys, importlib\n"
        "sys.path[0:0] = json.loads(sys.argv[1])\n"
        "import sunroom.prelude\n"
        "for info in pkgutil.iter_modules(sunroom.prelude.__path__, 'sunroom.prelude.'):\n"
        "    importlib.import_module(info.name)\n"
        "allowed = set(sys.stdlib_module_names) | {'msgpack', 'sunroom', '__main__'}\n"
        "allowed |= {'cython_runtime'} | {n for n in sys.modules if n.startswith('_cython_')}\n"
        "tops = {name.split('.')[0] for name in sys.modules}\n"
        "print(sorted(tops - allowed))\n"
        "print(sorted(n for n in sys.modules if n.startswith('sunroom.')\n"
        "      and not n.startswith(('sunroom.prelude', 'sunroom.rpc'))))"
    )
    # started the way a kernel is: isolated, no site, sys.path from kernel_sys_path()
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, json.dumps(kernel_sys_path())],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout
