"""open_store: a path or URL picks the backend; any other scheme is refused, never echoed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sunroom.errors import UsageError
from sunroom.store import PostgresStore, SQLiteStore, open_store
from tests.pgserver import unavailable
from tests.store.conftest import FakeClock


@pytest.mark.parametrize("spec", ["store.db", "~/x/store.db", "/var/lib/s.db", "C:\\s.db"])
def test_a_path_is_sqlite(spec: str) -> None:
    clock = FakeClock()
    store = open_store(spec, clock=clock)
    assert isinstance(store, SQLiteStore)
    assert store.path == Path(spec).expanduser() and store.clock is clock


async def test_a_sqlite_url_names_an_absolute_path(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/s.db")
    assert isinstance(store, SQLiteStore) and store.path == tmp_path / "s.db"
    async with store:
        await store.create_session("s1", config={})
    assert (tmp_path / "s.db").exists()
    with pytest.raises(UsageError, match="absolute path"):
        open_store("sqlite://relative/s.db")


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "POSTGRESQL"])
def test_a_postgres_url_is_postgres(scheme: str) -> None:
    clock = FakeClock()
    store = open_store(f"{scheme}://user:s3cret@db.internal:6543/sunroom", clock=clock)
    assert isinstance(store, PostgresStore)
    assert store.where == "db.internal:6543/sunroom" and store.clock is clock
    assert "s3cret" not in repr(store)


@pytest.mark.parametrize(
    ("spec", "scheme"),
    [
        ("mysql://root:s3cret@127.0.0.1/db", "mysql"),
        ("http://user:s3cret@127.0.0.1:8080/x", "http"),
        ("postgresq://user:s3cret@127.0.0.1/db", "postgresq"),
        ("redis+tls://:s3cret@host", "redis+tls"),
    ],
)
def test_any_other_scheme_is_refused_without_echo(spec: str, scheme: str) -> None:
    with pytest.raises(UsageError) as info:
        open_store(spec)
    message = str(info.value)
    assert f"scheme {scheme!r} is not supported" in message
    assert "postgresql://" in message and "sqlite:///" in message
    assert "s3cret" not in message and "127.0.0.1" not in message


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_spec_is_refused(spec: str) -> None:
    with pytest.raises(UsageError, match="non-empty"):
        open_store(spec)


@pytest.mark.kernel
def test_importing_the_store_package_imports_no_psycopg() -> None:
    code = (
        "import sys, sunroom.store as s; s.open_store('x.db');"
        " assert 'psycopg' not in sys.modules, 'eager';"
        " s.PostgresStore; assert 'psycopg' in sys.modules, 'lazy'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_postgresql_skips_or_fails_as_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUNROOM_REQUIRE_POSTGRES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL here: gone"):
        unavailable("gone")
    monkeypatch.setenv("SUNROOM_REQUIRE_POSTGRES", "1")
    with pytest.raises(pytest.fail.Exception, match="required here .*: gone"):
        unavailable("gone")
