"""What a kernel and a pool take from a template: :class:`TemplateSource`.

``AsyncKernel(template=...)`` and ``KernelPool(template=...)`` take a
:class:`~sunroom.sandbox.template.Template`, which makes kernels itself (its zygote is one).
They see it through this protocol, so neither imports the template module: the template sits
above the kernel, and nothing below imports back up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.launch import Ready
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import Packages

if TYPE_CHECKING:
    from sunroom.tracing import Link


class TemplateSource(Protocol):
    """A warm kernel whose forks (or kernels started the same way) are handed out ready.

    Every kernel from it runs with its backend, limits, env and packages, and has its
    functions installed and its inputs bound already.
    """

    @property
    def backend(self) -> str | Backend:
        """The backend its kernels run on."""
        ...

    @property
    def limits(self) -> Limits:
        """The limits its kernels run with."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """The extra environment of its kernels."""
        ...

    @property
    def packages(self) -> Packages:
        """Where its kernels' ``install()`` finds packages."""
        ...

    @property
    def functions(self) -> tuple[HostFunction, ...]:
        """The host functions installed in its kernels."""
        ...

    @property
    def inputs(self) -> Mapping[str, object]:
        """The inputs bound in its kernels."""
        ...

    @property
    def trace_links(self) -> tuple[Link, ...]:
        """Span links to where its kernel was made (empty: none; :mod:`sunroom.tracing`)."""
        ...

    async def fork_ready(self) -> Ready:
        """A kernel of the template, ready to be adopted (the caller owns it)."""
        ...
