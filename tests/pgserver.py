"""A real PostgreSQL for the tests: one scratch cluster per xdist worker, one database per test.

The cluster itself (initdb, postgres on a free loopback port as ``nobody``, immediate shutdown)
is ``benchmarks/_pg.py``, shared with the store benchmark; this module adds the tests' policy
and the fixtures ``tests/conftest.py`` exposes:

- ``postgres_cluster`` (session): the worker's cluster, started on first use. When the server
  binaries are missing the test is skipped with the reason, or fails when the environment says
  ``SUNROOM_REQUIRE_POSTGRES=1`` (CI), so a missing PostgreSQL in CI is a failure.
- ``postgres_dsn`` (session): the DSN of the cluster's ``postgres`` database (superuser, trust).
- ``postgres_db_dsn`` (function): a fresh empty database for this test, dropped afterwards,
  reached as the password role with its password in the DSN.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported when a test asks for PostgreSQL: the conftest stays light
    from benchmarks._pg import Cluster

__all__ = ["postgres_cluster", "postgres_db_dsn", "postgres_dsn"]


def unavailable(reason: str) -> None:
    """Skip the test for *reason*, or fail it when ``SUNROOM_REQUIRE_POSTGRES=1``."""
    if os.environ.get("SUNROOM_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL is required here (SUNROOM_REQUIRE_POSTGRES=1): {reason}")
    pytest.skip(f"no PostgreSQL here: {reason}")


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """This worker's scratch cluster (see the module docstring)."""
    from benchmarks._pg import ClusterError, cluster, find_bindir

    bindir = find_bindir()
    if bindir is None:
        unavailable(
            "initdb and postgres not found (pg_config --bindir, /usr/lib/postgresql/*/bin, PATH)"
        )
        return
    try:
        with cluster(bindir) as running:
            yield running
    except ClusterError as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def postgres_dsn(postgres_cluster: Cluster) -> str:
    """The DSN of the worker cluster's ``postgres`` database, as the superuser."""
    return postgres_cluster.dsn()


@pytest.fixture
def postgres_db_dsn(postgres_cluster: Cluster) -> Iterator[str]:
    """A new empty database for this test (dropped after it), as the password role."""
    name = postgres_cluster.create_database()
    try:
        yield postgres_cluster.dsn(name, password=True)
    finally:
        postgres_cluster.drop_database(name)
