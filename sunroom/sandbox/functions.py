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
import dataclasses
import functools
import inspect
import keyword
import reprlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, final, get_type_hints

import pydantic
from pydantic_core import PydanticSerializationError

from sunroom.errors import (
    HostFunctionArgumentError,
    HostFunctionBudgetExceeded,
    HostFunctionBusy,
    HostFunctionError,
    HostFunctionNotFound,
    HostFunctionTimeout,
    UsageError,
)
from sunroom.rpc import schema, wire
from sunroom.rpc.messages import RpcError

RESERVED: Final = frozenset({"call", "display"}) | frozenset(dir(builtins))
"""Names a host function may not take: prelude helpers and Python builtins."""

_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="sunroom-hostfn")


@final
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class HostFunction:
    """A callable the kernel may call, with its options. Calling it calls the function.

    Attributes:
        fn: the function (sync or async). Sync functions run in a worker thread.
        name: the name the kernel sees.
        description: the docstring the kernel and the prompt see.
        timeout_s: how long one call may run (None: no limit); past it the caller in the kernel
            gets ``HostFunctionTimeout``. A sync function's thread is not killed.
        max_concurrency: calls running at once per kernel (None: no limit); others wait.
        budget: calls allowed per kernel lifetime (None: no limit).
        idempotent: the function has no side effects and may be retried; side-effecting
            functions (the default) are never retried by sunroom.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    timeout_s: float | None = None
    max_concurrency: int | None = None
    budget: int | None = None
    idempotent: bool = False

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


def host_function(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    budget: int | None = None,
    idempotent: bool = False,
) -> Any:
    """Declare a host function with options; usable as ``@host_function`` or with arguments.

    Raises UsageError for a reserved or invalid name, ``*args``/``**kwargs`` parameters, or
    non-positive limits.
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
    result: HostFunction = host_function(obj)
    return result


def _check(hf: HostFunction) -> None:
    n = hf.name
    if not n.isidentifier() or keyword.iskeyword(n) or n.startswith("_"):
        raise UsageError(f"host function name {n!r} must be a public Python identifier")
    if len(n) > schema.MAX_NAME:
        raise UsageError(f"host function name {n[:40]!r}... is longer than {schema.MAX_NAME}")
    if n in RESERVED:
        raise UsageError(f"host function name {n!r} is reserved (a builtin or prelude helper)")
    for opt in ("timeout_s", "max_concurrency", "budget"):
        value = getattr(hf, opt)
        if value is not None and value <= 0:
            raise UsageError(f"{n}: {opt} must be positive, got {value!r}")
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
        self._functions: Mapping[str, HostFunction] = table
        self._usage = {name: _Usage() for name in table}
        self._on_call = on_call

    @property
    def functions(self) -> Mapping[str, HostFunction]:
        """Name → HostFunction (read-only)."""
        return self._functions

    def __len__(self) -> int:
        return len(self._functions)

    async def invoke(self, name: Any, args: Any) -> Any:
        """Validate and run one call from the kernel; return the result as wire data.

        Raises HostFunctionNotFound, HostFunctionArgumentError, HostFunctionBudgetExceeded,
        HostFunctionTimeout, HostFunctionBusy (the concurrency limit's wait ran out),
        HostFunctionError (a result its annotation rejects), or whatever the function itself
        raised. :func:`rpc_error` turns any of them into the kernel's error answer.
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

    async def _run(self, hf: HostFunction, usage: _Usage, kwargs: dict[str, Any]) -> Any:
        """Run the function within its timeout, after a free concurrency slot (if limited).

        The function starts only once it holds a slot: a sync function is handed to a thread
        then, never before. ``timeout_s`` bounds the wait for a slot and, separately, the run:
        a wait that runs out is HostFunctionBusy, a run that does is HostFunctionTimeout.
        """
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
            call: Awaitable[Any]
            if hf.is_async:
                call = hf.fn(**kwargs)
            else:
                loop = asyncio.get_running_loop()
                call = loop.run_in_executor(_EXECUTOR, functools.partial(hf.fn, **kwargs))
            async with asyncio.timeout(hf.timeout_s):
                return await call
        except TimeoutError:
            raise HostFunctionTimeout(
                f"{hf.name}() did not finish within {hf.timeout_s} s"
            ) from None
        finally:
            if sem is not None:
                sem.release()


MAX_ECHO: Final = 60
"""Most characters of a kernel-supplied value (a name, an argument) quoted in an error."""

MAX_ERROR_LINES: Final = 20
"""Most invalid fields listed in one HostFunctionArgumentError."""


_ECHO = reprlib.Repr()
_ECHO.maxstring = _ECHO.maxother = MAX_ECHO
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxdict = 3, 8, 8


def _quote(value: Any) -> str:
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


def _pydantic_to_data(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="python")
    return NotImplemented


def to_wire(value: Any) -> Any:
    """Turn host values (pydantic models included) into msgpack-safe data.

    Raises TypeError for values that have no wire form.
    """
    return wire.to_wire(value, _pydantic_to_data)
