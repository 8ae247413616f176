"""The package map holds: imports run down the layers, and no module imports itself back.

docs/design.md draws the map. Read from the code's own imports (``ast``; every import counts,
inside functions and under ``if TYPE_CHECKING:`` too), so a new arrow against the layering or a
new circle fails here with the modules that make it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "sunroom"

LAYER = {
    "errors": 0,
    "extras": 0,
    "tracing": 0,
    "rpc": 1,
    "providers": 1,
    "store": 1,
    "network": 1,
    "prelude": 2,
    "sandbox": 3,
    "mcp": 4,
    "embeddings": 4,
    "agent": 5,
    "service": 6,
    "integrations": 7,  # adapters for other frameworks: they may use anything below
    "client": 7,  # the HTTP client of the service: its request/response models, no web app
    "eval": 8,  # evaluation: runs sessions, and DSPy's RLM through the DSPy integration
    "cli": 9,
    "": 10,  # the package root: the lazy re-exports of the public API
}
"""Each top-level package's floor: a module may import only from floors below its own."""

ALLOWED_UP = {
    # the root defines __version__ as well as re-exporting; importing it runs nothing else
    ("sunroom.service.mcp.server", "sunroom"),
    ("sunroom.service.app", "sunroom"),  # the version in /openapi.json
}
"""Arrows against the layering kept on purpose (docs/design.md gives the reason)."""


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_of(p): p for p in ROOT.rglob("*.py")}


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every sunroom module *module* imports (``from pkg import submodule`` names the submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("sunroom"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("sunroom"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            yield from subs
            if len(subs) < len(node.names):
                yield target


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        graph[module] = {t for t in _imports(module, path) if t in MODULES and t != module}
    return graph


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return LAYER[top]


def test_every_top_level_package_has_a_floor() -> None:
    tops = {m.split(".")[1] if "." in m else "" for m in MODULES}
    assert tops <= set(LAYER), sorted(tops - set(LAYER))


def test_no_import_runs_up_the_layers() -> None:
    up = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if _layer(b) > _layer(a) and (a, b) not in ALLOWED_UP
    )
    assert up == []


def test_no_two_packages_on_one_floor_import_each_other() -> None:
    across = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if _layer(a) == _layer(b) and a.split(".")[:2] != b.split(".")[:2] and _layer(a) > 0
    )
    assert across == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its modules is not a circle the reader walks: drop
    # the arrows from a package to its own submodules before looking for circles
    flat = {a: {b for b in targets if not b.startswith(a + ".")} for a, targets in graph.items()}
    assert _cycles(flat) == []


def test_the_package_root_holds_at_most_four_modules() -> None:
    root = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root) <= 4, root
