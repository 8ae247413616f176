"""Installed Jupyter kernelspecs: list them, and find one by name with a clear error.

A kernelspec is what ``jupyter kernelspec list`` shows: a name, the program (``argv``) that
starts the kernel, its language and its resource directory. sunroom reads them through
jupyter-client's ``KernelSpecManager`` (the standard search path: this interpreter's prefix,
the user's and the system's Jupyter data directories).
"""

from __future__ import annotations

from dataclasses import dataclass

from sunroom.errors import UsageError
from sunroom.extras import require


@dataclass(frozen=True, slots=True)
class KernelSpecInfo:
    """One installed kernelspec."""

    name: str
    display_name: str
    language: str
    argv: tuple[str, ...]
    resource_dir: str

    @property
    def python(self) -> bool:
        """Whether it is an IPython kernel (host functions, inputs and submit work in it)."""
        return self.language.lower() == "python"


def kernelspecs() -> list[KernelSpecInfo]:
    """Every installed kernelspec, sorted by name (UsageError without ``sunroom[jupyter]``)."""
    require("jupyter", "listing Jupyter kernelspecs")
    from jupyter_client.kernelspec import KernelSpecManager

    manager = KernelSpecManager()
    found = []
    for name, entry in sorted(manager.get_all_specs().items()):
        spec = entry["spec"]
        found.append(
            KernelSpecInfo(
                name=name,
                display_name=str(spec.get("display_name", name)),
                language=str(spec.get("language", "")),
                argv=tuple(str(a) for a in spec.get("argv", ())),
                resource_dir=str(entry["resource_dir"]),
            )
        )
    return found


def find_kernelspec(name: str) -> KernelSpecInfo:
    """The kernelspec called *name*; raises UsageError naming the installed ones."""
    specs = kernelspecs()
    for spec in specs:
        if spec.name == name:
            return spec
    installed = ", ".join(s.name for s in specs) or "none"
    raise UsageError(
        f"no Jupyter kernel named {name!r} is installed (installed: {installed}); "
        "see `sunroom kernelspecs` or `jupyter kernelspec list`"
    )
