"""Which backend a command line or a request names: a backend name, plus a kernelspec for jupyter.

The CLI (``--backend jupyter --kernel-name bash --sandbox bwrap``) and the service (``{"backend":
"jupyter", "kernel_name": "bash", "sandbox": "bwrap"}``) both turn their three settings into what
:class:`~sunroom.sandbox.kernel.AsyncKernel` takes with :func:`choose_backend`, and report a
kernel's backend with :func:`describe_backend`. A kernel name or a sandbox only means something
for the ``jupyter`` backend; naming one with another backend is a usage error, never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sunroom.errors import UsageError
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.backends import NAMES

__all__ = ["JUPYTER", "OPTION_NAMES", "choose_backend", "describe_backend"]

JUPYTER: Final = "jupyter"
DEFAULT_KERNEL_NAME: Final = "python3"
DEFAULT_SANDBOX: Final = "bwrap"

OPTION_NAMES: Final[Mapping[str, str]] = {
    "backend": "--backend",
    "kernel_name": "--kernel-name",
    "sandbox": "--sandbox",
}
"""How the CLI spells the settings in its errors (the service uses the field names)."""


def choose_backend(
    backend: str,
    *,
    kernel_name: str | None = None,
    sandbox: str | None = None,
    names: Mapping[str, str] | None = None,
) -> str | Backend:
    """What to pass to ``AsyncKernel(backend=...)``: *backend*, or a JupyterBackend for jupyter.

    For ``backend="jupyter"``, *kernel_name* (default ``python3``) picks the installed kernelspec
    and *sandbox* (default ``bwrap``) where it runs. *names* spells the settings in errors
    (default: the field names; the CLI passes :data:`OPTION_NAMES`).

    Raises UsageError: an unknown backend, a kernel name or sandbox with another backend, an
    unknown sandbox, or a kernel name that is not installed (the error lists those that are).
    """
    spell = {k: k for k in ("backend", "kernel_name", "sandbox")} | dict(names or {})
    if backend not in NAMES:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(NAMES)}")
    if backend != JUPYTER:
        given = [spell[k] for k, v in (("kernel_name", kernel_name), ("sandbox", sandbox)) if v]
        if given:
            verb = "are" if len(given) > 1 else "is"
            raise UsageError(
                f"{' and '.join(given)} {verb} only for {spell['backend']} {JUPYTER} "
                f"(the backend is {backend})"
            )
        return backend
    from sunroom.sandbox.backends.jupyter import JupyterBackend

    return JupyterBackend(kernel_name or DEFAULT_KERNEL_NAME, sandbox=sandbox or DEFAULT_SANDBOX)


def describe_backend(backend: str | Backend) -> dict[str, str | None]:
    """A kernel's backend as the service reports it: ``backend``, ``kernel_name``, ``sandbox``.

    ``kernel_name`` and ``sandbox`` are None but for the jupyter backend.
    """
    name = backend if isinstance(backend, str) else backend.name
    if name != JUPYTER or isinstance(backend, str):
        return {"backend": name, "kernel_name": None, "sandbox": None}
    # only a JupyterBackend is named jupyter: it needs sunroom[jupyter], which other kernels don't
    from sunroom.sandbox.backends.jupyter import JupyterBackend

    if isinstance(backend, JupyterBackend):
        return {"backend": JUPYTER, "kernel_name": backend.kernel_name, "sandbox": backend.sandbox}
    return {"backend": name, "kernel_name": None, "sandbox": None}
