"""Jupyter kernels as a sunroom backend (``backend="jupyter"``); see ``docs/jupyter.md``.

Needs ``sunroom[jupyter]``: :class:`JupyterBackend` is imported on first use, which raises
SandboxUnavailableError naming the extra when jupyter-client is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sunroom.errors import SandboxUnavailableError
from sunroom.extras import require
from sunroom.sandbox.backends.jupyter.specs import KernelSpecInfo, find_kernelspec, kernelspecs

if TYPE_CHECKING:
    from sunroom.sandbox.backends.jupyter.backend import JupyterBackend

__all__ = ["JupyterBackend", "KernelSpecInfo", "find_kernelspec", "kernelspecs"]


def __getattr__(name: str) -> object:
    if name == "JupyterBackend":
        require("jupyter", "the jupyter backend", SandboxUnavailableError)
        from sunroom.sandbox.backends.jupyter.backend import JupyterBackend

        return JupyterBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
