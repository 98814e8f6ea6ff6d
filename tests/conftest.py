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
    from sentinel.harness.postgres import ThrowawayPostgres

    with ThrowawayPostgres() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgresql"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """`new_store(path)`: a store on this test's backend (the path is SQLite's file; every
    PostgreSQL store of a test shares its one, emptied, database)."""
    opened: list[object] = []
    if request.param == "sqlite":
        from sentinel.coordinator.store import Store

        def sqlite_store(path: Path | None = None) -> object:
            opened.append(Store(path or tmp_path / "c.db"))
            return opened[-1]

        yield sqlite_store
    else:
        import psycopg

        from sentinel.coordinator.store.postgres import PostgresStore

        pg = request.getfixturevalue("postgres_server")
        mp = pytest.MonkeyPatch()
        mp.setenv("PGPASSFILE", pg.client_env()["PGPASSFILE"])  # type: ignore[attr-defined]
        with psycopg.connect(pg.dsn, autocommit=True) as conn:  # type: ignore[attr-defined]
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")

        def postgres_store(path: Path | None = None) -> object:
            opened.append(PostgresStore(pg.dsn))  # type: ignore[attr-defined]
            return opened[-1]

        yield postgres_store
        mp.undo()
    for store in opened:
        store.close()  # type: ignore[attr-defined]
