"""Fixtures: a real PostgreSQL (tests/state/postgres.py) and a store on each engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.sqlstore import SqlStateStore
from tests.state.postgres import ENV_URL, database_url, schema_url
from tests.support.integration import missing

NO_POSTGRES = (f"PostgreSQL is not installed (no initdb/pg_ctl: apt-get install postgresql) and {ENV_URL} is not "
               "set")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The URL of a PostgreSQL database the tests may create schemas in."""
    with database_url() as url:
        if url is None:
            missing(NO_POSTGRES)
        yield url


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema of this test's own."""
    with schema_url(pg_database) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A state-store URL on each engine: a fresh SQLite file, a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStateStore]:
    opened = open_store(store_url)
    yield opened
    opened.close()
