"""Failover of coordinator replicas on PostgreSQL, for `coordinator.py --store postgresql`.

Two real replicas share the server. Each round kills the leader with SIGKILL, reports a new
fault to the survivor at once, and times the death to the first action the new leader takes
on it (its playbook run starting, from the audit trail). The killed replica is started again
and follows. Then a rolling restart (every replica stopped and started, one by one) under a
fleet's load: acknowledged events lost (none allowed) and the longest time with no leader.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import psycopg
from stats import median

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core.auth import Role, TokenStore
from sentinel.coordinator.store import open_store
from sentinel.lab.harness.postgres import ThrowawayPostgres
from sentinel.processes import free_port, stop_process
from sentinel.protocol import Action as RecAction
from sentinel.protocol import (
    AgentHeartbeatPayload,
    EventBatch,
    EventKind,
    NodeHealthPayload,
    Source,
    Verdict,
    XidReport,
    encode,
    make_event,
)

TARGET_S = 10.0


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds of a server process and all its children (PostgreSQL's backends)."""
    if pid is None:
        return 0.0
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            continue
    return total


class Replica:
    def __init__(self, dsn: str, env: dict[str, str] | None = None) -> None:
        self.dsn, self.port, self.env = dsn, free_port(), env or {}
        self.state = Path(tempfile.mkdtemp(prefix="sentinel-replica-"))
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "sentinel",
            "--log-level",
            "warning",
            "coordinator",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--state-dir",
            str(self.state),
            "--store",
            self.dsn,
        ]
        self.proc = subprocess.Popen(argv, env={**os.environ, **self.env})
        deadline = time.monotonic() + 30
        while self.role() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def role(self) -> str | None:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                return str(json.loads(r.read())["role"])
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def post(self, token: str, body: bytes) -> bool:
        req = urllib.request.Request(f"{self.url}/v1/events", data=body, method="POST")
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Content-Type", "application/json")
        try:
            urllib.request.urlopen(req, timeout=5).close()
            return True
        except (OSError, urllib.error.URLError):
            return False


def _fault(node: str) -> bytes:
    xid = XidReport(gpu=0, xid=48, name="Double-bit ECC error", action=RecAction.RESET_GPU)
    health = NodeHealthPayload(verdict=Verdict.UNHEALTHY, action=RecAction.RESET_GPU, xids=[xid])
    return encode(
        EventBatch(events=[make_event(EventKind.NODE_HEALTH, Source(node=node), health)])
    ).encode()


def _first_action_ts(dsn: str, node: str) -> float | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT MIN(a.ts) FROM audit a JOIN incidents i ON a.incident_id = i.id"
            " WHERE i.target = %s AND a.what = 'run.start'",
            (node,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _wait(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _leader(group: list[Replica]) -> Replica | None:
    return next((r for r in group if r.role() == "leader"), None)


def _kill_rounds(dsn: str, group: list[Replica], token: str, kills: int) -> list[float]:
    times = []
    for k in range(kills):
        if not _wait(lambda: _leader(group) is not None, 30):
            raise RuntimeError("no leader")
        leader = _leader(group)
        assert leader is not None and leader.proc is not None
        survivor = next(r for r in group if r is not leader)
        died = time.time()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        node = f"failover-{k}-{os.getpid()}"
        while not survivor.post(token, _fault(node)):
            time.sleep(0.05)
        _wait(lambda n=node: _first_action_ts(dsn, n) is not None, 60)
        acted = _first_action_ts(dsn, node)
        times.append(round((acted or float("inf")) - died, 2))
        leader.start()  # back as a follower
    return times


def _rolling_restart(dsn: str, group: list[Replica], token: str) -> dict[str, Any]:
    acked: list[str] = []
    stop = threading.Event()
    leaderless: list[float] = []

    def load() -> None:
        n = 0
        while not stop.is_set():
            events = [
                make_event(
                    EventKind.AGENT_HEARTBEAT,
                    Source(node=f"load-{n % 16}"),
                    AgentHeartbeatPayload(gpus=8, verdict=Verdict.HEALTHY, agent_version="b"),
                )
            ]
            n += 1
            if any(r.post(token, encode(EventBatch(events=events)).encode()) for r in group):
                acked.extend(e.id for e in events)
            time.sleep(0.01)

    def watch() -> None:
        since = None
        while not stop.is_set():
            has = any(r.role() == "leader" for r in group)
            now = time.monotonic()
            if not has and since is None:
                since = now
            elif has and since is not None:
                leaderless.append(now - since)
                since = None
            time.sleep(0.1)

    threads = [threading.Thread(target=load), threading.Thread(target=watch)]
    for t in threads:
        t.start()
    try:
        for replica in group:  # an upgrade: stopped cleanly, started again, one at a time
            stop_process(replica.proc, 10.0)
            replica.start()
            _wait(lambda: _leader(group) is not None, 30)
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    with psycopg.connect(dsn) as conn:
        stored = {r[0] for r in conn.execute("SELECT id FROM events").fetchall()}
    return {
        "acked_events": len(acked),
        "lost_events": len(set(acked) - stored),
        "max_leaderless_s": round(max(leaderless, default=0.0), 2),
    }


def measure_failover(pg: ThrowawayPostgres, kills: int) -> dict[str, Any]:
    store, _ = open_store(CoordinatorConfig(store=pg.dsn))
    token = TokenStore(store).create(Role.ADMIN)[1]
    store.close()
    group = [Replica(pg.dsn), Replica(pg.dsn)]
    try:
        for r in group:
            r.start()
        times = _kill_rounds(pg.dsn, group, token, kills)
        rolling = _rolling_restart(pg.dsn, group, token)
    finally:
        for r in group:
            stop_process(r.proc, 10.0)
    return {
        "kills": len(times),
        "death_to_first_action_s": times,
        "median_s": median(times),
        "max_s": max(times),
        "target_s": TARGET_S,
        "met": all(t <= TARGET_S for t in times),
        "lease_ttl_s": CoordinatorConfig().lease_ttl_s,
        "rolling_restart": rolling,
    }
