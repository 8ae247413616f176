"""Kernel backends and the name → backend lookup.

``subprocess`` is a plain process (not a security boundary; ask for it by name). ``bwrap`` is the
default for untrusted code on Linux; ``docker`` runs one container per kernel.
``jupyter`` runs an installed Jupyter kernel (``python3``, in bwrap) through jupyter-client;
:class:`~sunroom.JupyterBackend` picks another kernel or sandbox.
"""

from __future__ import annotations

from sunroom.errors import SandboxUnavailableError, UsageError
from sunroom.extras import require
from sunroom.sandbox.backend import Backend

DEFAULT_BACKEND = "bwrap"
NAMES = ("subprocess", "bwrap", "docker", "jupyter")


def resolve(backend: str | Backend) -> Backend:
    """Return the backend named *backend* (or *backend* itself if it is one).

    Raises UsageError for an unknown name and SandboxUnavailableError when the named isolation
    is not available in this build or on this machine.
    """
    if not isinstance(backend, str):
        return backend
    if backend == "subprocess":
        from sunroom.sandbox.backends.subprocess import SubprocessBackend

        return SubprocessBackend()
    if backend == "bwrap":
        from sunroom.sandbox.backends.bwrap import BwrapBackend

        return BwrapBackend()
    if backend == "docker":
        require("docker", "the docker backend", SandboxUnavailableError)
        from sunroom.sandbox.backends.docker import DockerBackend

        return DockerBackend()
    if backend == "jupyter":
        from sunroom.sandbox.backends.jupyter import JupyterBackend

        return JupyterBackend()
    raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(NAMES)}")
