import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from coord_util import Coordinator

# Every skip listed with its reason at the end; in CI a skip fails (see skip_policy).
from skip_policy import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sentinel_cmd() -> list[str]:
    """Run the CLI as a real subprocess, the way an operator would."""
    return [sys.executable, "-m", "sentinel"]


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[Coordinator]:
    """A real `sentinel coordinator` process on a free loopback port, stopped afterwards."""
    c = Coordinator(tmp_path / "state")
    c.start()
    yield c
    c.stop()


# --- the store's two backends --------------------------------------------------------------
# The behaviour tests that take `new_store` run on SQLite and on a real PostgreSQL server (from
# the distribution's packages, started once per session in a temporary directory, removed at
# the end). Each test gets an empty database.


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    from sentinel.lab.harness.postgres import ThrowawayPostgres

    with ThrowawayPostgres() as pg:
        yield pg


@pytest.fixture
def coord_on_each_store(tmp_path: Path, store_url: str | None) -> Iterator[Coordinator]:
    """A real coordinator process on this test's store backend (SQLite, or PostgreSQL)."""
    c = Coordinator(tmp_path / "state", store=store_url)
    c.start()
    yield c
    c.stop()


def empty_postgres(pg: object, mp: pytest.MonkeyPatch) -> str:
    """The shared test server's database, emptied; its URL (the password through PGPASSFILE)."""
    import psycopg

    mp.setenv("PGPASSFILE", pg.client_env()["PGPASSFILE"])  # type: ignore[attr-defined]
    with psycopg.connect(pg.dsn, autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return str(pg.dsn)  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The coordinator's `store` setting on this test's backend: None (SQLite in its state
    directory) or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return None
    return empty_postgres(request.getfixturevalue("postgres_server"), monkeypatch)


@pytest.fixture
def new_store(store_url: str | None, tmp_path: Path) -> Iterator[object]:
    """`new_store()`: a store on this test's backend (SQLite's file in tmp_path; every
    PostgreSQL store of a test shares its one, emptied, database)."""
    from sentinel.coordinator.store import open_store

    opened: list[object] = []

    def make() -> object:
        from coord_util import cfg

        store, _leadership = open_store(cfg(tmp_path, store=store_url))
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()  # type: ignore[attr-defined]
