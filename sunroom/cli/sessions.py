"""``sunroom sessions list|show|export|resume|purge``: the sessions in the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from sunroom.cli.helptext import Command, Group
from sunroom.cli.options import inline_protocol
from sunroom.cli.support import (
    DbOption,
    FunctionsOption,
    InlineImagesOption,
    JsonOption,
    fail,
    finish_run,
    function_specs,
    guarded,
    open_manager,
    with_store,
)
from sunroom.errors import UsageError

sessions_app = typer.Typer(
    help="List, show, export, resume and purge stored sessions.", no_args_is_help=True, cls=Group
)


@sessions_app.command("list", cls=Command)
def sessions_list(
    status: Annotated[str | None, typer.Option(help="Only sessions with this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List stored sessions, newest first."""
    records = guarded(lambda: with_store(db, lambda s: s.list_sessions(status=status, limit=limit)))
    if as_json:
        typer.echo(json.dumps([_record(r) for r in records]))
        return
    table = Table("status", "model", "created", "result")
    table.columns.insert(0, Column("session", no_wrap=True, min_width=32))
    import datetime

    for r in records:
        created = datetime.datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S")
        outcome = (r.result or {}).get("status", "")
        table.add_row(r.session_id, r.status, str(r.config.get("model")), created, str(outcome))
    Console().print(table)


def _record(r: Any) -> dict[str, Any]:
    return {
        "session_id": r.session_id, "status": r.status, "config": r.config, "result": r.result,
        "created_at": r.created_at, "finished_at": r.finished_at, "owner": r.owner,
    }  # fmt: skip


def _session_and_events(db: str | None, session_id: str) -> tuple[Any, list[Any]]:
    """The stored record of *session_id* and its events; exits 2 when there is no such session."""

    async def job(store: Any) -> tuple[Any, list[Any]]:
        record = await store.get_session(session_id)
        events = [] if record is None else await store.events(session_id)
        return record, events

    record, events = guarded(lambda: with_store(db, job))
    if record is None:
        raise fail(f"no session {session_id!r}")
    return record, events


@sessions_app.command("show", cls=Command)
def sessions_show(
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    inline_images: InlineImagesOption = "auto",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a session's record and its events (images inline, as sunroom run does)."""
    from sunroom.cli.console import Renderer
    from sunroom.service.journal import TRANSCRIPT

    console = Console()
    inline = inline_protocol(inline_images, console)
    record, events = _session_and_events(db, session_id)
    if as_json:
        shown = [
            {"seq": e.seq, "ts": e.ts, "type": e.kind, **e.payload}
            for e in events
            if e.kind != TRANSCRIPT
        ]
        typer.echo(json.dumps({**_record(record), "events": shown}))
        return
    console.print(f"session {record.session_id} · {record.status}")
    renderer = Renderer(console, inline=inline)
    for e in events:
        renderer.show(e)
    renderer.close()


@sessions_app.command("export", cls=Command)
def sessions_export(
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    ipynb: Annotated[Path, typer.Option("--ipynb", help="Write the session as this notebook.")],
    db: DbOption = None,
) -> None:
    """Export a session's transcript as a Jupyter notebook (cells, outputs and images)."""
    from sunroom.service.notebook import transcript_from_events, write_notebook

    _, events = _session_and_events(db, session_id)
    transcript = transcript_from_events(events)
    try:
        cells = write_notebook(transcript, ipynb, title=f"sunroom session {session_id}")
    except UsageError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {ipynb} ({cells} cells)")


@sessions_app.command("resume", cls=Command)
def sessions_resume(
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    message: Annotated[str | None, typer.Option(help="A message to send once resumed.")] = None,
    inline_images: InlineImagesOption = "auto",
    functions: FunctionsOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Take over a session (e.g. one a crashed service left running) and run it here.

    Host functions are not stored with a session: pass the --functions the run had.
    """
    console = Console(stderr=as_json)
    inline = inline_protocol(inline_images, console)

    async def work() -> dict[str, object] | None:
        from sunroom.cli.console import Renderer, follow

        async with open_manager(db, functions=function_specs(functions)) as manager:
            before = (
                await manager.store.last_seq(session_id)
                if await manager.store.get_session(session_id)
                else 0
            )
            await manager.resume(session_id)
            if message is not None:
                await manager.send(session_id, message)
            renderer = Renderer(console, inline=inline, live=True)
            try:
                show = (lambda e: None) if as_json else renderer.show
                await follow(manager.store, manager.signals, session_id, show, after=before)
            finally:
                renderer.close()
            _, result = await manager.result(session_id, timeout_s=0)
            out: dict[str, object] | None = result
            return out

    finish_run(session_id, db, work, as_json=as_json)


def _age(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise fail(f"--older-than takes seconds or a number with s/m/h/d, got {text!r}") from None


@sessions_app.command("purge", cls=Command)
def sessions_purge(
    older_than: Annotated[str, typer.Option(help="Age: seconds, or 30d, 12h, 15m.")] = "30d",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete finished sessions older than the given age (running ones are kept)."""
    seconds = _age(older_than)
    count = guarded(lambda: with_store(db, lambda s: s.purge(older_than_s=seconds)))
    typer.echo(json.dumps({"purged": count}) if as_json else f"purged {count} sessions")
