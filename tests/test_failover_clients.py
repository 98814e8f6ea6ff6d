"""Clients fail over between coordinator replicas (sentinel/failover.py), on real processes.

The replicas here are two real `sentinel coordinator` processes, each on its own SQLite state
dir, started from one copied store so that the same tokens work at both. The client mechanics
under test (which URL is asked, when a client moves on, that its spool keeps what no replica
acknowledged) do not depend on the store; replicas sharing one PostgreSQL store, and their
leadership, are the coordinator's own drills. Here "acknowledged" means stored by the replica
that answered, so nothing is lost when the union of the two stores holds every event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from coord_util import SENTINEL, Coordinator, wait_for
from loopback import serve

from sentinel.agent.uplink.delivery import Deliverer, Outcome
from sentinel.agent.uplink.spool import Spool
from sentinel.config import ConfigError, load_config
from sentinel.failover import Coordinators, Unreachable, parse_urls, request, retry_after_s
from sentinel.processes import free_port, spawn, stop_process, wait_ready
from sentinel.protocol import (
    Event,
    EventBatch,
    EventKind,
    RankSdcPayload,
    RankStepPayload,
    Source,
    encode,
    make_event,
)

# --- the rotation itself ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_urls_parse_one_or_several_and_refuse_what_is_not_one() -> None:
    assert parse_urls("http://a:8470/") == ("http://a:8470",)
    assert parse_urls(" http://a:8470, https://b ") == ("http://a:8470", "https://b")
    assert parse_urls(["http://a", "http://b/prefix"]) == ("http://a", "http://b/prefix")
    for bad, why in [
        ("", "no coordinator URL"),
        ("a:8470", r"not an http\(s\)"),
        ("http://a,http://a", "listed twice"),
        ("http://a?x=1", "no query"),
        (5, "a list of them"),
        ([8470], "a list of them"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_urls(bad)
    with pytest.raises(ValueError) as e:
        parse_urls("http://me:hunter2@a")
    assert "hunter2" not in str(e.value)


def test_retry_after_reads_seconds_and_dates_and_caps_them() -> None:
    assert retry_after_s("7") == 7.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_s("99999") == 300.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None


def test_rotation_sticks_moves_on_and_rests_a_replica_that_asked() -> None:
    clock = Clock()
    c = Coordinators(["http://a", "http://b", "http://c"], clock=clock)
    assert c.round() == ["http://a", "http://b", "http://c"]
    c.failed("http://a", "refused")
    assert c.current == "http://b" and c.failovers == 1
    c.failed("http://a", "refused")  # a second caller's late news: no second move
    assert c.current == "http://b" and c.failovers == 1
    c.failed("http://b", "503", rest_s=5)
    assert c.round() == ["http://c", "http://a"]  # b rests
    c.failed("http://c", "503", rest_s=2)
    c.failed("http://a", "503", rest_s=9)
    assert c.round() == [] and c.retry_in_s() == 2.0
    clock.now += 2.5
    assert c.round() == ["http://c"]
    c.answered("http://c")
    assert c.current == "http://c" and c.round() == ["http://c"]


# --- real coordinators -----------------------------------------------------------------------


@pytest.fixture
def replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Coordinator, Coordinator, dict[str, Path]]]:
    """Coordinators A and B, started from one store holding an admin, a node-0 and a job1
    token (files returned by name)."""
    # A replica's shutdown waits for its open long-polls: keep them short.
    monkeypatch.setenv("SENTINEL_COORDINATOR__LONG_POLL_MAX_S", "1")
    a = Coordinator(tmp_path / "a" / "state")
    a.state.parent.mkdir(parents=True)
    tokens = {
        "admin": a.token("--role", "admin"),
        "node": a.token("--role", "node", "--node", "node-0"),
        "job": a.token("--role", "job", "--job", "job1"),
    }
    b = Coordinator(tmp_path / "b" / "state")
    shutil.copytree(a.state, b.state)
    files = {}
    for name, secret in tokens.items():
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(secret)
        files[name].chmod(0o600)
    starting = [threading.Thread(target=c.start) for c in (a, b)]  # in parallel: seconds each
    for t in starting:
        t.start()
    for t in starting:
        t.join()
    try:
        yield a, b, files
    finally:
        a.stop()
        b.stop()


def rows(coord: Coordinator, sql: str, *args: object) -> list[sqlite3.Row]:
    """Read a replica's store, dead or alive (what it stored before a kill -9 is on disk)."""
    with coord.db() as db:
        return db.execute(sql, args).fetchall()


def steps(coord: Coordinator) -> set[int]:
    found = rows(
        coord, "SELECT payload FROM events WHERE kind = ? AND node = 'node-0'", "rank.step"
    )
    return {json.loads(r["payload"])["step"] for r in found}


class FakeRank:
    """A training rank on the agent's socket: a numbered rank.step event every 20 ms, and every
    line (command) the agent relays back."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.sent = 0
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._read)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        while not self._stop.wait(0.02):
            payload = RankStepPayload(step=self.sent, step_s=0.1, compute_s=0.08, comm_s=0.02)
            event = make_event(
                EventKind.RANK_STEP, Source(node="node-0", rank=0, job="job1"), payload
            )
            self.sock.sendall(encode(event).encode() + b"\n")
            self.sent += 1

    def _read(self) -> None:
        with contextlib.suppress(OSError), self.sock.makefile("r") as f:  # OSError: closed
            for line in f:
                self.lines.append(line)

    def stop_sending(self) -> int:
        self._stop.set()
        self._threads[0].join()
        return self.sent

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def agent_metric(port: int, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [ln for ln in r.read().decode().splitlines() if ln.startswith(name)]


def test_agent_and_supervisor_carry_on_when_the_first_coordinator_is_killed(
    replicas: tuple[Coordinator, Coordinator, dict[str, Path]], tmp_path: Path
) -> None:
    """Agent and supervisor list a dead URL, then A, then B. Events flow to A;
    kill -9 A; they flow to B, and every step event the rank sent is stored by A or B. Then a
    playbook at B sends a command to the job and to the node: both arrive and are acked."""
    a, b, tokens = replicas
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sock, metrics_port = tmp_path / "agent.sock", free_port()
    agent_env = {
        **os.environ,
        "SENTINEL_AGENT__TOKEN_FILE": str(tokens["node"]),
        "SENTINEL_AGENT__HEARTBEAT_S": "0.5",
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
            f"{dead},{a.url},{b.url}",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--rank-socket",
            str(sock),
            "--listen",
            f"127.0.0.1:{metrics_port}",
        ],
        env=agent_env,
        log=tmp_path / "agent.log",
    )
    sup_env = {
        **os.environ,
        "SENTINEL_SUPERVISOR__HEARTBEAT_S": "0.5",
        "SENTINEL_SUPERVISOR__POLL_WAIT_S": "1",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    supervisor = spawn(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "job1",
            "--coordinator",
            f"{dead},{a.url},{b.url}",
            "--token-file",
            str(tokens["job"]),
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--spares",
            "0",
            "--log-dir",
            str(logs),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(600)",
        ],
        env=sup_env,
        log=tmp_path / "supervisor.log",
    )
    rank = None
    try:
        wait_ready(sock.exists, agent, what="agent", log=tmp_path / "agent.log", timeout_s=30)
        rank = FakeRank(sock)
        job_at = "SELECT last_heartbeat FROM jobs WHERE id = 'job1'"
        wait_for(lambda: len(steps(a)) > 5 and rows(a, job_at), 30, "A acking both clients")
        assert not steps(b) and not rows(b, job_at)  # sticky: B is not asked while A answers

        a.proc.kill()  # type: ignore[union-attr]
        a.proc.wait()  # type: ignore[union-attr]
        killed_at = time.time()
        time.sleep(1.0)  # the rank goes on sending through the failover
        sent = rank.stop_sending()
        everything = set(range(sent))
        wait_for(lambda: steps(a) | steps(b) >= everything, 20, "every step stored by A or B")
        assert steps(b), "B acknowledged nothing"
        wait_for(lambda: rows(b, job_at) and rows(b, job_at)[0][0] > killed_at, 10, "job at B")
        assert agent_metric(metrics_port, "sentinel_agent_coordinator_failovers_total") == [
            "sentinel_agent_coordinator_failovers_total 2.0"  # dead -> A, A -> B
        ]
        assert (
            f'url="{b.url}"' in agent_metric(metrics_port, "sentinel_agent_coordinator_current")[0]
        )

        # A suspected silent data corruption, told to B: its playbook's first step asks the
        # job's ranks (through the supervisor) and the node's (through the agent) to recompute.
        sdc = make_event(
            EventKind.RANK_SDC,
            Source(node="node-0", rank=0, job="job1"),
            RankSdcPayload(step=3, digest="00ff", mismatch=True, mismatched_ranks=[0]),
        )
        body = encode(EventBatch(events=[sdc])).encode()
        b.call("POST", "/v1/events", tokens["admin"].read_text(), body)
        control = logs / "job1.control.jsonl"
        wait_for(lambda: control.exists() and "sdc.check" in control.read_text(), 20, "job cmd")
        wait_for(lambda: any("sdc.check" in ln for ln in rank.lines), 20, "node command")
        acked = "SELECT target_kind FROM commands WHERE kind = 'sdc.check' AND acked_at IS NOT NULL"
        wait_for(lambda: len(rows(b, acked)) == 2, 10, "both commands acknowledged at B")
    finally:
        if rank is not None:
            rank.close()
        stop_process(supervisor, 10)
        stop_process(agent, 10)


# --- a replica answering 503, and a refusal that must not fail over ----------------------------


class Unavailable:
    """A stand-in replica that only ever answers 503 with a Retry-After (a real coordinator
    does so while its database is down; making one lose its database is the coordinator's own
    drill), counting when it was asked."""

    def __init__(self, retry_after: str) -> None:
        self.retry_after = retry_after
        self.asked: list[float] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append(time.monotonic())
        return web.json_response(
            {"error": "store unavailable"}, status=503, headers={"Retry-After": self.retry_after}
        )


@asynccontextmanager
async def unavailable(retry_after: str) -> AsyncIterator[tuple[Unavailable, str]]:
    stand_in = Unavailable(retry_after)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_in.handle)
    async with serve(app) as url:
        yield stand_in, url


def step_event(step: int) -> Event:
    payload = RankStepPayload(step=step, step_s=0.1, compute_s=0.08, comm_s=0.02)
    return make_event(EventKind.RANK_STEP, Source(node="node-0", rank=0, job="job1"), payload)


async def test_a_503_sends_the_batch_to_the_next_replica_and_rests_the_first(
    coord: Coordinator, tmp_path: Path
) -> None:
    node = coord.token("--role", "node", "--node", "node-0")
    spool = Spool(tmp_path / "spool", 100)
    headers = {"Authorization": f"Bearer {node}"}  # what Deliverer.run's session sends
    async with (
        unavailable("30") as (stand_in, url),
        aiohttp.ClientSession(headers=headers) as session,
    ):
        d = Deliverer(spool, Coordinators([url, coord.url]), node)
        for step in range(3):
            spool.append([step_event(step)])
            assert await d.deliver_once(session) is Outcome.SENT
    assert len(stand_in.asked) == 1  # asked once, then left alone for its 30 s
    assert len(spool) == 0 and steps(coord) == {0, 1, 2}
    assert d.coordinators.current == coord.url and d.coordinators.failovers == 1


async def test_a_lone_replica_answering_503_is_asked_again_only_after_its_retry_after(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path / "spool", 100)
    spool.append([step_event(0)])
    async with unavailable("1") as (stand_in, url):
        d = Deliverer(spool, Coordinators(url), token=None)
        task = asyncio.create_task(d.run())
        await asyncio.sleep(2.6)
        task.cancel()
    gaps = [b - a for a, b in zip(stand_in.asked, stand_in.asked[1:], strict=False)]
    assert 2 <= len(stand_in.asked) <= 3 and all(g >= 0.95 for g in gaps), stand_in.asked
    assert len(spool) == 1  # nothing acknowledged, nothing dropped


async def test_a_refusal_is_the_answer_not_a_reason_to_fail_over(
    coord: Coordinator, tmp_path: Path
) -> None:
    """A 401 (a token this replica does not know) from the first replica: the batch stays
    spooled and the second replica is never asked; 400/422 would be dropped just the same."""
    spool = Spool(tmp_path / "spool", 100)
    spool.append([step_event(0)])
    async with unavailable("1") as (second, url), aiohttp.ClientSession() as session:
        d = Deliverer(spool, Coordinators([coord.url, url]), token="not-a-token")
        assert await d.deliver_once(session) is Outcome.BACK_OFF
        reply = await request(session, d.coordinators, "GET", "/v1/nodes")
    assert reply.status == 401 and reply.url == coord.url
    assert second.asked == [] and len(spool) == 1 and d.coordinators.failovers == 0


async def test_no_replica_answering_is_one_error_naming_each(tmp_path: Path) -> None:
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    async with aiohttp.ClientSession() as session:
        with pytest.raises(Unreachable) as e:
            await request(session, Coordinators(urls), "GET", "/healthz")
    assert [u for u, _ in e.value.failures] == urls and e.value.retry_in_s == 0.0
    assert str(e.value).startswith("no coordinator answered: " + urls[0])


# --- sentinel status -------------------------------------------------------------------------


async def run_status(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *SENTINEL, "status", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_status_asks_the_first_replica_that_answers(
    coord: Coordinator, tmp_path: Path
) -> None:
    operator = tmp_path / "op.token"
    operator.write_text(coord.token("--role", "operator"))
    dead = f"http://127.0.0.1:{free_port()}"
    async with unavailable("1") as (stand_in, busy):
        code, out, err = await run_status(
            "--coordinator", f"{dead},{busy},{coord.url}", "--token-file", str(operator), "--json"
        )
        assert code == 0, err
        assert json.loads(out)["coordinator"] == coord.url
        assert len(stand_in.asked) == 1  # the 503 was asked once, then rested
        # A token the first replica refuses: exit 2 with its answer, the next never asked.
        bad = tmp_path / "bad.token"
        bad.write_text("not-a-token")
        code, _, err = await run_status(
            "--coordinator", f"{coord.url},{busy}", "--token-file", str(bad)
        )
        assert code == 2 and f"{coord.url}/v1/nodes: 401" in err
        assert len(stand_in.asked) == 1
        code, _, err = await run_status("--coordinator", "http://a,http://a")
        assert code == 2 and "listed twice" in err


def test_a_url_list_in_config_and_environment_and_no_password_echoed() -> None:
    cfg = load_config(env={"SENTINEL_AGENT__COORDINATOR_URL": "http://a:8470,http://b:8470"})
    assert cfg.agent.coordinator_url == ("http://a:8470", "http://b:8470")
    assert cfg.supervisor.coordinator_url == ("http://127.0.0.1:8470",)  # one, as before
    with pytest.raises(ConfigError) as e:
        load_config(env={"SENTINEL_SUPERVISOR__COORDINATOR_URL": "http://me:hunter2@a"})
    assert "supervisor.coordinator_url" in str(e.value) and "hunter2" not in str(e.value)
