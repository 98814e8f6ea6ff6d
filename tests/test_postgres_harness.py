"""The throwaway PostgreSQL that the control-plane tests, drills and benchmarks run against:
a real server from the distribution's packages, started in a temporary directory and removed."""

from __future__ import annotations

import os

import pytest

from sentinel.lab.harness.postgres import PostgresUnavailable, ThrowawayPostgres, find_bindir

psycopg = pytest.importorskip("psycopg")

try:
    find_bindir()
    MISSING = ""
except PostgresUnavailable as e:
    MISSING = str(e)


@pytest.mark.skipif(bool(MISSING), reason=MISSING or "available")
def test_a_real_server_survives_a_crash_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pg = ThrowawayPostgres()  # under the system's temporary directory: the server user reads it
    try:
        pg.start()
        assert "@127.0.0.1:" in pg.dsn and ":" not in pg.dsn.split("@")[0].removeprefix(
            "postgresql://"
        )
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(pg.dsn, passfile=os.devnull, connect_timeout=5).close()
        monkeypatch.setenv("PGPASSFILE", pg.client_env()["PGPASSFILE"])
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (42)")
        pg.kill()  # SIGKILL of the postmaster: what was committed comes back from the WAL
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.dsn, connect_timeout=2).close()
        pg.start()
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]
        root = pg.root
    finally:
        pg.close()
    assert not root.exists()
