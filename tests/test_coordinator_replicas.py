"""Several coordinator replicas on one real PostgreSQL: leadership, fencing and failover drills.

Real `sentinel coordinator` processes share a throwaway PostgreSQL server (the distribution's
package, in a temporary directory). Drains go through the stand-in `scontrol`
(tests/helpers/scontrol_standin.py, no Slurm controller here), whose call log is the witness
that an eviction was made once. Every replica runs the shipped lease settings.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from coord_util import ROOT, SENTINEL, Coordinator, job_status, wait_for, xid

from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.core.store import Fenced, StoreUnavailable
from sentinel.coordinator.store.lease import claim_leadership
from sentinel.coordinator.store.postgres import PostgresStore
from sentinel.lab.harness.postgres import ThrowawayPostgres
from sentinel.processes import free_port, spawn, stop_process
from sentinel.protocol import EventBatch, encode

STANDIN = ROOT / "tests" / "helpers" / "scontrol_standin.py"
FLEET = [f"node-{i}" for i in range(4)]
SPARES = ["spare-0", "spare-1"]
TAKEOVER_S = 10.0  # the bound: a follower acts within this of the leader's death


@pytest.fixture(scope="module")
def pg() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def shared(pg: ThrowawayPostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty database, the replicas' settings in the environment, the stand-in's state."""
    monkeypatch.setenv("PGPASSFILE", pg.client_env()["PGPASSFILE"])
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    state = tmp_path / "slurm-nodes.json"
    monkeypatch.setenv("SCONTROL_STATE", str(state))
    monkeypatch.setenv("SCONTROL_UPDATE_SLEEP_S", "0.5")
    monkeypatch.setenv("SENTINEL_COORDINATOR__EVICTION_BACKEND", "slurm")
    monkeypatch.setenv("SENTINEL_COORDINATOR__SCONTROL", str(STANDIN))
    monkeypatch.setenv("SENTINEL_COORDINATOR__STORE", pg.dsn)
    return state


@pytest.fixture
def replicas(shared: Path, tmp_path: Path) -> Iterator[list[Coordinator]]:
    """Two replicas; the first to start leads."""
    group = [Coordinator(tmp_path / f"replica-{i}") for i in range(2)]
    group[0].start()
    wait_for(lambda: role(group[0]) == "leader", 15, "the first replica to lead")
    group[1].start()
    yield group
    for c in group:
        if c.proc is not None and c.proc.poll() is None:
            os.kill(c.proc.pid, signal.SIGCONT)
        c.stop()


def health(c: Coordinator) -> dict[str, object]:
    with urllib.request.urlopen(f"{c.url}/healthz", timeout=2) as r:
        return dict(json.loads(r.read()))


def role(c: Coordinator) -> str | None:
    try:
        return str(health(c)["role"])
    except (OSError, urllib.error.URLError):
        return None


def admin_token(group: list[Coordinator]) -> str:
    # The first replica created it in the shared store; every replica accepts it.
    return (group[0].state / "admin.token").read_text().strip()


def post(c: Coordinator, token: str, events: list[object]) -> None:
    c.call("POST", "/v1/events", token, encode(EventBatch(events=events)).encode())  # type: ignore[arg-type]


def calls(state: Path) -> list[str]:
    log = Path(f"{state}.log")
    return log.read_text().splitlines() if log.exists() else []


def db_rows(pg: ThrowawayPostgres, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pg.dsn) as conn:
        return list(conn.execute(sql).fetchall())


class Load:
    """Agents posting healthy batches to every replica they can reach; what was acknowledged."""

    def __init__(self, group: list[Coordinator], token: str) -> None:
        self.group, self.token = group, token
        self.acked: list[str] = []
        self.unavailable = 0  # 503s (with Retry-After) while the store was away
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(2)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            target = self.group[(worker + n) % len(self.group)]
            events = [xid(f"load-{worker}", code=43, id=f"w{worker}-{n}-{k}") for k in range(5)]
            n += 1
            try:
                post(target, self.token, events)  # type: ignore[arg-type]
            except urllib.error.HTTPError as e:
                if e.code == 503:
                    assert e.headers.get("Retry-After"), "a 503 without Retry-After"
                    self.unavailable += 1
                time.sleep(0.05)
                continue
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)  # a replica that died: the agent tries another
                continue
            self.acked.extend(e.id for e in events)
            time.sleep(0.02)


def stored_ids(pg: ThrowawayPostgres) -> set[str]:
    return {str(r[0]) for r in db_rows(pg, "SELECT id FROM events")}


@pytest.fixture
def clients(replicas: list[Coordinator], tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A real agent (simulated GPUs, node-0) and a real job supervisor (`sentinel run`, four
    nodes and two spares of a sleeping trainer), each listing both replicas, the leader first."""
    token = admin_token(replicas)
    urls = ",".join(c.url for c in replicas)
    secret = tmp_path / "admin.token"
    secret.write_text(token)
    secret.chmod(0o600)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        "SENTINEL_AGENT__TOKEN_FILE": str(secret),
        "SENTINEL_AGENT__HEARTBEAT_S": "0.5",
        "SENTINEL_SUPERVISOR__HEARTBEAT_S": "0.5",
        "SENTINEL_SUPERVISOR__POLL_WAIT_S": "1",
    }
    agent = spawn(
        [
            *SENTINEL,
            "agent",
            "--sim",
            "--gpus",
            "1",
            "--node-id",
            "node-0",
            "--coordinator",
            urls,
            "--spool-dir",
            str(tmp_path / "spool"),
            "--rank-socket",
            str(tmp_path / "agent.sock"),
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
        env=env,
        log=tmp_path / "agent.log",
    )
    supervisor = spawn(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "jobk",
            "--coordinator",
            urls,
            "--token-file",
            str(secret),
            "--nodes",
            "4",
            "--gpus-per-node",
            "1",
            "--spares",
            "2",
            "--log-dir",
            str(logs),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(600)",
        ],
        env=env,
        log=tmp_path / "supervisor.log",
    )
    try:
        yield {"logs": logs}
    finally:
        stop_process(supervisor, 10)
        stop_process(agent, 10)


@pytest.mark.slow
def test_leader_killed_mid_repair_a_follower_finishes_it_once(
    replicas: list[Coordinator],
    clients: dict[str, Path],
    shared: Path,
    pg: ThrowawayPostgres,
) -> None:
    """kill -9 of the leader after the eviction and before the resume, under ingest load: the
    follower leads within 10 s; the agent and the supervisor fail over to it by themselves; the
    run goes on from where it stopped and the supervisor's new generation ends it. One drain,
    one restart command, no acknowledged event lost."""
    leader, follower = replicas
    token = admin_token(replicas)
    job = "SELECT state FROM jobs WHERE id = 'jobk'"
    wait_for(lambda: db_rows(pg, job) == [("running",)], 30, "the supervisor's job running")
    with Load(replicas, token) as load:
        post(follower, token, [xid("node-3")])
        wait_for(lambda: "drained node-3" in calls(shared), 20, "the drain")
        evicted = "SELECT state FROM nodes WHERE name='node-3'"
        wait_for(lambda: db_rows(pg, evicted) == [("evicted",)], 20, "node-3 recorded evicted")
        assert leader.proc is not None
        leader.proc.send_signal(signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        leader.proc.wait()
        wait_for(lambda: role(follower) == "leader", TAKEOVER_S, "the follower to lead")
        assert time.monotonic() - killed <= TAKEOVER_S
        # The supervisor relaunches on the plan (spare-0 for node-3) and reports generation 1;
        # the new leader sees it and finishes the run. No person in between.
        done = "SELECT status FROM runs ORDER BY id"
        wait_for(lambda: db_rows(pg, done) == [("done",)], 30, "the run to finish")
        seen = "SELECT last_seen FROM nodes WHERE name = 'node-0'"
        wait_for(lambda: float(db_rows(pg, seen)[0][0]) > killed_at + 1, 10, "the agent's beat")
        wait_for(lambda: len(load.acked) > 50, 20, "load to go on")
    assert calls(shared).count("update node-3") == 1  # the scheduler's record: one drain
    assert db_rows(pg, "SELECT COUNT(*) FROM commands WHERE kind='job.restart'") == [(1,)]
    generation = "SELECT generation FROM jobs WHERE id = 'jobk'"
    assert db_rows(pg, generation) == [(1,)]
    missing = set(load.acked) - stored_ids(pg)
    assert not missing, f"{len(missing)} acknowledged events lost"


@pytest.mark.slow
def test_a_paused_leader_is_fenced_and_steps_down(
    replicas: list[Coordinator], shared: Path, pg: ThrowawayPostgres
) -> None:
    """SIGSTOP of the leader past its lease: the follower takes over and repairs; SIGCONT: the
    old leader steps down, and nothing runs twice."""
    leader, follower = replicas
    token = admin_token(replicas)
    assert leader.proc is not None
    os.kill(leader.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: role(follower) == "leader", TAKEOVER_S, "the follower to lead")
        post(follower, token, [job_status("jobk", FLEET, SPARES), xid("node-2")])
        wait_for(lambda: "drained node-2" in calls(shared), 20, "the new leader's drain")
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    wait_for(lambda: role(leader) == "follower", 10, "the old leader to step down")
    time.sleep(2)  # what the old leader would do late, it would do now
    assert role(follower) == "leader"
    assert calls(shared).count("update node-2") == 1
    epochs = sorted(int(health(c)["epoch"] or 0) for c in replicas)  # type: ignore[call-overload]
    assert epochs[0] == 0 and epochs[1] >= 2  # one leader, at a newer epoch


@pytest.mark.slow
def test_database_restart_answers_503_and_loses_nothing(
    replicas: list[Coordinator], pg: ThrowawayPostgres
) -> None:
    """PostgreSQL restarted under load: the replicas answer 503 with Retry-After while it is
    down, reconnect by themselves, and every acknowledged event is stored."""
    token = admin_token(replicas)
    with Load(replicas, token) as load:
        wait_for(lambda: len(load.acked) > 50, 20, "load")
        pg.stop()
        wait_for(lambda: load.unavailable > 0, 10, "a 503 while the database is down")
        time.sleep(1)
        pg.start()
        before = len(load.acked)
        wait_for(lambda: len(load.acked) > before + 50, 30, "acknowledgements after the restart")
    missing = set(load.acked) - stored_ids(pg)
    assert not missing, f"{len(missing)} acknowledged events lost"
    wait_for(
        lambda: sorted(str(role(c)) for c in replicas) == ["follower", "leader"],
        15,
        "one leader again",
    )


def test_the_database_refuses_a_deposed_leaders_write(shared: Path, pg: ThrowawayPostgres) -> None:
    """Fencing is the database's: a write made under an epoch that is no longer the lease's
    is refused by the trigger, whatever the writer believes."""
    store = PostgresStore(pg.dsn)
    lease = store.connect()
    try:
        first = claim_leadership(lease, "a", None, 30)
        assert first is not None and claim_leadership(lease, "b", None, 30) is None  # held
        with store.fenced(first):
            store.audit(1.0, "engine", "test.write", "as the leader")
        lease.execute("UPDATE leadership SET expires_at = 0")  # the lease ran out...
        second = claim_leadership(lease, "b", None, 30)  # ...and b took it
        assert second == first + 1
        with pytest.raises(Fenced, match="no longer the leader"), store.fenced(first):
            store.audit(2.0, "engine", "test.write", "as a deposed leader")
        store.audit(3.0, "ingest", "test.write", "not the engine's: any replica may")
        whats = db_rows(pg, "SELECT why FROM audit ORDER BY id")
        assert whats == [("as the leader",), ("not the engine's: any replica may",)]
        pg.stop()
        with pytest.raises(StoreUnavailable):
            store.audit(4.0, "ingest", "test.write", "database away")
        pg.start()
        store.audit(5.0, "ingest", "test.write", "back")
    finally:
        lease.close()
        store.close()


def test_credentials_come_from_a_file_and_tls_settings_reach_libpq(
    shared: Path, pg: ThrowawayPostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store_password_file` holds the password (the URL carries none); `sslmode` in the URL
    is libpq's: required against this server (no TLS here), the connection is refused with
    libpq's reason, and no error names the password."""
    password = Path(pg.client_env()["PGPASSFILE"]).read_text().strip().rsplit(":", 1)[1]
    monkeypatch.delenv("PGPASSFILE")
    secret = tmp_path / "pg-password"
    secret.write_text(password + "\n")
    store = PostgresStore(pg.dsn, password_file=secret)
    assert store.state_counts(Entity.NODE) == {}
    store.close()
    with pytest.raises(StoreUnavailable) as refused:
        PostgresStore(pg.dsn + "?sslmode=require", password_file=secret)
    assert "SSL" in str(refused.value) and password not in str(refused.value)
    with pytest.raises(StoreUnavailable, match="password authentication failed") as wrong:
        PostgresStore(pg.dsn.replace("sentinel@", "nobody@"), password_file=secret)
    assert password not in str(wrong.value)


def test_a_url_with_a_password_is_refused_without_repeating_it(
    sentinel_cmd: list[str], tmp_path: Path
) -> None:
    import subprocess

    url = "postgresql://sentinel:hunter2-secret@db:5432/sentinel"
    done = subprocess.run(
        [*sentinel_cmd, "coordinator", "--store", url, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "must not carry a password" in done.stderr and "hunter2" not in done.stderr


def test_a_session_lost_mid_transaction_commits_none_of_it(
    shared: Path, pg: ThrowawayPostgres
) -> None:
    """The server ends the session between two writes of one transaction: the second write
    and the commit fail (no new session picks the transaction's tail up and commits it on its
    own), nothing of it is stored, and the next transaction connects again."""
    store = PostgresStore(pg.dsn)
    admin = store.connect()
    try:
        with pytest.raises(StoreUnavailable, match="in a transaction"), store.tx():
            store.audit(1.0, "ingest", "test.write", "first half")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'sentinel-coordinator' AND pid <> pg_backend_pid()"
            )
            with contextlib.suppress(StoreUnavailable):  # a caller that carries on regardless
                store.audit(2.0, "ingest", "test.write", "second half")
            store.audit(3.0, "ingest", "test.write", "third")
        assert db_rows(pg, "SELECT why FROM audit") == []
        with store.tx():
            store.audit(4.0, "ingest", "test.write", "after")
        assert db_rows(pg, "SELECT why FROM audit") == [("after",)]
    finally:
        admin.close()
        store.close()


def test_a_dump_uploaded_to_one_replica_is_served_by_the_other(
    replicas: list[Coordinator],
) -> None:
    """Flight-recorder dumps live in the shared store: the agent's upload and the supervisor's
    read may reach different replicas."""
    token = admin_token(replicas)
    dump = b"\x80\x04 a pickled flight-recorder dump"
    stored = replicas[1].call("PUT", "/v1/fr/chk-1/node-1/rank-2", token, dump)
    assert stored == {"stored": "chk-1/node-1/rank-2", "bytes": len(dump)}
    served = replicas[0].call("GET", "/v1/fr/chk-1", token)
    assert served == {
        "check": "chk-1",
        "files": [{"node": "node-1", "name": "rank-2", "data": base64.b64encode(dump).decode()}],
    }
