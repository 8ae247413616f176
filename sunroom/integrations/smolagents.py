"""``SunroomExecutor``: smolagents' remote executor contract on a sunroom kernel.

``CodeAgent(tools=..., model=..., executor=SunroomExecutor(backend="bwrap"))`` runs the agent's
code in a persistent, isolated sunroom kernel instead of smolagents' ``LocalPythonExecutor``
or a Docker/E2B/Modal sandbox. It implements ``smolagents.remote_executors.RemotePythonExecutor``
(``send_tools``, ``send_variables``, ``run_code_raise_errors`` returning ``CodeOutput``,
``cleanup`` / ``delete``) and differs from smolagents' own remote executors in where tools run:

- Tools and managed agents run **on the host**, called from the kernel through one sunroom host
  function (:data:`DISPATCH`). Their code, their requirements and their credentials never
  enter the sandbox: nothing is pip-installed there, and managed agents work (smolagents'
  remote executors refuse them). The kernel holds only a stub per tool name.
- ``final_answer`` runs on the host too; the stub then raises ``FinalAnswerException`` (a
  ``BaseException``, so the agent's ``except Exception`` cannot swallow it) and the answer the
  host kept is returned as the real object (a ``PIL.Image.Image`` for an image, for instance),
  never through pickle or a text round trip.
- Variables are bound with ``kernel.bind`` once per value (a value already bound, the same
  object, is not sent again) and survive kernel restarts.

Values cross the boundary as sunroom's wire data (str, bytes, numbers, bool, None, lists, dicts);
PIL images are sent as PNG bytes and rebuilt on the other side; anything else a tool returns
reaches the kernel as its ``str()``. A tool's exception reaches the kernel with the same type
name and message (builtin types are raised as themselves).
"""

from __future__ import annotations

import io
import keyword
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from sunroom.errors import UsageError
from sunroom.extras import require

require("smolagents", "sunroom.integrations.smolagents")

from smolagents.local_python_executor import CodeOutput  # noqa: E402
from smolagents.monitoring import AgentLogger, LogLevel  # noqa: E402
from smolagents.remote_executors import RemotePythonExecutor  # noqa: E402
from smolagents.utils import AgentError  # noqa: E402

from sunroom.rpc import wire  # noqa: E402
from sunroom.sandbox import backends  # noqa: E402
from sunroom.sandbox.functions import HostFunction, host_function  # noqa: E402
from sunroom.sandbox.sync import Kernel  # noqa: E402

if TYPE_CHECKING:
    import PIL.Image

    from sunroom.network.policy import Network
    from sunroom.sandbox.backend import Backend
    from sunroom.sandbox.limits import Limits
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.result import ExecutionResult

__all__ = ["DISPATCH", "FINAL_ANSWER_EXCEPTION", "SunroomExecutor"]

_log = logging.getLogger(__name__)

DISPATCH: Final = "smolagents_tool"
"""The one host function the kernel calls tools through: ``smolagents_tool(name, args, kwargs)``."""

FINAL_ANSWER_EXCEPTION: Final = RemotePythonExecutor.FINAL_ANSWER_EXCEPTION
"""The exception ``final_answer`` raises in the kernel to end the cell (smolagents' name)."""

_TAG: Final = "__sunroom_smolagents__"

#: Kernel-side helpers, run once per kernel process (again after a restart). Plain Python:
#: the kernel has only its own packages; PIL is used when it is there.
_KERNEL_HELPERS: Final = f'''
import builtins as _sm_builtins


class {FINAL_ANSWER_EXCEPTION}(BaseException):
    """Ends the cell: final_answer() was called; the host holds the answer."""


def _sm_encode(value):
    try:
        import PIL.Image as _sm_image
    except ImportError:
        _sm_image = None
    if _sm_image is not None and isinstance(value, _sm_image.Image):
        import io as _sm_io
        buffer = _sm_io.BytesIO()
        value.save(buffer, format="PNG")
        return {{"{_TAG}": "image", "png": buffer.getvalue()}}
    if isinstance(value, dict):
        return {{key: _sm_encode(item) for key, item in value.items()}}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_sm_encode(item) for item in value]
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value


def _sm_decode(value):
    if isinstance(value, dict) and "{_TAG}" in value:
        kind = value["{_TAG}"]
        if kind == "image":
            try:
                import PIL.Image as _sm_image
            except ImportError:
                return value["png"]
            import io as _sm_io
            return _sm_image.open(_sm_io.BytesIO(value["png"]))
        if kind == "error":
            found = getattr(_sm_builtins, value["type"], None)
            if not (isinstance(found, type) and issubclass(found, Exception)):
                found = type(value["type"], (Exception,), {{}})
            raise found(value["message"])
    if isinstance(value, dict):
        return {{key: _sm_decode(item) for key, item in value.items()}}
    if isinstance(value, list):
        return [_sm_decode(item) for item in value]
    return value


def _sm_decode_global(name):
    globals()[name] = _sm_decode(globals()[name])


def _sm_tool(name, final):
    def call(*args, **kwargs):
        result = _sm_decode({DISPATCH}(name, _sm_encode(list(args)), _sm_encode(kwargs)))
        if final:
            raise {FINAL_ANSWER_EXCEPTION}(name)
        return result
    call.__name__ = call.__qualname__ = name
    return call
'''


class SunroomExecutor(RemotePythonExecutor):  # type: ignore[misc]  # smolagents is untyped
    """smolagents' remote executor on a sunroom kernel; tools run on the host.

    Args:
        additional_imports: smolagents' argument (``CodeAgent`` passes its authorized imports).
            Kept for the contract; nothing is pip-installed: the kernel imports what its
            backend provides, and ``packages=`` (:class:`~sunroom.Packages`) adds more.
        logger: smolagents' ``AgentLogger``; None makes a silent one (``CodeAgent`` logs the
            errors this executor raises with its own logger).
        backend: the sunroom backend (``"bwrap"``, ``"docker"``, ``"subprocess"``, ...).
        limits / env / network / packages: the kernel's options (see :class:`~sunroom.Kernel`).
        functions: more host functions for the agent's code to call, besides the tools.
        timeout_s: the longest one ``run_code_raise_errors`` may run (None: the limits' own).

    The kernel starts here; :meth:`cleanup` (or :meth:`delete`) closes it. Raises what
    :class:`~sunroom.Kernel` raises when the kernel cannot start (KernelStartError,
    SandboxUnavailableError, UsageError).
    """

    def __init__(
        self,
        additional_imports: Sequence[str] = (),
        logger: AgentLogger | None = None,
        *,
        backend: str | Backend = backends.DEFAULT_BACKEND,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        network: Network | None = None,
        packages: Packages | None = None,
        functions: Iterable[Callable[..., Any] | HostFunction] = (),
        timeout_s: float | None = None,
    ) -> None:
        super().__init__(
            list(additional_imports),
            logger if logger is not None else AgentLogger(level=LogLevel.OFF),
        )
        self.timeout_s = timeout_s
        self._tools: dict[str, Any] = {}
        self._bound: dict[str, object] = {}
        self._pictured: set[str] = set()  # bound variables holding PIL images
        self._answer_lock = threading.Lock()
        self._answer: list[Any] = []  # the final answer of the running cell, when it gave one
        dispatch = host_function(
            self._dispatch,
            name=DISPATCH,
            description="Call the smolagents tool or managed agent *name* on the host.",
        )
        self.kernel = Kernel(
            backend=backend,
            functions=(dispatch, *functions),
            limits=limits,
            env=env,
            network=network,
            packages=packages,
        )
        try:
            self.kernel.start()
            self._install_helpers()
        except BaseException:
            self.kernel.close()
            raise
        self.logger.log("sunroom kernel is running", level=LogLevel.INFO)

    # -- smolagents' contract ------------------------------------------------------------------

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Make *tools* (tools and managed agents, by name) callable from the kernel.

        The tools stay on the host; the kernel gets one stub per name that calls
        :data:`DISPATCH`. Tools sent before keep working unless replaced by name. Raises
        UsageError for a name that is not a Python identifier (smolagents checks them too).
        """
        for name in tools:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise UsageError(f"a smolagents tool name must be a Python identifier: {name!r}")
        self._tools.update(tools)
        self._define_stubs(tools)

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Bind *variables* in the kernel, sending only values not bound before (by identity).

        A value already sent (the same object under the same name) is not sent again, even if
        the code changed the kernel's copy since. PIL images (alone or in lists and dicts,
        as smolagents' ``images``) arrive as PIL images. Raises UsageError for a value sunroom
        cannot send (see :meth:`~sunroom.Kernel.bind`).
        """
        fresh = {k: v for k, v in variables.items() if self._bound.get(k, _UNSET) is not v}
        if not fresh:
            return
        pictured = sorted(k for k, v in fresh.items() if _has_image(v))
        self.kernel.bind(**{k: _encode(v) if k in pictured else v for k, v in fresh.items()})
        self._pictured.difference_update(fresh)
        self._pictured.update(pictured)
        self._decode_images(pictured)
        self._bound.update(fresh)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run *code* as one cell and return smolagents' ``CodeOutput``.

        ``output`` is the final answer (``is_final_answer=True``) or the ``repr`` of the trailing
        expression, or None; ``logs`` is the cell's stdout then stderr. An error in the code
        (or a timeout, or the kernel's death) raises ``AgentError`` whose message names the
        exception type, its message and its traceback.
        """
        with self._answer_lock:
            self._answer.clear()
        result = self.kernel.execute(code, timeout_s=self.timeout_s)
        if result.state_lost:  # a fresh process: sunroom bound the variables again
            self._install_helpers()
            self._define_stubs(self._tools)
            self._decode_images(sorted(self._pictured))
        logs = result.stdout + result.stderr
        if result.error is not None:
            if result.error.type == FINAL_ANSWER_EXCEPTION:
                with self._answer_lock:
                    answer = list(self._answer)
                if answer:
                    return CodeOutput(output=answer[0], logs=logs, is_final_answer=True)
            raise AgentError(_error_message(logs, result), self.logger)
        return CodeOutput(output=result.value, logs=logs, is_final_answer=False)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Install nothing: tools run on the host, the kernel imports what its backend has."""
        return additional_imports

    def cleanup(self) -> None:
        """Close the kernel (kill its process tree). Idempotent."""
        self.kernel.close()

    def delete(self) -> None:
        """The same as :meth:`cleanup` (smolagents' name for it on Docker and Modal)."""
        self.cleanup()

    # -- the host side of the tools ------------------------------------------------------------

    def _dispatch(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run tool *name* on the host; its result, or its exception as data, goes back."""
        tool = self._tools.get(name)
        if tool is None:
            return _error_data(NameError(f"no smolagents tool is called {name!r}"))
        try:
            result = tool(*_decode(args), **_decode(kwargs))
        except Exception as exc:  # the kernel's caller gets it, same type name and message
            _log.debug("smolagents tool %s raised", name, exc_info=True)
            return _error_data(exc)
        if name == "final_answer":
            with self._answer_lock:
                self._answer[:] = [result]
            return None
        return _encode(result)

    def _install_helpers(self) -> None:
        self._run_internal(_KERNEL_HELPERS)

    def _define_stubs(self, tools: Mapping[str, Any]) -> None:
        lines = [f"{name} = _sm_tool({name!r}, {name == 'final_answer'})" for name in tools]
        if lines:
            self._run_internal("\n".join(lines))

    def _decode_images(self, names: list[str]) -> None:
        """Rebuild the bound variables *names* as PIL images in the kernel (its own PIL)."""
        if names:
            self._run_internal(f"for _sm_name in {names!r}:\n    _sm_decode_global(_sm_name)")

    def _run_internal(self, code: str) -> None:
        result = self.kernel.execute(code, filename="<sunroom-smolagents>")
        if result.error is not None:
            raise AgentError(_error_message(result.stdout + result.stderr, result), self.logger)


class _Unset:
    pass


_UNSET: Final = _Unset()


def _error_message(logs: str, result: ExecutionResult) -> str:
    error = result.error
    assert error is not None
    return (
        f"{logs}\nExecuting code yielded an error:\n{error.type}\n{error.message}\n"
        f"{error.traceback}"
    )


def _error_data(exc: Exception) -> dict[str, str]:
    return {_TAG: "error", "type": type(exc).__name__, "message": str(exc)}


def _encode(value: Any) -> Any:
    """*value* as wire data for the kernel: PIL images as tagged PNG bytes, unknowns as str."""
    image = _png(value)
    if image is not None:
        return {_TAG: "image", "png": image}
    if isinstance(value, dict):
        return {_encode(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_encode(v) for v in value]
    try:
        return wire.to_wire(value)
    except TypeError:  # on purpose: the kernel gets what the tool's text would be
        return str(value)


def _decode(value: Any) -> Any:
    """Wire data from the kernel as Python values: tagged PNG bytes as PIL images."""
    if isinstance(value, dict):
        if value.get(_TAG) == "image":
            import PIL.Image

            return PIL.Image.open(io.BytesIO(value["png"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _has_image(value: object) -> bool:
    if isinstance(value, dict):
        return any(_has_image(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_image(v) for v in value)
    return _is_image(value)


def _is_image(value: object) -> TypeGuard[PIL.Image.Image]:
    try:
        import PIL.Image
    except ImportError:
        return False
    return isinstance(value, PIL.Image.Image)


def _png(value: object) -> bytes | None:
    if not _is_image(value):
        return None
    buffer = io.BytesIO()
    value.save(buffer, format="PNG")
    return buffer.getvalue()
