"""Patches run on a module right after it is imported, without importing it first.

``after_import("PIL.Image", patch)`` runs ``patch(module)`` at once when ``PIL.Image`` is
already loaded, and otherwise when it loads: a finder at the front of ``sys.meta_path``
finds the module's spec through the other finders and wraps its loader, whose
``exec_module`` runs the module's code and then each patch. A module imported again (taken out
of ``sys.modules`` and imported anew, or reloaded) is a new module object and is patched again,
so a patch must be idempotent: it marks what it changed and changes nothing marked.

A patch that raises does not fail the import: the error goes to ``sys.stderr`` (the cell's
stderr) and the module is used unpatched. :func:`remove` takes a patch away; the finder
leaves ``sys.meta_path`` with the last one. Standard library only.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec

    Patch = Callable[[types.ModuleType], None]

_PATCHES: dict[str, list[Patch]] = {}
"""The patches to run, by the full name of the module they patch."""


def after_import(name: str, patch: Patch) -> None:
    """Run *patch* on module *name* now if it is loaded, and each time it is loaded from now on.

    Adding the same patch for the same module again changes nothing.
    """
    patches = _PATCHES.setdefault(name, [])
    if patch in patches:
        return
    patches.append(patch)
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)
    module = sys.modules.get(name)
    if module is not None:
        _run(name, module, [patch])


def remove(name: str, patch: Patch) -> None:
    """Stop running *patch* on module *name* (what it already changed stays changed)."""
    patches = _PATCHES.get(name, [])
    if patch in patches:
        patches.remove(patch)
    if not patches:
        _PATCHES.pop(name, None)
    if not _PATCHES and FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)


class Finder:
    """The meta path finder that wraps the loader of a module some patch waits for."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> ModuleSpec | None:
        """The spec the other finders give for *fullname*, with a patching loader; else None."""
        if fullname not in _PATCHES:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if loader is not None and hasattr(loader, "exec_module"):
                spec.loader = PatchingLoader(loader)  # type: ignore[assignment]
            return spec
        return None


class PatchingLoader:
    """A module's own loader, and the patches waiting for the module after its code runs."""

    def __init__(self, loader: object) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        """The module object the loader makes (None: Python's default)."""
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        """Run the module's code, then the patches that wait for it."""
        self.loader.exec_module(module)  # type: ignore[attr-defined]
        _run(module.__name__, module, list(_PATCHES.get(module.__name__, ())))

    def __getattr__(self, name: str) -> object:  # get_source, get_resource_reader, ...
        if name == "loader":  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def _run(name: str, module: types.ModuleType, patches: list[Patch]) -> None:
    for patch in patches:
        try:
            patch(module)
        except Exception as exc:  # noqa: BLE001 - said on the cell's stderr, the import goes on
            sys.stderr.write(
                f"sunroom could not patch {name} after its import "
                f"({type(exc).__name__}: {exc}); it works unpatched\n"
            )


FINDER = Finder()
