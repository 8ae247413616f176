"""A kernel's inputs and variables: :meth:`bind`, :meth:`variables` and the checks they share.

Inputs are bound again after every restart. Values of any size are streamed in chunks;
:class:`~sunroom.File` and :class:`~sunroom.Directory` inputs are placed the way the backend
can (mounted at start by bwrap and docker, a host path for the subprocess backend); see
:mod:`sunroom.sandbox.inputs` and docs/data.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol, final

from sunroom.errors import ClosedError, KernelError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox import inputs as host_inputs
from sunroom.sandbox.backend import Backend, InputMount
from sunroom.sandbox.functions import to_wire
from sunroom.sandbox.kernel_lifecycle import KernelCore
from sunroom.sandbox.kernel_serving import KernelServing
from sunroom.sandbox.result import Variable


class Early(Protocol):
    """A pool or template: its kernels are started before their inputs are known."""

    @property
    def backend(self) -> str | Backend:
        """The backend its kernels run on."""
        ...


@final
class KernelInputs:
    """Binds inputs in the kernel's namespace (again at every restart) and lists its variables.

    *early* is the pool or template the kernel's processes come from (they are started before
    the inputs are known), None for a kernel that launches its own.
    """

    def __init__(self, core: KernelCore, serving: KernelServing, *, early: Early | None) -> None:
        self._core = core
        self._serving = serving
        self._early = early
        self.values: dict[str, object] = {}
        self.files: dict[str, host_inputs.Resolved] = {}

    def copy_for(self, core: KernelCore, serving: KernelServing) -> KernelInputs:
        """The same inputs, for a forked copy (bound in it already)."""
        copy = KernelInputs(core, serving, early=self._early)
        copy.values, copy.files = dict(self.values), dict(self.files)
        return copy

    def take(self, values: Mapping[str, object]) -> None:
        """Check and keep the kernel's ``inputs=`` (bound at every start)."""
        self.check_names(values)
        self.files = self.resolve_files(values)
        self.values.update(values)

    def check_names(self, values: Mapping[str, object]) -> None:
        """UsageError for a name that is not a public identifier or shadows a host function."""
        for name in values:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise UsageError(f"input name {name!r} must be a public Python identifier")
            if name in self._serving.registry.functions:
                raise UsageError(f"input {name!r} would shadow the host function of that name")

    def resolve_files(self, values: Mapping[str, object]) -> dict[str, host_inputs.Resolved]:
        """Resolve and check the File/Directory inputs among *values* (UsageError if bad)."""
        found = {
            n: host_inputs.resolve(n, v)
            for n, v in values.items()
            if isinstance(v, host_inputs.File | host_inputs.Directory)
        }
        if found and self._early is not None:
            ahead = self._early.backend
            backend = ahead if isinstance(ahead, str) else ahead.name
            if backend not in host_inputs.PATH_BACKENDS:
                raise UsageError(
                    "a pooled kernel (or one from a template) is started before its inputs are "
                    "known, so File and Directory inputs cannot be mounted in it; give them to "
                    "the template, or use a kernel without a pool"
                )
        return found

    def mounts(self, where: str) -> tuple[InputMount, ...]:
        """The file inputs' mounts on a backend that places them as *where* does."""
        return host_inputs.mounts(where, self.files)

    async def send_bind(self, values: Mapping[str, object]) -> None:
        """Bind *values* in the running process (KernelError, KernelDiedError, UsageError)."""
        core = self._core
        assert core.channel is not None
        assert core.backend is not None
        plain = {n: v for n, v in values.items() if not host_inputs.is_file_input(v)}
        try:
            wire = {name: to_wire(value) for name, value in plain.items()}
            files = {
                n: host_inputs.file_spec(core.inputs_backend(), self.files[n])
                for n in values
                if n not in plain
            }
        except TypeError as exc:
            raise UsageError(f"cannot bind: {exc}") from None
        type_names = self._serving.wrappers.type_names
        types = {name: type_names[type(v)] for name, v in plain.items() if type(v) in type_names}
        answer = host_inputs.send_bind(
            core.channel,
            wire,
            types=types,
            files=files,
            max_frame=core.limits.max_frame_bytes,
        )
        try:
            await answer  # UsageError: cannot be sent; ProtocolError: the kernel broke it
        except RemoteError as exc:
            raise KernelError(f"bind failed: {cut(str(exc), 300)}") from None
        except (ClosedError, ConnectionError) as exc:
            raise await core.died("bind", exc) from None

    async def bind(self, **values: object) -> None:
        """Set variables in the namespace; see :meth:`AsyncKernel.bind`."""
        core = self._core
        self.check_names(values)
        core.require_runtime("inputs")
        async with core.lock:
            files = await asyncio.to_thread(self.resolve_files, values)  # stats, walks
            if files:
                running = core.channel is not None and not core.channel.closed.done()
                name = core.inputs_backend()
                for item in files.values():
                    host_inputs.kernel_path(name, item)  # UsageError for a backend that cannot
                if running and name not in host_inputs.PATH_BACKENDS:
                    raise UsageError(
                        f"the {name} kernel is running and its mounts were fixed when it "
                        "started; pass File and Directory inputs in inputs= (or bind them "
                        "before the kernel is started)"
                    )
                self.files.update(files)
            await core.ensure()
            await self.send_bind(values)
            self.values.update(values)

    async def variables(self) -> list[Variable]:
        """The user's variables; see :meth:`AsyncKernel.variables`."""
        core = self._core
        core.require_runtime("variables")
        async with core.lock:
            await core.ensure()
            assert core.channel is not None
            try:
                rows = await core.channel.call("variables", check=schema.variables)
            except RemoteError as exc:
                raise KernelError(f"variables failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await core.died("variables", exc) from None
        return [Variable(r["name"], r["type"], r["repr"]) for r in rows]
