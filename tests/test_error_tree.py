"""One error tree: every class in sunroom.errors is raised somewhere in the package."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import sunroom
import sunroom.errors as errors

PACKAGE = Path(sunroom.__file__).parent


def _name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _raised_names() -> set[str]:
    """Error classes the package raises or builds to raise.

    Counted: ``raise X`` / ``raise X(...)``; ``X(...)`` (an error built by a factory that a
    caller raises, e.g. ``raise from_status(...)``); ``cls = X`` and ``return X`` (a class
    chosen to build); a class as a value in a table (e.g. vendor error code -> class).
    Not counted: imports, ``except X``, ``isinstance(e, X)``, annotations, docstrings.
    """
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                found.add(_name(target) or "")
            elif isinstance(node, ast.Call) and _name(node.func) != "isinstance":
                found.add(_name(node.func) or "")
            elif isinstance(node, ast.Assign | ast.Return):
                found.add(_name(node.value) or "")
            elif isinstance(node, ast.Dict):
                found.update(n for n in map(_name, node.values) if n)
    return found


def test_every_error_class_is_raised_somewhere() -> None:
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.SunroomError)
    }
    assert set(errors.__all__) == set(classes)
    raised = _raised_names()
    never = sorted(
        name
        for name, cls in classes.items()
        # a category (a class with subclasses) is raised when any class under it is
        if name not in raised
        and not any(
            issubclass(c, cls) and c is not cls and c.__name__ in raised for c in classes.values()
        )  # fmt: skip
    )
    assert never == [], f"defined in sunroom.errors but never raised: {never}"


def test_cell_errors_are_data_not_exceptions() -> None:
    from sunroom import CellError

    assert not issubclass(CellError, BaseException)
    assert "Error" not in [c.__name__ for c in CellError.__mro__[1:]]
