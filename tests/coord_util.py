"""Shared helpers for the coordinator tests."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from sentinel.config import CoordinatorConfig, EvictionBudgetConfig
from sentinel.coordinator.http.listener import IDLE_CLOSE_S, IngestListener
from sentinel.processes import free_port, stop_process
from sentinel.protocol import Action as RecAction
from sentinel.protocol import (
    Event,
    EventKind,
    JobStatusPayload,
    NodeHealthPayload,
    RankCrashPayload,
    Source,
    Verdict,
    XidReport,
    make_event,
)

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = [sys.executable, "-m", "sentinel"]


_JSON_COLUMNS = frozenset({"payload", "status", "detail", "context", "params", "result", "args"})


def execute(store: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """Run one ad-hoc statement on a store (`?` placeholders, whichever database): a test
    inspecting or arranging what the coordinator's own typed methods do not. The result, read
    whole: its rows as dicts, JSON columns decoded (a run's plain `status` text stays)."""
    if store.engine.dialect.name == "postgresql":  # psycopg's placeholders
        sql = sql.replace("%", "%%").replace("?", "%s")
    result = store.conn.exec_driver_sql(sql, tuple(params))
    if not result.returns_rows:
        return result
    rows = [dict(r._mapping) for r in result]
    for row in rows:
        for key in _JSON_COLUMNS & row.keys():
            if isinstance(row[key], str) and row[key][:1] in ("{", "["):
                row[key] = json.loads(row[key])
    return rows


def query(store: Any, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = execute(store, sql, params)
    return rows


def one(store: Any, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
    rows = query(store, sql, params)
    return rows[0] if rows else None


def cfg(tmp: Path, **kw: object) -> CoordinatorConfig:
    budget = kw.pop("eviction", EvictionBudgetConfig(max_per_window=3, window_s=3600, min_fleet=1))
    return CoordinatorConfig(state_dir=tmp / "state", eviction=budget, **kw)  # type: ignore[arg-type]


def xid(node: str, gpu: int = 0, code: int = 48, **kw: object) -> Event:
    """The health event a node's agent sends for one XID (it carries the XID and the verdict)."""
    report = XidReport(gpu=gpu, xid=code, name="Double-bit ECC error", action=RecAction.RESET_GPU)
    payload = NodeHealthPayload(verdict=Verdict.UNHEALTHY, action=report.action, xids=[report])
    return make_event(EventKind.NODE_HEALTH, Source(node=node), payload, **kw)  # type: ignore[arg-type]


def crash(
    node: str, rank: int, job: str = "job1", generation: int = 0, no_progress: bool | None = None
) -> Event:
    return make_event(
        EventKind.RANK_CRASH,
        Source(node=node, rank=rank, job=job),
        RankCrashPayload(exit_code=3, generation=generation, no_progress=no_progress),
    )


def job_status(
    job: str,
    nodes: list[str],
    spares: list[str],
    generation: int = 0,
    state: str = "running",
    checkpoints: list[int] | None = None,
) -> Event:
    payload = JobStatusPayload(
        state=state,
        generation=generation,
        world_size=len(nodes) * 2,
        gpus_per_node=2,
        nodes=nodes,
        spares=spares,
        checkpoints=checkpoints or [],
    )
    return make_event(EventKind.JOB_STATUS, Source(job=job), payload)


class Coordinator:
    def __init__(
        self,
        state: Path,
        host: str = "127.0.0.1",
        store: str | None = None,
        ingest: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        """`store`: a PostgreSQL URL (the password through PGPASSFILE); None: SQLite in
        `state`. `ingest`: serve the ingest listener too, on a port of its own (`ingest_url`).
        `env`: more of its environment (its config, as SENTINEL_COORDINATOR__ variables)."""
        self.state = state
        self.env = env or {}
        self.store = store
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.ingest_port = free_port() if ingest else None
        self.ingest_url = f"http://{host}:{self.ingest_port}" if ingest else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            **({"SENTINEL_COORDINATOR__STORE": self.store} if self.store else {}),
            "SENTINEL_COORDINATOR__JOB_HEARTBEAT_TIMEOUT_S": "3",
            "SENTINEL_COORDINATOR__ENGINE_TICK_S": "0.1",
            "SENTINEL_COORDINATOR__EVICTION__MAX_PER_WINDOW": "4",
            **self.env,
        }
        self.proc = subprocess.Popen(
            [
                *SENTINEL,
                "coordinator",
                "--listen",
                f"{self.host}:{self.port}",
                "--state-dir",
                str(self.state),
                *(
                    ["--ingest-listen", f"{self.host}:{self.ingest_port}"]
                    if self.ingest_port
                    else []
                ),
            ],
            env=env,
            stderr=open(self.state.parent / "coord.log", "ab"),  # noqa: SIM115
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1).close()
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("coordinator did not start")

    def stop(self) -> None:
        stop_process(self.proc, 10.0)

    def token(self, *args: str) -> str:
        out = subprocess.run(
            [*SENTINEL, "token", "create", "--state-dir", str(self.state), "--json", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return str(json.loads(out.stdout)["token"])

    def call(self, method: str, path: str, token: str, body: bytes | None = None) -> object:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=body,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def db(self) -> Any:
        """A connection to the coordinator's store, dead or alive: `execute(sql)` and rows
        indexed by position on either backend."""
        if self.store:
            import psycopg

            return psycopg.connect(self.store, autocommit=True)
        conn = sqlite3.connect(self.state / "coordinator.db")
        conn.row_factory = sqlite3.Row
        return conn


def record_validation_baseline(path: Path) -> dict[str, Any]:
    """A healthy node's validation figures, recorded by the real command on one simulated GPU
    (this machine's CPU) at the shipped tolerances; the file's `validation` section."""
    argv = [sys.executable, "-m", "sentinel", "burnin", "--validate", "--gpus", "1"]
    subprocess.run(
        [*argv, "--save-baseline", str(path)], check=True, capture_output=True, timeout=120
    )
    return dict(json.loads(path.read_text())["validation"])


def sim_agent(
    tmp: Path, coord: Coordinator, node: str, faults: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A real agent for `node` on one simulated GPU (its faults in `faults`), with a node token,
    reporting to `coord` every half second; its log in tmp/agent.log."""
    token = tmp / "node.token"
    token.write_text(coord.token("--role", "node", "--node", node))
    base = {
        "SENTINEL_AGENT__TOKEN_FILE": str(token),
        "SENTINEL_AGENT__HEARTBEAT_S": "0.5",
        "SENTINEL_AGENT__SPOOL_DIR": str(tmp / "spool"),
    }
    argv = [sys.executable, "-m", "sentinel", "agent", "--sim", "--gpus", "1", "--node-id", node]
    argv += ["--listen", f"127.0.0.1:{free_port()}", "--interval", "0.5"]
    argv += ["--coordinator", coord.url, "--rank-socket", str(tmp / "r.sock")]
    return subprocess.Popen(
        [*argv, "--sim-faults", str(faults)],
        env={**os.environ, **base, **(env or {})},
        stderr=open(tmp / "agent.log", "ab"),
    )


@contextmanager
def returning_node(
    tmp: Path,
    node: str,
    faults: Path,
    baseline: Path,
    coordinator_env: dict[str, str] | None = None,
    agent_env: dict[str, str] | None = None,
) -> Iterator[Coordinator]:
    """A real coordinator whose validation gate judges by `baseline` (a 2 s hold-down, answers
    within 120 s), and a real agent for `node` on a simulated GPU with `faults`: a node to evict
    and return."""
    gate = {"BASELINE": str(baseline), "HOLD_DOWN_S": "2", "STALE_S": "3", "TIMEOUT_S": "120"}
    env = {f"SENTINEL_COORDINATOR__VALIDATION__{k}": v for k, v in gate.items()}
    (tmp / "state").mkdir()
    coord = Coordinator(tmp / "state", env={**env, **(coordinator_env or {})})
    coord.start()
    agent = sim_agent(tmp, coord, node, faults, agent_env)
    try:
        yield coord
    finally:
        stop_process(agent, 10.0)
        coord.stop()


@contextmanager
def own_core(pid: int, nice: int = -20) -> Iterator[bool]:
    """Give process `pid` (already started: every thread it has now) a core of its own, as the
    coordinator benchmark does, for a latency test: the target is a fleet on one core. It is
    pinned to the last CPU, and the caller's thread (the load generator) to the other CPUs;
    both get their priority raised by `nice` until the block ends: on a machine shared with
    other tests or a CPU hog, those take what is left, not the coordinator's core, and the
    generator keeps its schedule (a starved one sends late, in bursts: not the paced load a
    latency bound is stated for). Threads `pid` starts later inherit both. Yields whether the
    priorities could be raised (root, or CAP_SYS_NICE)."""
    cpus = sorted(os.sched_getaffinity(0))
    core, rest = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    raised = True
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), core)
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except PermissionError:
            raised = False
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    mine, my_nice = os.sched_getaffinity(0), os.getpriority(os.PRIO_PROCESS, 0)
    os.sched_setaffinity(0, rest)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # on Linux: this thread only
    except PermissionError:
        raised = False
    try:
        yield raised
    finally:
        os.sched_setaffinity(0, mine)
        os.setpriority(os.PRIO_PROCESS, 0, my_nice)


def run_queue_wait_s(pid: int) -> float | None:
    """Seconds the threads of `pid` have spent runnable but waiting for a CPU (the second
    field of /proc/<pid>/task/<tid>/schedstat): the part of a latency that is the machine's
    load, not the code's. None where the kernel does not say."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return total / 1e9


def wait_for(pred, timeout: float = 30.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class FrontClient:
    """What the API tests use of aiohttp's `TestClient` (`get`, `post`, `request`, `app`),
    against the app served the way `sentinel coordinator --ingest-listen` serves it: event
    batches go to the ingest port (`sentinel.coordinator.http.listener`), the rest to the API port."""

    def __init__(
        self, app: web.Application, api: aiohttp.ClientSession, ingest: aiohttp.ClientSession
    ) -> None:
        self.app = app
        self._api = api
        self._ingest = ingest

    def post(self, path: str, **kw: Any) -> Any:
        return (self._ingest if path == "/v1/events" else self._api).post(path, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


@asynccontextmanager
async def serve_front(
    app: web.Application, idle_close_s: float = IDLE_CLOSE_S
) -> AsyncIterator[tuple[IngestListener, FrontClient]]:
    """Serve `app` on a free loopback port, and its ingest listener on another."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    listener = IngestListener(app, "127.0.0.1", 0, idle_close_s=idle_close_s)
    try:
        await site.start()
        await listener.start()
        api_port = runner.addresses[0][1]
        async with (
            aiohttp.ClientSession(base_url=f"http://127.0.0.1:{api_port}") as api,
            aiohttp.ClientSession(base_url=f"http://127.0.0.1:{listener.port}") as ingest,
        ):
            yield listener, FrontClient(app, api, ingest)
    finally:
        await listener.stop()
        await runner.cleanup()
