"""The ``jupyter`` backend: any installed Jupyter kernel, run inside sunroom's sandbox.

(Work in progress: the constructor is final, ``launch`` is being written.)
"""

from __future__ import annotations

import socket
from typing import final

from sunroom.errors import UsageError
from sunroom.jupyter.specs import KernelSpecInfo, find_kernelspec
from sunroom.sandbox.backend import Backend, KernelProcess, LaunchSpec

SANDBOXES = ("bwrap", "docker", "none")


@final
class JupyterBackend:
    """Start the Jupyter kernel *kernel_name* inside *sandbox* and drive it with jupyter-client.

    Args:
        kernel_name: an installed kernelspec (``sunroom kernelspecs`` lists them); an unknown
            name raises UsageError naming the installed ones.
        sandbox: ``"bwrap"`` (default), ``"docker"``, ``"none"`` (sunroom's ``subprocess``
            backend: supervised, not a boundary) or a Backend instance of those.
    """

    name = "jupyter"

    def __init__(self, kernel_name: str = "python3", *, sandbox: str | Backend = "bwrap") -> None:
        if not isinstance(kernel_name, str) or not kernel_name:
            raise UsageError("kernel_name must be a non-empty str")
        if isinstance(sandbox, str) and sandbox not in SANDBOXES:
            raise UsageError(f"unknown sandbox {sandbox!r}; choose one of {', '.join(SANDBOXES)}")
        self.spec: KernelSpecInfo = find_kernelspec(kernel_name)
        self.kernel_name = kernel_name
        self._sandbox_arg = sandbox
        self.sandbox = sandbox if isinstance(sandbox, str) else sandbox.name

    @property
    def python(self) -> bool:
        """Whether the kernel is an IPython kernel (host functions and inputs work in it)."""
        return self.spec.python

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start the kernel; see ``Backend.launch``."""
        raise NotImplementedError("being written")
