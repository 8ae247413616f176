"""Host functions: typed Python callables the kernel can call.

:func:`host_function` wraps a sync or async callable with options; :class:`FunctionRegistry`
freezes a set of them for one kernel. From each signature the registry derives a pydantic model
of the arguments (validated on the host, authoritatively, before the function runs), a
``TypeAdapter`` for the return value and a JSON schema for prompts. The kernel never sends code:
a call is a name and a map of arguments, and the host never executes or unpickles anything.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import inspect
import keyword
import logging
import queue
import reprlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Literal, TypeAlias, final, get_type_hints, overload

import pydantic
from pydantic_core import PydanticSerializationError

from sunroom.errors import (
    ApprovalDenied,
    HostFunctionArgumentError,
    HostFunctionBudgetExceeded,
    HostFunctionBusy,
    HostFunctionError,
    HostFunctionNotFound,
    HostFunctionTimeout,
    UsageError,
)
from sunroom.rpc import schema, wire
from sunroom.rpc.eager import in_task
from sunroom.rpc.messages import RpcError

_log = logging.getLogger(__name__)

APPROVALS: Final = ("allow", "deny", "ask")
"""The approval policies a string may name (see :attr:`HostFunction.approval`)."""

ApprovalPolicy: TypeAlias = "Literal['allow', 'deny', 'ask'] | Callable[[Any], Any]"
"""``"allow"``, ``"deny"``, ``"ask"`` or a callable ``(call) -> decision`` (sync or async);
the agent layer decides with it (:mod:`sunroom.agent.approvals`)."""

Gate: TypeAlias = "Callable[[dict[str, Any]], Awaitable[None]]"
"""``async def gate(arguments)``: returns to let a call run, raises to refuse it."""

RESERVED: Final = frozenset({"call", "display"}) | frozenset(dir(builtins))
"""Names a host function may not take: prelude helpers and Python builtins."""

_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="sunroom-hostfn")

SLOW_INLINE_S: Final = 0.01
"""An inline function call longer than this is logged (it held the event loop that long)."""


@final
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class HostFunction:
    """A callable the kernel may call, with its options. Calling it calls the function.

    Attributes:
        fn: the function (sync or async). Async functions run on the event loop that serves
            the kernel, each call in its own task. Sync functions run on a worker thread: the
            kernel's own warm thread when it is free, else a shared pool of 64 threads.
        name: the name the kernel sees.
        description: the docstring the kernel and the prompt see.
        timeout_s: how long one call may run (None: no limit); past it the caller in the kernel
            gets ``HostFunctionTimeout``. A sync function's thread is not killed. An inline
            function cannot be stopped: a call that ran longer gets ``HostFunctionTimeout``
            instead of its result once it returns.
        max_concurrency: calls running at once per kernel (None: no limit); others wait for a
            slot, at most ``timeout_s`` (then ``HostFunctionBusy``), and a sync function is
            handed to its thread only once it holds one. Inline calls run one at a time on the
            event loop, so any limit holds for them already.
        budget: calls allowed per kernel lifetime (None: no limit).
        idempotent: the function has no side effects and may be retried; side-effecting
            functions (the default) are never retried by sunroom.
        inline: run a sync function directly on the event loop, without a thread: the fastest
            call (no thread hand-off), for functions that are quick (well under a millisecond)
            and never block (no I/O, no locks, no sleeping). While it runs, nothing else on
            that loop does (other kernels' cells and calls included). Sync functions only.
        parameters_schema / returns_schema: the JSON Schemas the kernel's wrapper is generated
            from, when the caller has them already (an MCP tool's); None derives them from the
            signature. They must describe the same parameters as the signature.
        approval: the function's own approval policy (``"allow"``, ``"deny"``, ``"ask"`` or a
            callable deciding per call), used by agent sessions when their ``approvals``
            mapping does not name the function (docs/approvals.md). None: allow. A kernel
            outside a session has nobody to ask: any policy but ``"allow"`` denies there.
        gate: run by the registry with the validated arguments before the call takes a
            concurrency slot or starts its timeout; raising refuses the call (the kernel gets
            the error). Agent sessions set it to enforce approvals; None: no gate.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    timeout_s: float | None = None
    max_concurrency: int | None = None
    budget: int | None = None
    idempotent: bool = False
    inline: bool = False
    parameters_schema: Mapping[str, object] | None = None
    returns_schema: Mapping[str, object] | None = None
    approval: ApprovalPolicy | None = None
    gate: Gate | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (on the host)."""
        return self.fn(*args, **kwargs)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The signature with annotations resolved."""
        sig = inspect.signature(self.fn)
        hints = get_type_hints(self.fn, include_extras=True)
        params = [
            p.replace(
                annotation=hints.get(p.name, Any if p.annotation is p.empty else p.annotation)
            )
            for p in sig.parameters.values()
        ]
        return sig.replace(parameters=params, return_annotation=hints.get("return", Any))

    @functools.cached_property
    def arguments_model(self) -> type[pydantic.BaseModel]:
        """A pydantic model whose fields are the parameters (validation of a call)."""
        fields: dict[str, Any] = {}
        for p in self.signature.parameters.values():
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (p.annotation, default)
        config = pydantic.ConfigDict(arbitrary_types_allowed=True, extra="forbid")
        return pydantic.create_model(f"{self.name}_arguments", __config__=config, **fields)

    @functools.cached_property
    def return_adapter(self) -> pydantic.TypeAdapter[Any]:
        """Validates and serialises the return value."""
        return pydantic.TypeAdapter(self.signature.return_annotation)

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether calling the function returns an awaitable."""
        return inspect.iscoroutinefunction(self.fn)

    def json_schema(self) -> dict[str, Any]:
        """A JSON schema of the arguments, with name and description, for a prompt or tool."""
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        return {"name": self.name, "description": self.description, "parameters": schema}


@overload
def host_function(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    budget: int | None = None,
    idempotent: bool = False,
    inline: bool = False,
    approval: ApprovalPolicy | None = None,
) -> HostFunction: ...


@overload
def host_function(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    budget: int | None = None,
    idempotent: bool = False,
    inline: bool = False,
    approval: ApprovalPolicy | None = None,
) -> Callable[[Callable[..., Any]], HostFunction]: ...


def host_function(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    budget: int | None = None,
    idempotent: bool = False,
    inline: bool = False,
    approval: ApprovalPolicy | None = None,
) -> HostFunction | Callable[[Callable[..., Any]], HostFunction]:
    """Declare a host function with options; usable as ``@host_function`` or with arguments.

    The options are those of :class:`HostFunction`. ``inline=True`` runs a sync function on the
    event loop itself (no thread): only for quick functions that never block; see
    :attr:`HostFunction.inline`.

    Raises UsageError for a reserved or invalid name, ``*args``/``**kwargs`` parameters,
    non-positive limits, ``inline=True`` on an async function, or an *approval* that is
    neither one of ``"allow"``, ``"deny"``, ``"ask"`` nor a callable.
    """

    def wrap(f: Callable[..., Any]) -> HostFunction:
        hf = HostFunction(
            fn=f,
            name=name or f.__name__,
            description=inspect.cleandoc(description or f.__doc__ or ""),
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            budget=budget,
            idempotent=idempotent,
            inline=inline,
            approval=approval,
        )
        _check(hf)
        return hf

    return wrap(fn) if fn is not None else wrap


def as_host_function(obj: Callable[..., Any] | HostFunction) -> HostFunction:
    """Return *obj* as a HostFunction (plain callables get the default options)."""
    if isinstance(obj, HostFunction):
        return obj
    if not callable(obj):
        raise UsageError(f"a host function must be callable, got {type(obj).__name__}")
    return host_function(obj)


def _check(hf: HostFunction) -> None:
    n = hf.name
    parts = n.split(".")
    if len(parts) > 2 or any(
        not p.isidentifier() or keyword.iskeyword(p) or p.startswith("_") for p in parts
    ):
        raise UsageError(
            f"host function name {n!r} must be a public Python identifier"
            " (or module.name, both public identifiers)"
        )
    if len(n) > schema.MAX_NAME:
        raise UsageError(f"host function name {n[:40]!r}... is longer than {schema.MAX_NAME}")
    if parts[0] in RESERVED:
        raise UsageError(
            f"host function name {parts[0]!r} is reserved (a builtin or prelude helper)"
        )
    for opt in ("timeout_s", "max_concurrency", "budget"):
        value = getattr(hf, opt)
        if value is not None and value <= 0:
            raise UsageError(f"{n}: {opt} must be positive, got {value!r}")
    if hf.approval is not None and hf.approval not in APPROVALS and not callable(hf.approval):
        raise UsageError(f"{n}: approval must be 'allow', 'deny', 'ask' or a callable")
    if hf.inline and hf.is_async:
        raise UsageError(f"{n}: inline=True is for sync functions (async ones run on the loop)")
    try:
        sig = hf.signature
    except (TypeError, ValueError, NameError) as exc:
        raise UsageError(f"{n}: cannot read its signature: {exc}") from exc
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UsageError(f"{n}: *args/**kwargs are not supported; name every parameter")
        if p.name.startswith("_"):
            raise UsageError(f"{n}: parameter {p.name!r} must not start with an underscore")
    try:
        hf.arguments_model  # noqa: B018 - build eagerly so bad annotations fail at registration
        hf.return_adapter  # noqa: B018
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise UsageError(f"{n}: its annotations are not supported: {exc}") from exc


def rpc_error(exc: BaseException) -> RpcError:
    """The error answer a kernel gets for a failed call: the type name and a message.

    sunroom's own refusals (:class:`~sunroom.errors.HostFunctionError` and its subclasses)
    travel under their class name, which the kernel maps to its mirror classes of the same
    names (``sunroom.prelude.hostcall``); an exception the function itself raised travels under
    its own type name (the kernel raises the builtin of that name when there is one). Host
    tracebacks never travel.
    """
    single_key = isinstance(exc, KeyError) and len(exc.args) == 1
    return RpcError(type(exc).__name__, str(exc.args[0]) if single_key else str(exc))


@dataclasses.dataclass(slots=True)
class _Usage:
    calls: int = 0
    semaphore: asyncio.Semaphore | None = None


@final
class FunctionRegistry:
    """The frozen set of host functions of one kernel, with per-kernel budgets and limits."""

    def __init__(
        self,
        functions: Iterable[Callable[..., Any] | HostFunction] = (),
        *,
        on_call: Callable[[str, float, BaseException | None], None] | None = None,
    ) -> None:
        table: dict[str, HostFunction] = {}
        for obj in functions:
            hf = as_host_function(obj)
            if hf.name in table:
                raise UsageError(f"two host functions are named {hf.name!r}")
            table[hf.name] = hf
        modules = {name.split(".")[0] for name in table if "." in name}
        if clash := sorted(modules & set(table)):
            raise UsageError(f"{clash[0]!r} names both a host function and a module of them")
        self._functions: Mapping[str, HostFunction] = table
        self._usage = {name: _Usage() for name in table}
        self._on_call = on_call
        self._thread = _WarmThread()

    def copy(self) -> FunctionRegistry:
        """The same functions and call hook with fresh per-kernel usage (for a kernel's copy)."""
        return FunctionRegistry(self._functions.values(), on_call=self._on_call)

    def close(self) -> None:
        """Let the warm thread go; a call running on it finishes, later ones use the pool."""
        self._thread.close()

    @property
    def functions(self) -> Mapping[str, HostFunction]:
        """Name → HostFunction (read-only)."""
        return self._functions

    def __len__(self) -> int:
        return len(self._functions)

    async def invoke(self, name: object, args: object) -> object:
        """Validate and run one call from the kernel; return the result as wire data.

        Raises HostFunctionNotFound, HostFunctionArgumentError, HostFunctionBudgetExceeded,
        HostFunctionTimeout, HostFunctionBusy (the concurrency limit's wait ran out),
        HostFunctionError (a result its annotation rejects), whatever the function's ``gate``
        raised (ApprovalDenied), or whatever the function itself raised. :func:`rpc_error`
        turns any of them into the kernel's error answer.
        """
        hf = self._functions.get(name) if isinstance(name, str) else None
        if hf is None:
            raise HostFunctionNotFound(f"no host function named {_quote(name)}")
        if not isinstance(args, dict):
            raise HostFunctionArgumentError(f"{name}(): arguments must be a map")
        usage = self._usage[hf.name]
        if hf.budget is not None and usage.calls >= hf.budget:
            raise HostFunctionBudgetExceeded(f"{name}(): call budget of {hf.budget} is spent")
        usage.calls += 1
        try:
            model = hf.arguments_model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise HostFunctionArgumentError(_explain(hf.name, exc)) from None
        kwargs = {k: getattr(model, k) for k in type(model).model_fields}
        if hf.gate is not None:
            await hf.gate(dict(kwargs))
        elif hf.approval is not None and hf.approval != "allow":  # fail closed: nobody to ask
            raise ApprovalDenied(
                f"{name}() needs approval and this kernel has no agent session to give it"
            )
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            result = await self._run(hf, usage, kwargs)
            try:
                adapter = hf.return_adapter
                checked = adapter.validate_python(result)
                return to_wire(adapter.dump_python(checked, mode="python", warnings=False))
            except (pydantic.ValidationError, PydanticSerializationError, TypeError) as exc:
                raise HostFunctionError(
                    f"{name}() returned a value its annotation rejects: {exc}"
                ) from None
        except Exception as exc:
            failure = exc
            raise
        finally:
            if self._on_call is not None:
                self._on_call(hf.name, time.perf_counter() - started, failure)

    async def _run(self, hf: HostFunction, usage: _Usage, kwargs: dict[str, object]) -> object:
        """Run the function within its timeout, after a free concurrency slot (if limited).

        The function starts only once it holds a slot: a sync function is handed to a thread
        then, never before. ``timeout_s`` bounds the wait for a slot and, separately, the run:
        a wait that runs out is HostFunctionBusy, a run that does is HostFunctionTimeout. An
        inline function runs here and now, on the loop (see :attr:`HostFunction.inline`).
        """
        if hf.inline:
            return _run_inline(hf, kwargs)
        started: asyncio.Future[object] | None = None
        if not hf.is_async and hf.max_concurrency is None:
            started = self._thread.start(hf.fn, kwargs)  # its thread runs it while a task is made
        try:
            await in_task()  # timeouts and the function's own coroutine need a task
        except BaseException:
            if started is not None:
                started.cancel()
            raise
        if hf.max_concurrency is not None and usage.semaphore is None:
            usage.semaphore = asyncio.Semaphore(hf.max_concurrency)
        sem = usage.semaphore
        if sem is not None:
            try:
                async with asyncio.timeout(hf.timeout_s):
                    await sem.acquire()
            except TimeoutError:
                raise HostFunctionBusy(
                    f"{hf.name}(): {hf.max_concurrency} calls were running and none finished "
                    f"within {hf.timeout_s} s"
                ) from None
        try:
            call: Awaitable[object]
            if hf.is_async:
                call = hf.fn(**kwargs)
            else:  # started already, or (with a limit) now that it holds a slot
                call = started if started is not None else self._thread.start(hf.fn, kwargs)
            if hf.timeout_s is None:
                return await call  # (asyncio.timeout(None) costs a Timeout and a task lookup)
            async with asyncio.timeout(hf.timeout_s):
                return await call
        except TimeoutError:
            raise HostFunctionTimeout(
                f"{hf.name}() did not finish within {hf.timeout_s} s"
            ) from None
        finally:
            if sem is not None:
                sem.release()


def _run_inline(hf: HostFunction, kwargs: dict[str, object]) -> object:
    """Call a sync function on the event loop; past its timeout the result is not returned."""
    started = time.perf_counter()
    result = hf.fn(**kwargs)
    took = time.perf_counter() - started
    if took > SLOW_INLINE_S:
        _log.warning("inline host function %s() held the event loop for %.3f s", hf.name, took)
    if hf.timeout_s is not None and took > hf.timeout_s:
        raise HostFunctionTimeout(f"{hf.name}() did not finish within {hf.timeout_s} s")
    return result


@final
class _WarmThread:
    """A thread kept waiting for one kernel's sync calls: no pool hop when it is free.

    A call that arrives while it is busy (a slow call, calls at once, a call past its timeout
    still running) goes to the shared pool instead, so calls never queue behind one another.
    The thread ends after ``IDLE_S`` without work and starts again on the next call.
    """

    IDLE_S: Final = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._busy = False  # a job is queued or running
        self._alive = False
        self._closed = False

    def start(self, fn: Callable[..., object], kwargs: dict[str, object]) -> asyncio.Future[object]:
        """Start ``fn(**kwargs)`` now, on the warm thread (or the pool); the future of its result.

        Cancelling the future does not stop the call; its result is then dropped.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._busy and not self._closed:
                fut: asyncio.Future[object] = loop.create_future()
                self._busy = True
                self._jobs.put((loop, fut, fn, kwargs))
                if not self._alive:
                    self._alive = True
                    threading.Thread(
                        target=self._serve, name="sunroom-hostfn-warm", daemon=True
                    ).start()
                return fut
        return loop.run_in_executor(_EXECUTOR, functools.partial(fn, **kwargs))

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if not self._busy:
                        self._alive = False
                        return
                continue
            if job is None:  # closed
                return
            loop, fut, fn, kwargs = job
            del job
            value: object = None
            error: BaseException | None = None
            try:
                value = fn(**kwargs)
            except BaseException as exc:  # noqa: BLE001 - the caller gets it, as from the pool
                error = exc
            with self._lock:
                self._busy = False  # free before the loop hears of it: the next call may come
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, fut, value, error)
            del fut, fn, kwargs, value, error

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._alive:
                self._jobs.put(None)


_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[object]", Callable[..., object], dict[str, object]
]


def _settle(fut: asyncio.Future[object], value: object, error: BaseException | None) -> None:
    if fut.done():  # the caller gave up (timeout, cancel)
        return
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(error)


MAX_ECHO: Final = 60
"""Most characters of a kernel-supplied value (a name, an argument) quoted in an error."""

MAX_ERROR_LINES: Final = 20
"""Most invalid fields listed in one HostFunctionArgumentError."""


_ECHO = reprlib.Repr()
_ECHO.maxstring = _ECHO.maxother = MAX_ECHO
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxdict = 3, 8, 8


def _quote(value: object) -> str:
    """A repr of *value* of at most MAX_ECHO characters, whatever its size (bounded work).

    Error texts never echo huge kernel-supplied data.
    """
    text = _ECHO.repr(value)
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 3] + "..."


def _explain(name: str, exc: pydantic.ValidationError) -> str:
    errors = exc.errors(include_url=False)
    lines = [f"{name}(): invalid arguments:"]
    for err in errors[:MAX_ERROR_LINES]:
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        if len(where) > MAX_ECHO:
            where = where[: MAX_ECHO - 3] + "..."
        lines.append(f"  {where}: {err['msg'][:200]} (got {_quote(err.get('input'))})")
    if len(errors) > MAX_ERROR_LINES:
        lines.append(f"  ... and {len(errors) - MAX_ERROR_LINES} more")
    return "\n".join(lines)


def _pydantic_to_data(value: object) -> object:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="python")
    return NotImplemented


def to_wire(value: object) -> object:
    """Turn host values (pydantic models included) into msgpack-safe data.

    Raises TypeError for values that have no wire form.
    """
    return wire.to_wire(value, _pydantic_to_data)
