"""Jupyter kernels as a sunroom backend (``backend="jupyter"``); see ``docs/jupyter.md``."""

from sunroom.sandbox.backends.jupyter.backend import JupyterBackend
from sunroom.sandbox.backends.jupyter.specs import KernelSpecInfo, find_kernelspec, kernelspecs

__all__ = ["JupyterBackend", "KernelSpecInfo", "find_kernelspec", "kernelspecs"]
