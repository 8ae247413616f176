"""Running one cell in the kernel's persistent namespace.

A cell is compiled with top-level ``await`` allowed; when its last statement is an expression,
that expression's value is shown as a REPL shows it (``repr``, ``None`` shows nothing) and stored
in ``_``; a rich value (a repr method beyond ``text/plain``, or a mime type from a display
formatter) is also a display item, marked ``metadata["sunroom"]["execute_result"] = True`` as
Jupyter's ``execute_result`` is told from ``display_data`` (:func:`display.show_result`).
Every ``BaseException`` is caught and returned as data: type, message and a traceback trimmed
to the user's own frames, with the failing source line (SyntaxError with its caret).
"""

from __future__ import annotations

import _ast
import os
import types

from sunroom.prelude import display, sources

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import asyncio
    from typing import Final

MAX_REPR: Final = 20_000
CO_COROUTINE: Final = 0x80  # inspect.CO_COROUTINE, without importing inspect
_PRELUDE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
_CELL_FILES: set[str] = set()
"""The names cells were run under that are not ``<cell-N>`` (a traceback starts at one)."""


class CellOutcome:
    """What running a cell produced (output is captured separately)."""

    __slots__ = ("error", "value")

    def __init__(self, value: str | None = None, error: dict[str, str] | None = None) -> None:
        self.value = value
        self.error = error


class Executor:
    """Compiles and runs cells in one namespace; owns the kernel's asyncio loop."""

    def __init__(self, namespace: dict[str, object]) -> None:
        self.namespace = namespace
        self._count = 0
        # created on the first top-level await (asyncio is slow to import)
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, code: str, filename: str | None = None) -> CellOutcome:
        """Run *code*; never raises for anything the cell does (BaseException included).

        *filename* is the name tracebacks and SyntaxErrors give the code (``sunroom exec`` passes
        the file it runs); by default ``<cell-N>``, N counting this kernel's cells from 1.
        """
        self._count += 1
        if filename is None:
            filename = f"<cell-{self._count}>"
        else:
            _CELL_FILES.add(filename)
        sources.remember(filename, code)
        try:
            body, last = self._compile(code, filename)
        except BaseException as exc:  # SyntaxError, ValueError (null bytes), RecursionError
            return CellOutcome(error=_describe(exc, syntax=True))
        try:
            self._eval(body)
            if last is None:
                return CellOutcome()
            result = self._eval(last)
        except BaseException as exc:
            return CellOutcome(error=_describe(exc))
        if result is None:
            return CellOutcome()
        self.namespace["_"] = result
        try:
            display.show_result(result)  # a DataFrame, an image ...: as Jupyter shows it
        except BaseException as exc:  # an interrupt while a repr hangs: the cell's timeout
            return CellOutcome(error=_describe(exc))
        return CellOutcome(value=_safe_repr(result))

    def warm(self) -> None:
        """Run a throwaway cell ``1`` in a namespace of its own, as :meth:`run` would.

        No count, no source kept, nothing shown (a plain value adds no display item, and the
        runtime's warm-up discards the list anyway): a fork's copy warms up so.
        """
        body, last = self._compile("1", "<warm-up>")
        scratch: dict[str, object] = {"__builtins__": __builtins__}
        eval(body, scratch)  # noqa: S307 - a constant cell
        if last is not None:
            result = eval(last, scratch)  # noqa: S307 - a constant cell
            display.show_result(result)
            _safe_repr(result)

    def _compile(self, code: str, filename: str) -> tuple[types.CodeType, types.CodeType | None]:
        flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = compile(code, filename, "exec", flags | _ast.PyCF_ONLY_AST, dont_inherit=True)
        assert isinstance(tree, _ast.Module)
        last: types.CodeType | None = None
        tail = tree.body[-1] if tree.body else None
        if isinstance(tail, _ast.Expr):
            tree.body.pop()
            expr = _ast.Expression(tail.value)
            last = compile(expr, filename, "eval", flags, dont_inherit=True)
        body = compile(tree, filename, "exec", flags, dont_inherit=True)
        return body, last

    def _eval(self, code: types.CodeType) -> object:
        result = eval(code, self.namespace)  # noqa: S307 - running model code is the point
        if code.co_flags & CO_COROUTINE:
            if self._loop is None:
                import asyncio

                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except BaseException as exc:
        return f"<repr failed: {type(exc).__name__}: {exc}>"
    if len(text) > MAX_REPR:
        cut = len(text) - MAX_REPR
        text = text[: MAX_REPR // 2] + f" ...[{cut} chars]... " + text[-MAX_REPR // 2 :]
    return text


def _is_internal(filename: str) -> bool:
    return filename.startswith((_PRELUDE_DIR, "<frozen ", "<sunroom-functions>"))


def _is_cell(filename: str) -> bool:
    return filename.startswith("<cell-") or filename in _CELL_FILES


def _trim(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop the runtime's own frames before the first cell frame and after the last user one."""
    first = tb
    while first is not None and not _is_cell(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    if first is None:
        return tb
    frames: list[types.TracebackType] = []
    node: types.TracebackType | None = first
    while node is not None:
        frames.append(node)
        node = node.tb_next
    while len(frames) > 1 and _is_internal(frames[-1].tb_frame.f_code.co_filename):
        frames.pop()
    frames[-1].tb_next = None
    return first


def describe(exc: BaseException) -> dict[str, str]:
    """*exc* as the error of a cell (type, message, trimmed traceback)."""
    return _describe(exc)


def _describe(exc: BaseException, *, syntax: bool = False) -> dict[str, str]:
    import traceback  # only on the error path: it costs the kernel's start ~7 ms

    sources.publish()
    if syntax and isinstance(exc, SyntaxError):
        tb_text = "".join(traceback.format_exception_only(type(exc), exc))
    else:
        trimmed = _trim(exc.__traceback__)
        try:
            tb_text = "".join(traceback.format_exception(type(exc), exc, trimmed))
        except BaseException:
            tb_text = f"{type(exc).__name__}: <traceback unavailable>"
    try:
        message = str(exc)
    except BaseException:
        message = "<str() failed>"
    return {"type": type(exc).__name__, "message": message, "traceback": tb_text}
