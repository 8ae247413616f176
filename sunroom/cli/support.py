"""What the ``sunroom`` commands share: one-line failures, the store, a session manager.

Every error is one line on stderr (``sunroom: ...``, exit 2) that never shows a secret.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import pydantic
import typer

from sunroom.errors import AuthenticationError, SunroomError

T = TypeVar("T")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="The store: a SQLite path or a postgresql:// URL (default: $SUNROOM_DB, else a "
        "SQLite file under ~/.local/state).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
InlineImagesOption = Annotated[
    str,
    typer.Option(
        help="Show displayed images in the terminal: auto (kitty, Ghostty, iTerm2, WezTerm; "
        "not inside tmux/screen), kitty, iterm or off. Never when the output is not a terminal."
    ),
]
KernelNameOption = Annotated[
    str | None,
    typer.Option(
        help="With --backend jupyter: the installed kernelspec to run (sunroom kernelspecs "
        "lists them). [default: python3]"
    ),
]
SandboxOption = Annotated[
    str | None,
    typer.Option(
        help="With --backend jupyter: where the kernel runs, bwrap, docker or none. "
        "[default: bwrap]"
    ),
]
FunctionsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--functions",
        metavar="MODULE:ATTR",
        help="Host functions the code may call: ATTR of MODULE is a host_function, a callable "
        "or a list of them (repeatable or comma-separated; modules in the current directory "
        "are found; default: SUNROOM_FUNCTIONS).",
    ),
]


def function_specs(values: list[str] | None) -> tuple[str, ...] | None:
    """The ``MODULE:ATTR`` specs of ``--functions`` (None when none is given)."""
    specs = tuple(s.strip() for v in values or () for s in v.split(",") if s.strip())
    return specs or None


def importable_here() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does.

    Called before host functions are imported (``--functions``, ``SUNROOM_FUNCTIONS``), so that
    a module of the user's project is found without ``PYTHONPATH=.``; a console script's
    ``sys.path`` starts with its own bin directory instead.
    """
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def fail(message: str) -> typer.Exit:
    """Print ``sunroom: <message>`` (one line) on stderr; the Exit(2) to raise."""
    typer.echo(f"sunroom: {message}", err=True)
    return typer.Exit(2)


def one_line(exc: BaseException) -> str:
    """One line for an error the user must act on: no traceback, no class name, no input value.

    A missing API key says how to give one here (the variable; ``--model`` for a model that
    needs none), not the Python API's ``api_key=``.
    """
    if isinstance(exc, AuthenticationError) and exc.key_env:
        return (
            f"no API key for {exc.provider}: set {exc.key_env} in the environment, or choose "
            "another model with --model or SUNROOM_MODEL (openai-compatible: and scripted: "
            "models need no key)"
        )
    if isinstance(exc, pydantic.ValidationError):
        from sunroom.service.problems import validation_message

        return validation_message(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror[:1].lower()}{exc.strerror[1:]}{where}"
    return str(exc)


def guarded(work: Callable[[], Coroutine[object, object, T]]) -> T:
    """Run *work* on a fresh loop; sunroom, config and OS errors exit 2 with one line."""
    try:
        return asyncio.run(work())
    except (SunroomError, pydantic.ValidationError, OSError) as exc:
        raise fail(one_line(exc)) from None


def interrupted_exit(sid: str, db: str | None) -> typer.Exit:
    """Say what became of session *sid* after Ctrl-C, and how to resume it; Exit(130).

    A run in progress stays ``running`` in the store (released: it can be resumed at once).
    """
    try:
        record = guarded(lambda: with_store(db, lambda s: s.get_session(sid)))
    except KeyboardInterrupt:
        record = None
    if record is None:
        message = "interrupted before the session was recorded"
    elif record.status == "running":
        where = f" --db {shlex.quote(str(db))}" if db is not None else ""
        message = (
            f"interrupted; session {sid} is kept, resume it with: "
            f"sunroom sessions resume {sid}{where}"
        )
    else:
        message = f"interrupted; session {sid} ended {record.status}"
    typer.echo(f"sunroom: {message}", err=True)
    return typer.Exit(130)


def finish_run(
    sid: str,
    db: str | None,
    work: Callable[[], Coroutine[object, object, dict[str, Any] | None]],
    *,
    as_json: bool,
) -> NoReturn:
    """Follow session *sid* with *work* (its result), then exit: 0 on success, else 1.

    With *as_json* the run's summary (:func:`run_summary`) is printed; Ctrl-C exits as
    :func:`interrupted_exit` says.
    """
    try:
        result = guarded(work)
    except KeyboardInterrupt:
        raise interrupted_exit(sid, db) from None
    summary = run_summary(sid, result)
    if as_json:
        typer.echo(json.dumps(summary))
    raise typer.Exit(0 if summary["status"] == "success" else 1)


def run_summary(sid: str, result: dict[str, Any] | None) -> dict[str, Any]:
    """What ``run`` and ``sessions resume`` print for a run's *result* (``--json``)."""
    r = result or {}
    return {
        "status": r.get("status", "cancelled"),
        "output": r.get("output"),
        "usage": r.get("usage"),
        "cost_micro_usd": r.get("cost_micro_usd"),
        "session_id": sid,
    }


class open_manager:
    """``async with open_manager(db) as m``: a store and a session manager for this command.

    *base_url* (``run --base-url``) is the operator's own choice, as ``SUNROOM_BASE_URL`` is:
    the manager's default and allowed base URL, not a client's request the service's
    allowlist must vet. *functions* (``--functions``) replace ``SUNROOM_FUNCTIONS``; either
    is imported with the current directory importable (:func:`importable_here`). Entering
    raises UsageError for host functions that cannot be loaded.
    """

    def __init__(
        self,
        db: str | None,
        *,
        base_url: str | None = None,
        functions: tuple[str, ...] | None = None,
    ) -> None:
        self._db = db
        self._base_url = base_url
        self._functions = functions

    async def __aenter__(self) -> Any:
        from sunroom.service import ServiceConfig, SessionManager, load_functions, resolve_model

        # the person at this terminal is the operator: a session may name its own hosts
        config = ServiceConfig.from_env(
            db=self._db, resume_orphans=False, client_network=True, base_url=self._base_url,
            functions=self._functions,
        )  # fmt: skip
        importable_here()
        functions = load_functions(config.functions)  # before the store: nothing to undo
        self._store = config.new_store()
        await self._store.__aenter__()
        try:
            self._m = SessionManager(
                self._store, config=config, resolve_model=resolve_model, functions=functions
            )
            await self._m.start()
        except BaseException:
            await self._store.aclose()
            raise
        return self._m

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._m.aclose()
        finally:
            await self._store.aclose()


async def with_store(db: str | None, job: Callable[[Any], Awaitable[T]]) -> T:
    """``await job(store)`` with the store of *db* (or the configured one) open."""
    from sunroom.service import ServiceConfig

    config = ServiceConfig.from_env(db=db)
    async with config.new_store() as store:
        return await job(store)


def read_json(path: Path, *, what: str) -> Any:
    """The JSON value in the file *path* (*what* names it in errors); exits 2 with one line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read {what} {path}: {one_line(exc)}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise fail(f"{what} {path} is not JSON: {one_line(exc)}") from None


def read_text(path: str, *, what: str) -> str:
    """The UTF-8 text at *path* (``-``: stdin); exits 2 with one line when it is not text."""
    name = "stdin" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise fail(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(
            f"{name} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): {what}"
        ) from None
