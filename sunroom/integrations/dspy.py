"""DSPy's ``CodeInterpreter`` on a sunroom kernel.

``dspy.RLM(..., interpreter_factory=SunroomInterpreter)`` is the one-line switch.

:class:`SunroomInterpreter` implements the protocol of ``dspy.primitives.code_interpreter``
(DSPy 3.4): a mutable :attr:`~SunroomInterpreter.tools` dict, an idempotent :meth:`start`,
:meth:`execute` returning ``FinalOutput`` when the code calls ``SUBMIT``, else the trailing
expression's value or the captured stdout (``None`` when there is neither), ``SyntaxError``
for code that does not parse, ``CodeExecutionError`` for an exception the code raised (a
tool's included), ``CodeInterpreterError`` once the kernel is gone (it is never restarted
behind the caller's back: the session's state would be lost silently), and :meth:`shutdown`.

What differs from DSPy's default (Deno/Pyodide) interpreter:

- the code runs in real CPython in a sunroom kernel (bwrap by default, any backend);
- tools run on the host as sunroom host functions, in the caller's ``contextvars`` context
  (so ``dspy.context(lm=...)`` reaches ``llm_query``); their code never enters the kernel;
- every variable is sent once per content: its value is bound into the kernel by sunroom's
  framed msgpack channel under a content-hash key (never spelled as a code literal), and
  each later ``execute`` only rebinds the name to the kernel's copy. ``dspy.RLM`` passes its
  inputs on every iteration; a 100 MB context therefore crosses once per run, not once per
  iteration. Each ``execute`` still sees the value as passed (a list or dict is deep-copied
  inside the kernel), as with the default interpreter.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import json
import keyword
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, NoReturn

from sunroom import extras

extras.require("dspy", "sunroom.integrations.dspy")

from dspy.primitives.code_interpreter import (  # noqa: E402  (after the extra is checked)
    CodeExecutionError,
    CodeInterpreterError,
    FinalOutput,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python  # noqa: E402

from sunroom.errors import SunroomError  # noqa: E402
from sunroom.sandbox.functions import HostFunction, host_function  # noqa: E402
from sunroom.sandbox.limits import Limits  # noqa: E402
from sunroom.sandbox.result import ExecutionResult  # noqa: E402
from sunroom.sandbox.sync import Kernel  # noqa: E402

__all__ = ["SunroomInterpreter"]

logger = logging.getLogger(__name__)

#: the module object the bridge's two host functions live in, inside the kernel
BRIDGE: Final = "sunroom_dspy"
#: bound values are named ``<VALUE_PREFIX><content hash>`` (public names, as bind() wants)
VALUE_PREFIX: Final = "sunroom_dspy_value_"
#: immutable values whose identity is enough to know their content is unchanged
IMMUTABLE: Final = (str, bytes, int, float, bool, type(None))
#: names the interpreter owns in the kernel's namespace
RESERVED: Final = frozenset({"SUBMIT", "__builtins__", BRIDGE, "_sunroom_dspy"})

# Kernel side, run once at start: the per-execute runner. It parses the code (SyntaxError is
# reported, not raised), rebinds the variables to the values bound earlier, runs the code in
# the kernel's namespace, evaluates a trailing expression and reports the outcome to the host
# through ``sunroom_dspy.report``. Nothing here is sent again on later executions.
_KERNEL_SETUP: Final = '''
class _sunroom_dspy:
    import ast as _ast, copy as _copy, json as _json

    class Submitted(BaseException):
        """SUBMIT's control flow: the code is done and this is its answer."""

    store = {}

    @staticmethod
    def jsonable(value):
        try:
            _sunroom_dspy._json.dumps(value, allow_nan=False)
            return value
        except (TypeError, ValueError):
            return repr(value)

    @staticmethod
    def configure(fields, tools):
        ns = globals()
        if fields is not None:
            ns.pop("SUBMIT", None)
            if fields:
                src = "def SUBMIT({0}):\\n    raise _sunroom_dspy.Submitted({{{1}}})\\n".format(
                    ", ".join(fields), ", ".join(f"{n!r}: {n}" for n in fields))
            else:
                src = ("def SUBMIT(output):\\n"
                       "    raise _sunroom_dspy.Submitted({'output': output})\\n")
            exec(src, ns)
        if tools is not None:
            for old in _sunroom_dspy.tools:
                if ns.get(old) is _sunroom_dspy.tools[old]:
                    del ns[old]
            _sunroom_dspy.tools = {}
            for name, doc in tools:
                def tool(*args, _name=name, **kwargs):
                    return sunroom_dspy.call(_name, list(args), kwargs)
                tool.__name__ = tool.__qualname__ = name
                tool.__doc__ = doc
                ns[name] = _sunroom_dspy.tools[name] = tool

    tools = {}

    @staticmethod
    def run(code, bindings, fields, tools):
        ns = globals()
        _sunroom_dspy.configure(fields, tools)
        for key in [k for k in ns if k.startswith("sunroom_dspy_value_")]:
            _sunroom_dspy.store[key[len("sunroom_dspy_value_"):]] = ns.pop(key)
        for name, key in bindings.items():
            value = _sunroom_dspy.store[key]
            ns[name] = value if isinstance(value, (str, bytes, int, float, bool, type(None))) \\
                else _sunroom_dspy._copy.deepcopy(value)
        try:
            tree = _sunroom_dspy._ast.parse(code, "<dspy>", "exec")
        except SyntaxError as exc:
            sunroom_dspy.report({"kind": "syntax", "error": f"{exc.msg} (line {exc.lineno})"})
            return
        last = None
        if tree.body and isinstance(tree.body[-1], _sunroom_dspy._ast.Expr):
            last = _sunroom_dspy._ast.Expression(tree.body.pop().value)
        try:
            exec(compile(tree, "<dspy>", "exec"), ns)
            value = eval(compile(last, "<dspy>", "eval"), ns) if last is not None else None
        except _sunroom_dspy.Submitted as done:
            sunroom_dspy.report({"kind": "final", "value": _sunroom_dspy.jsonable(done.args[0])})
            return
        except BaseException as exc:
            sunroom_dspy.report({"kind": "error", "error": f"{type(exc).__name__}: {exc}"})
            return
        sunroom_dspy.report({"kind": "value", "value": _sunroom_dspy.jsonable(value)})
'''


def _jsonable(value: Any) -> Any:
    """A tool's result as msgpack-friendly plain data (pydantic models, dataclasses...)."""
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    try:
        return to_jsonable_python(value)
    except PydanticSerializationError:
        return repr(value)


def _content_key(value: Any) -> str:
    """The content hash a variable is bound under (CodeInterpreterError if not plain data)."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(value, str):
        digest.update(b"s")
        digest.update(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, bytes):
        digest.update(b"b")
        digest.update(value)
    else:
        try:
            text = json.dumps(_plain(value), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CodeInterpreterError(f"Unsupported variable value: {exc}") from exc
        digest.update(b"j")
        digest.update(text.encode())
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    """*value* as the plain data the kernel receives: sets and tuples become lists."""
    if value is None or isinstance(value, str | int | bool | bytes):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CodeInterpreterError(f"Unsupported variable value: {value!r}")
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        items = [_plain(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    try:
        return _plain(to_jsonable_python(value))
    except PydanticSerializationError:
        raise CodeInterpreterError(
            f"Unsupported variable value of type {type(value).__name__}"
        ) from None


def _check_name(name: object, what: str) -> str:
    if (
        not isinstance(name, str)
        or not name.isidentifier()
        or keyword.iskeyword(name)
        or name in RESERVED
        or name.startswith(VALUE_PREFIX)
    ):
        raise CodeInterpreterError(f"Invalid {what} name: {name!r}")
    return name


class SunroomInterpreter:
    """DSPy's ``CodeInterpreter`` on one sunroom kernel (one session: shut it down when done).

    ``tools`` maps names to host callables (keyword or positional arguments, results
    JSON-like); ``output_fields`` (``[{"name": ..., "type": ...}]``, as DSPy passes them)
    gives ``SUBMIT`` its parameters, else ``SUBMIT(output)``. Both may be changed between
    executions (``dspy.RLM`` does); the next ``execute`` sends the change. ``backend``,
    ``limits`` and ``env`` are those of :class:`sunroom.Kernel`.

    Not thread-safe: one execution at a time, like DSPy's own interpreters.
    """

    execution_instructions: ClassVar[str] = (
        "Code runs as CPython in a persistent, isolated sunroom kernel. State, imports and "
        "functions persist across executions. Host tools and SUBMIT are global functions; "
        "the Python standard library is available, the host's files and network are not."
    )

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        *,
        backend: str = "bwrap",
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields: list[dict[str, Any]] | None = output_fields
        self._backend = backend
        self._limits = limits
        self._env = dict(env or {})
        self._kernel: Kernel | None = None
        self._ended = False
        self._restarts = 0
        self._lock = threading.Lock()
        self._context: contextvars.Context | None = None
        self._outcome: dict[str, Any] | None = None
        #: content key -> True for values the kernel holds
        self._sent: set[str] = set()
        #: variable name -> (the object last passed, its content key): identity skips hashing
        self._known: dict[str, tuple[object, str]] = {}
        self._sent_fields: object = object()  # nothing sent yet
        self._sent_tools: tuple[tuple[str, str], ...] | None = None

    # -- the bridge the kernel calls --------------------------------------------------------

    def _bridge(self) -> list[HostFunction]:
        def call(name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
            """Call the DSPy tool *name* on the host."""
            fn = self.tools.get(name)
            if fn is None:
                raise NameError(f"no tool named {name!r}")
            context = self._context.copy() if self._context is not None else None

            def invoke() -> Any:
                positional, named = _by_name(fn, args, kwargs)
                result = fn(*positional, **named)
                if inspect.isawaitable(result):
                    return asyncio.run(_awaited(result))
                return result

            return _jsonable(context.run(invoke) if context is not None else invoke())

        def report(outcome: dict[str, Any]) -> None:
            """Receive the outcome of the current execution."""
            self._outcome = outcome

        return [
            host_function(call, name=f"{BRIDGE}.call"),
            host_function(report, name=f"{BRIDGE}.report", inline=True),
        ]

    # -- the protocol -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the kernel (idempotent); CodeInterpreterError after shutdown or a death."""
        if self._ended:
            raise CodeInterpreterError(
                "This SunroomInterpreter was shut down; create a new one for a fresh session."
            )
        if self._kernel is not None:
            self._check_alive()
            return
        try:
            kernel = Kernel(
                backend=self._backend, functions=self._bridge(), limits=self._limits, env=self._env
            )
        except SunroomError as exc:
            raise CodeInterpreterError(f"The sunroom kernel could not be set up: {exc}") from exc
        try:
            kernel.start()
        except SunroomError as exc:
            kernel.close()
            raise CodeInterpreterError(f"The sunroom kernel did not start: {exc}") from exc
        self._kernel = kernel
        self._restarts = kernel.restarts
        result = kernel.execute(_KERNEL_SETUP, filename="<sunroom-dspy>")
        if not result.ok:
            self._fail(f"The interpreter's kernel setup failed: {_describe(result)}")

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """Run *code* with *variables* bound; see the module docstring for what it returns."""
        if not isinstance(code, str):
            raise CodeInterpreterError("code must be a string")
        if not self._lock.acquire(blocking=False):
            raise CodeInterpreterError("This SunroomInterpreter already has an execution running.")
        try:
            return self._execute(code, dict(variables or {}))
        finally:
            self._lock.release()

    def shutdown(self) -> None:
        """Close the kernel and end the session (idempotent)."""
        self._ended = True
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            kernel.close()

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """The same as :meth:`execute` (DSPy's interpreters are callable)."""
        return self.execute(code, variables)

    def __enter__(self) -> SunroomInterpreter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- internals --------------------------------------------------------------------------

    @property
    def kernel(self) -> Kernel | None:
        """The sunroom kernel underneath (None before start and after shutdown)."""
        return self._kernel

    def _execute(self, code: str, variables: dict[str, Any]) -> Any:
        for name in variables:
            _check_name(name, "variable")
        clash = sorted(set(variables) & set(self.tools))
        if clash:
            raise CodeInterpreterError(f"Variables would replace the tools {clash}")
        self.start()
        kernel = self._kernel
        assert kernel is not None
        bindings, new_values = self._plan_bindings(variables)
        if new_values:
            try:
                kernel.bind(**new_values)
            except SunroomError as exc:
                self._check_alive()
                raise CodeInterpreterError(f"Binding the variables failed: {exc}") from exc
            self._sent.update(k[len(VALUE_PREFIX) :] for k in new_values)
        fields, tools = self._configuration()
        cell = f"_sunroom_dspy.run({code!r}, {bindings!r}, {fields!r}, {tools!r})"
        self._outcome = None
        self._context = contextvars.copy_context()
        try:
            result = kernel.execute(cell, filename="<dspy>")
        finally:
            self._context = None
        if result.status == "died" or result.state_lost or not kernel.running:
            self._fail(f"The sunroom kernel died; its state is lost: {_describe(result)}")
        self._sent_fields, self._sent_tools = self._wanted_fields(), self._wanted_tools()
        outcome = self._take_outcome()
        if outcome is None:
            if result.status == "timeout":
                raise CodeExecutionError(f"TimeoutError: {_describe(result)}")
            self._fail(f"The kernel ran the code but reported no outcome: {_describe(result)}")
        kind = outcome.get("kind")
        if kind == "syntax":
            raise SyntaxError(f"Invalid Python syntax. message: {outcome.get('error')}")
        if kind == "error":
            raise CodeExecutionError(str(outcome.get("error")))
        if kind == "final":
            return FinalOutput(outcome.get("value"))
        value = outcome.get("value")
        if value is not None:
            return value
        return result.stdout.rstrip("\n") or None

    def _take_outcome(self) -> dict[str, Any] | None:
        """What the kernel reported for the execution that just ended (None: nothing)."""
        outcome, self._outcome = self._outcome, None
        return outcome

    def _plan_bindings(self, variables: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        """Each variable's content key, and the values the kernel does not hold yet."""
        bindings: dict[str, str] = {}
        new_values: dict[str, Any] = {}
        for name, value in variables.items():
            known = self._known.get(name)
            if known is not None and known[0] is value and isinstance(value, IMMUTABLE):
                key = known[1]
            else:
                key = _content_key(value)
                self._known[name] = (value, key)
            bindings[name] = key
            if key not in self._sent:
                new_values[VALUE_PREFIX + key] = (
                    value if isinstance(value, IMMUTABLE) else _plain(value)
                )
        return bindings, new_values

    def _wanted_fields(self) -> list[str]:
        return [_check_name(f.get("name"), "output field") for f in self.output_fields or []]

    def _wanted_tools(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (_check_name(name, "tool"), inspect.getdoc(fn) or "") for name, fn in self.tools.items()
        )

    def _configuration(self) -> tuple[list[str] | None, list[tuple[str, str]] | None]:
        """SUBMIT's fields and the tools, each only when changed since last sent (else None)."""
        fields, tools = self._wanted_fields(), self._wanted_tools()
        return (
            None if fields == self._sent_fields else fields,
            None if tools == self._sent_tools else list(tools),
        )

    def _check_alive(self) -> None:
        kernel = self._kernel
        if kernel is None or not kernel.running or kernel.restarts != self._restarts:
            self._fail("The sunroom kernel is no longer running; its state is lost.")

    def _fail(self, message: str) -> NoReturn:
        """End the session for good and raise CodeInterpreterError (never a silent restart)."""
        self.shutdown()
        separator = " " if message.endswith(".") else ". "
        raise CodeInterpreterError(
            f"{message}{separator}Create a new interpreter for a fresh session."
        )


def _by_name(
    fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments passed by their parameter's name where the signature allows.

    DSPy's own interpreters call every tool with keywords (``dspy.RLM`` wraps tools in a
    ``**kwargs`` function carrying the tool's signature), so ``tool(x)`` must arrive as
    ``tool(name=x)``. A signature that cannot be read or bound leaves the call as written.
    """
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return list(args), dict(kwargs)
    positional: list[Any] = []
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            positional.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return positional, named


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _describe(result: ExecutionResult) -> str:
    if result.error is not None:
        return f"{result.error.type}: {result.error.message}".strip()
    return result.status
