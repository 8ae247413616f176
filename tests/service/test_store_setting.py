"""``--db`` / ``SUNROOM_DB``: a SQLite path, or a PostgreSQL URL; any other URL is refused.

Before issue 29, ``--db postgresql://user@host:port/db`` was taken as a SQLite path and made a
file named after the DSN. Now the scheme picks the store, an unsupported one is one sentence
that never echoes the URL's password, and the CLI reads sessions from PostgreSQL too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sunroom.cli import app
from sunroom.errors import UsageError
from sunroom.service.config import ServiceConfig, redact_url, split_db
from sunroom.store import SQLiteStore


def test_a_path_or_sqlite_url_is_a_sqlite_file(tmp_path: Path) -> None:
    assert split_db(str(tmp_path / "s.db")) == (tmp_path / "s.db", None)
    assert split_db(f"sqlite://{tmp_path}/s.db") == (tmp_path / "s.db", None)
    config = ServiceConfig.from_env(db=f"sqlite://{tmp_path}/s.db")
    assert config.db_path == tmp_path / "s.db" and config.store_url is None
    assert isinstance(config.new_store(), SQLiteStore)


def test_a_postgresql_url_is_the_store_url_and_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql://sunroom:hunter2-secret@db.internal:5432/sunroom"
    monkeypatch.setenv("SUNROOM_DB", url)
    config = ServiceConfig.from_env()
    assert config.store_url == url
    assert "hunter2" not in repr(config)
    assert config.store_label() == "postgresql://sunroom:***@db.internal:5432/sunroom"
    assert redact_url("postgres://u@h/db") == "postgres://u@h/db"
    explicit = ServiceConfig.from_env(db_path=Path("/tmp/x.db"))  # a path given wins
    assert explicit.store_url is None and explicit.db_path == Path("/tmp/x.db")


@pytest.mark.parametrize(
    "url", ["mysql://root:hunter2-secret@h/db", "postgresq://u:hunter2-secret@h/db", "http://x"]
)
def test_another_scheme_is_refused_without_echoing_it(url: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        ServiceConfig.from_env(db=url)
    message = str(info.value)
    assert "is not supported" in message and "hunter2" not in message and "@" not in message
    result = CliRunner().invoke(app, ["serve", "--db", url, "--port", "0"])
    assert result.exit_code == 2
    assert "is not supported" in result.output and "hunter2" not in result.output
    assert not list(tmp_path.iterdir())  # no file named after the URL


def test_a_relative_sqlite_url_is_refused() -> None:
    with pytest.raises(UsageError, match="absolute path"):
        split_db("sqlite://relative/s.db")


def test_the_cli_lists_sessions_of_a_postgresql_store(postgres_db_dsn: str) -> None:
    import asyncio

    async def seed() -> None:
        async with ServiceConfig.from_env(db=postgres_db_dsn).new_store() as store:
            await store.create_session("pg-session", config={"model": "scripted:x"})

    asyncio.run(seed())
    result = CliRunner().invoke(app, ["sessions", "list", "--db", postgres_db_dsn, "--json"])
    assert result.exit_code == 0, result.output
    assert [s["session_id"] for s in json.loads(result.output)] == ["pg-session"]
