"""The requests a Python kernel serves beside its cells: functions, inputs, variables, files.

Shared by sunroom's own runtime (:mod:`sunroom.prelude.runtime`) and the IPython extension
(:mod:`sunroom.prelude.ipython`): both keep the user's names in one namespace dict, and both
answer ``install`` (host function wrappers), ``bind`` / ``bind_chunk`` (inputs),
``variables``, ``list_packages`` and the ``file_*`` requests (:mod:`sunroom.prelude.files`)
the same way. Who runs the cells, and on which thread requests are served, is the caller's
business. The keeper (:mod:`sunroom.prelude.keeper`) uses the hello and the files alone.
Standard library and msgpack only.
"""

from __future__ import annotations

import sys
import types

from sunroom.prelude import inputs, sources
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.codec import PROTOCOL_VERSION
from sunroom.rpc.messages import Request, RpcError
from sunroom.rpc.wire import from_wire

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from collections.abc import Callable, Container
    from typing import Any

    Handler = Callable[[object], object]

FUNCTIONS_MODULE = "sunroom_functions"
"""The module host function wrappers (and the types they use) are installed in."""

SERVED = frozenset({"install", "bind", "bind_chunk", "variables", "list_packages"})
"""The methods :class:`Services` serves besides the ``file_*`` requests."""

MAX_REPR = 80
"""Longest ``repr`` (characters) ``variables`` reports for one value; longer ones are cut."""


def hello(channel: BlockingChannel, nonce: str, pid: int, *, python: bool = True) -> None:
    """Send the kernel's first message: protocol version, *pid*, Python version, *nonce*.

    *python* False leaves the Python version out (a keeper speaking for a non-Python kernel).
    """
    channel.notify("hello", hello_params(nonce, pid, python=python))


def hello_params(nonce: str, pid: int, *, python: bool = True) -> dict[str, object]:
    """A hello's params (:func:`hello`)."""
    params: dict[str, object] = {"protocol": PROTOCOL_VERSION, "pid": pid, "nonce": nonce}
    if python:
        params["python"] = sys.version.split()[0]
    return params


def answer(channel: BlockingChannel, req: Request, handler: Handler) -> None:
    """Run *handler* on the request's params and send its result, or its error as an RpcError.

    An exception becomes an error answer named by its class (the host maps the name); a
    ``KeyboardInterrupt`` becomes ``Interrupted``. The request is always answered.
    """
    try:
        result = handler(req.params)
    except KeyboardInterrupt:
        channel.respond(req.id, RpcError("Interrupted", "interrupted outside user code"))
        return
    except Exception as exc:
        channel.respond(req.id, RpcError(type(exc).__name__, str(exc)))
        return
    channel.respond(req.id, None, result)


class Services:
    """The non-cell requests of one kernel, served into *namespace*.

    Args:
        namespace: the user's names; installed functions and bound inputs land here.
        workdir: the root of the files API (fixed at boot, before any cell can ``chdir``).
        hidden: names ``variables`` leaves out besides private (``_``) names, installed
            functions and modules (e.g. IPython's own names); checked at each request. A
            name the host bound is never hidden: IPython hides every name present when its
            start-up ends, and a bind may land before that.
    """

    def __init__(
        self,
        namespace: dict[str, object],
        *,
        workdir: str,
        hidden: tuple[Container[str], ...] = (),
    ) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.hidden = hidden
        self.installed: set[str] = set()
        self.bound: set[str] = set()
        self.incoming = inputs.Incoming()
        self._files: Any = None  # sunroom.prelude.files.FileServer, made on first use

    def handler(self, method: str) -> Handler | None:
        """The handler serving *method*, or None when it is not one of these requests."""
        if method.startswith("file_"):
            return self._file_handler(method)
        if method in SERVED:
            handler: Handler = getattr(self, method)
            return handler
        return None

    def move(self, workdir: str) -> None:
        """Serve files from *workdir* from now on (a copy of the kernel has its own)."""
        self.workdir = workdir
        self._files = None

    def _file_handler(self, method: str) -> Handler | None:
        if self._files is None:
            try:
                from sunroom.prelude.files import FileServer  # ctypes and re: only when used

                self._files = FileServer(self.workdir)
            except Exception as exc:  # answered as the request's error; the kernel goes on
                failure = exc

                def unavailable(params: object) -> None:
                    raise failure

                return unavailable
        found: Handler | None = self._files.handlers.get(method)
        return found

    def install(self, params: dict[str, Any]) -> list[str]:
        """Run the host's generated wrapper source; put its ``exports`` into the namespace."""
        source: str = params["source"]
        filename = "<sunroom-functions>"
        sources.remember(filename, source)
        module = types.ModuleType(FUNCTIONS_MODULE)
        sys.modules[FUNCTIONS_MODULE] = module  # dataclasses look their module up
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - host-generated
        names: list[str] = list(params.get("exports", []))
        for name in names:
            self.namespace[name] = module.__dict__[name]
        self.installed.update(names)
        return names

    def bind(self, params: dict[str, Any]) -> list[str]:
        """Bind input values (rebuilt as their declared types) and file inputs; their names."""
        values: dict[str, object] = params["values"]
        if "streamed" in params:  # the big values came first, in bind_chunk requests
            values.update(self.incoming.take(int(params["streamed"])))
        else:
            self.incoming.reset()  # drop what an abandoned streamed bind left
        types_by_name: dict[str, str] = params.get("types") or {}
        module = sys.modules.get(FUNCTIONS_MODULE)
        for name, value in values.items():
            type_name = types_by_name.get(name)
            tp = getattr(module, type_name, None) if module and type_name else None
            self.namespace[name] = from_wire(tp, value)
        files: dict[str, dict[str, object]] = params.get("files") or {}
        for name, spec in files.items():
            self.namespace[name] = inputs.load_file(spec)
        names = [*values, *files]
        self.bound.update(names)
        return names

    def list_packages(self, params: object) -> dict[str, object]:
        """The importable distributions (:func:`sunroom.prelude.packages.listing`)."""
        from sunroom.prelude import packages

        return packages.listing()

    def bind_chunk(self, params: dict[str, object]) -> int:
        """Take one piece of a streamed bind; the bytes received so far."""
        return self.incoming.chunk(params)

    def variables(self, params: object) -> list[dict[str, str]]:
        """The user's names: name, type and a ``repr`` cut to ``MAX_REPR`` characters."""
        out = []
        for name, value in list(self.namespace.items()):
            if name.startswith("_") or name in self.installed:
                continue
            if name not in self.bound and any(name in names for names in self.hidden):
                continue
            if isinstance(value, types.ModuleType):
                continue
            try:
                text = repr(value)
            except Exception as exc:
                text = f"<repr failed: {type(exc).__name__}>"
            if len(text) > MAX_REPR:
                text = text[: MAX_REPR - 3] + "..."
            out.append({"name": name, "type": type(value).__name__, "repr": text})
        return out
