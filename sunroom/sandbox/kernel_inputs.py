"""A kernel's inputs and variables: :meth:`bind`, :meth:`variables` and the checks they share.

Inputs are bound again after every restart. Values of any size are streamed in chunks;
:class:`~sunroom.File` and :class:`~sunroom.Directory` inputs are placed the way the backend
can (mounted at start by bwrap and docker, a host path for the subprocess backend); see
:mod:`sunroom.sandbox.inputs` and docs/data.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sunroom.errors import ClosedError, KernelError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox import backends
from sunroom.sandbox import inputs as host_inputs
from sunroom.sandbox.functions import to_wire
from sunroom.sandbox.kernel_lifecycle import KernelLifecycle
from sunroom.sandbox.result import Variable


class KernelInputs(KernelLifecycle):
    """Binds inputs in the kernel's namespace and lists its variables."""

    def _check_names(self, values: Mapping[str, Any]) -> None:
        for name in values:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise UsageError(f"input name {name!r} must be a public Python identifier")
            if name in self.registry.functions:
                raise UsageError(f"input {name!r} would shadow the host function of that name")

    def _inputs_backend(self) -> str:
        """The backend whose way of placing file inputs applies (a Jupyter kernel's sandbox)."""
        assert self._backend is not None
        name: str = getattr(self._backend, "inputs_backend", self._backend.name)
        return name

    def _resolve_files(self, values: Mapping[str, Any]) -> dict[str, host_inputs.Resolved]:
        """Resolve and check the File/Directory inputs among *values* (UsageError if bad)."""
        found = {
            n: host_inputs.resolve(n, v) for n, v in values.items() if host_inputs.is_file_input(v)
        }
        early = self._pool or self._template
        if found and early is not None:
            ahead = early.backend
            backend = ahead if isinstance(ahead, str) else ahead.name
            if backend not in host_inputs.PATH_BACKENDS:
                raise UsageError(
                    "a pooled kernel (or one from a template) is started before its inputs are "
                    "known, so File and Directory inputs cannot be mounted in it; give them to "
                    "the template, or use a kernel without a pool"
                )
        return found

    async def _send_bind(self, values: Mapping[str, Any]) -> None:
        assert self._channel is not None
        assert self._backend is not None
        plain = {n: v for n, v in values.items() if not host_inputs.is_file_input(v)}
        try:
            wire = {name: to_wire(value) for name, value in plain.items()}
            files = {
                n: host_inputs.file_spec(self._inputs_backend(), self._file_inputs[n])
                for n in values
                if n not in plain
            }
        except TypeError as exc:
            raise UsageError(f"cannot bind: {exc}") from None
        types = {
            name: self._wrappers.type_names[type(v)]
            for name, v in plain.items()
            if type(v) in self._wrappers.type_names
        }
        answer = host_inputs.send_bind(
            self._channel,
            wire,
            types=types,
            files=files,
            max_frame=self.limits.max_frame_bytes,
        )
        try:
            await answer  # UsageError: cannot be sent; ProtocolError: the kernel broke it
        except RemoteError as exc:
            raise KernelError(f"bind failed: {cut(str(exc), 300)}") from None
        except (ClosedError, ConnectionError) as exc:
            raise await self._died("bind", exc) from None

    async def bind(self, **values: Any) -> None:
        """Set variables in the namespace; they are bound again after every restart.

        Values must be msgpack-representable (str, bytes, numbers, bool, None, lists, dicts,
        pydantic models and dataclasses), of any size (big ones are streamed in chunks), or
        :class:`~sunroom.File` / :class:`~sunroom.Directory` inputs. The bwrap and docker
        backends mount file inputs when the kernel starts, so binding one into a running
        kernel of theirs raises UsageError (pass it in ``inputs=``, or bind it before the
        kernel is started: bind() then starts it with the mount). Raises UsageError for bad
        names or values, KernelError when the kernel refuses them, ProtocolError when its
        answer is malformed (the kernel is then restarted on next use).
        """
        self._check_names(values)
        self._require_runtime("inputs")
        async with self._lock:
            files = await asyncio.to_thread(self._resolve_files, values)  # stats, walks
            if files:
                if self._backend is None:
                    self._backend = backends.resolve(self._backend_arg)
                running = self._channel is not None and not self._channel.closed.done()
                name = self._inputs_backend()
                for item in files.values():
                    host_inputs.kernel_path(name, item)  # UsageError for a backend that cannot
                if running and name not in host_inputs.PATH_BACKENDS:
                    raise UsageError(
                        f"the {name} kernel is running and its mounts were fixed when it "
                        "started; pass File and Directory inputs in inputs= (or bind them "
                        "before the kernel is started)"
                    )
                self._file_inputs.update(files)
            await self._ensure()
            await self._send_bind(values)
            self._inputs.update(values)

    async def variables(self) -> list[Variable]:
        """The user's variables: names, type names and short reprs (no values).

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        while answering, ProtocolError when its answer is not a list of variables (the kernel
        is then restarted on next use).
        """
        self._require_runtime("variables")
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                rows = await self._channel.call("variables", check=schema.variables)
            except RemoteError as exc:
                raise KernelError(f"variables failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("variables", exc) from None
        return [Variable(r["name"], r["type"], r["repr"]) for r in rows]
