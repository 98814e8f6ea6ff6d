"""Coordinator ingest benchmark: a load generator in another process plays a fleet of nodes,
each posting an event batch (an agent heartbeat + 8 health events, one GPU's verdict each) once
a second over HTTP on loopback to the coordinator's ingest listener (`--ingest-listen`), as a
real fleet does: every node on its own keep-alive connection with its own node token, event ids
made the way the agent makes them. The coordinator is pinned to one core (the target is a fleet
on one core) and the generator to the others. Fleets grow through the sizes given; past the
2,048-node target they stop at the first one whose p99 ack passes 50 ms.

Prints a JSON object as its last line: events_per_s, batches_per_s, ack_ms_p50, ack_ms_p99 and
cpu_core_fraction at the 2,048-node (16,384-GPU) step, max_nodes_at_1hz, and every step. Each
step also reports the coordinator's own receive-to-commit time (`server_ack_ms_p*_le`, the upper
bound of its histogram bucket), the largest its write-ahead log grew (`wal_mib_max`: it should
hold about a second of commits however long the step), how far the load generator fell behind
its schedule (`loader_lag_ms_p99`) and the machine's load average: on a shared machine a
starved generator inflates every latency it measures.

`--closed-loop N` measures cost instead of capacity: every node of the first fleet size sends N
batches over 256 connections, each posting its next batch as soon as the last one is
acknowledged, and the last line reports the coordinator's CPU per acknowledged batch, split into
its event-loop thread (HTTP, decoding) and the rest (store thread, WAL checkpoints). The queue
stays full whatever the machine's load, so the figure compares across runs on a shared machine
where the paced steps' rates (and with them the commit group sizes) do not.

`--store postgresql` (the default) runs all of that on SQLite first, then again against a
throwaway PostgreSQL server, whose backends share the load generator's core(s), and the last
line holds both: `sqlite`, `postgresql` (paced steps), `postgresql_cost` (closed loop: the
replica's CPU per batch and the database server's, `db_cpu_ms_per_batch`), `failover` (two
replicas; --kills times SIGKILL of the leader, each timed from the death to the new leader's
first action on a fault reported right after; then a rolling restart under load: events lost,
longest time without a leader) and `projection_100k_gpus` (replicas and database cores for
12,500 nodes at 1 Hz from the measured costs, with the arithmetic).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import slow_drain
from failover import measure_failover, server_cpu_s
from stats import percentile_ms

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core.auth import Role, TokenStore
from sentinel.coordinator.store import STORE_FILE, open_store, wal_path
from sentinel.lab.harness.postgres import ThrowawayPostgres
from sentinel.processes import free_port, stop_process
from sentinel.protocol import new_id

TARGET_NODES = 2048
P99_LIMIT_MS = 50.0
WARMUP_S = 1.0  # the first second opens every connection; not steady state


def _batch(node: int) -> bytes:
    """A node's once-a-second batch, with event ids made the way an agent makes them."""
    hb = {
        "v": 1,
        "id": new_id(),
        "kind": "agent.heartbeat",
        "source": {"node": f"node-{node}"},
        "ts": time.time(),
        "payload": {"gpus": 8, "verdict": "healthy", "agent_version": "b"},
    }
    verdict = {"verdict": "healthy", "action": "none"}
    gpus = [
        {
            "v": 1,
            "id": new_id(),
            "kind": "node.health",
            "source": {"node": f"node-{node}"},
            "ts": time.time(),
            "payload": {**verdict, "gpus": [{"gpu": g, **verdict}]},
        }
        for g in range(8)
    ]
    return json.dumps({"v": 1, "events": [hb, *gpus]}).encode()


def _request(token: str, body: bytes) -> bytes:
    """One HTTP/1.1 POST of a batch, as a node agent sends it on its keep-alive connection."""
    return (
        f"POST /v1/events HTTP/1.1\r\nHost: coordinator\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _response(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 response; its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return int(head[9:12])


async def _load(
    port: int, tokens: list[str], nodes: int, seconds: float
) -> tuple[list[float], list[float], float]:
    """(ack latencies, send lateness, elapsed): lateness is the generator's own lag behind its
    schedule, which a starved load generator adds to every latency it measures.

    HTTP/1.1 straight over asyncio streams, one keep-alive connection per node as a connected
    fleet holds them: an HTTP client library's per-request work would take the generator more
    CPU than the coordinator it measures, on a machine where both share two cores.
    """
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(nodes)]
    lat: list[float] = []
    late: list[float] = []
    start = time.perf_counter()

    async def node(i: int) -> None:
        reader, writer = conns[i]
        next_t = start + (i / nodes)  # spread the fleet over each second
        while next_t < start + seconds:
            await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
            t0 = time.perf_counter()
            if t0 >= start + seconds:
                break  # a generator that fell behind does not run past the window
            writer.write(_request(tokens[i], _batch(i)))  # a node speaks only as itself
            status = await _response(reader)
            if status == 200 and t0 - start >= WARMUP_S:
                lat.append(time.perf_counter() - t0)
                late.append(t0 - next_t)
            next_t += 1.0
        writer.close()

    await asyncio.gather(*(node(i) for i in range(nodes)))
    return lat, late, time.perf_counter() - start


@functools.cache  # taken before any pinning: the closed loop pins this very process
def _cores() -> tuple[set[int], set[int]]:
    """(the coordinator's core, the load generator's): the target is a fleet on one core, and a
    generator sharing that core would bill the coordinator for its own work."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[-1]}, set(cpus[:-1])) if len(cpus) > 1 else (set(cpus), set(cpus))


def _loader(port: int, tokens: list[str], nodes: int, seconds: float, q: mp.Queue) -> None:
    import uvloop  # the generator shares the machine: the less CPU it takes, the better

    os.sched_setaffinity(0, _cores()[1])

    q.put(uvloop.run(_load(port, tokens, nodes, seconds)))


def _make_tokens(state: Path, store_url: str | None, nodes: int) -> tuple[str, list[str]]:
    """An admin token and one node token per node, as a real fleet is set up."""
    store, _ = open_store(CoordinatorConfig(state_dir=state, store=store_url))
    tokens = TokenStore(store)
    with store.tx():
        admin = tokens.create(Role.ADMIN)[1]
        per_node = [tokens.create(Role.NODE, node=f"node-{i}")[1] for i in range(nodes)]
    store.close()
    return admin, per_node


async def _closed_loop(port: int, requests: list[bytes], connections: int = 256) -> int:
    """Send every request, each connection its next as soon as the last is answered; the number
    answered with anything but 200."""
    pending = iter(requests)
    refused = 0

    async def connection() -> None:
        nonlocal refused
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for data in pending:
            writer.write(data)
            refused += await _response(reader) != 200
        writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return refused


def _closed_loop_step(
    port: int, pid: int, tokens: list[str], nodes: int, per_node: int, db_pid: int | None
) -> dict:
    import uvloop

    os.sched_setaffinity(0, _cores()[1])

    def request(i: int) -> bytes:
        return _request(tokens[i % nodes], _batch(i % nodes))

    uvloop.run(_closed_loop(port, [request(i) for i in range(nodes)]))  # every token cached
    requests = [request(i) for i in range(nodes * per_node)]
    proc = psutil.Process(pid)

    def loop_thread_s() -> float:
        return next(t.user_time + t.system_time for t in proc.threads() if t.id == pid)

    db0 = server_cpu_s(db_pid)
    cpu0, loop0, t0 = proc.cpu_times(), loop_thread_s(), time.perf_counter()
    refused = uvloop.run(_closed_loop(port, requests))
    cpu1, loop1, wall = proc.cpu_times(), loop_thread_s(), time.perf_counter() - t0
    cpu_ms = 1000 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / len(requests)
    loop_ms = 1000 * (loop1 - loop0) / len(requests)
    db_ms = 1000 * (server_cpu_s(db_pid) - db0) / len(requests) if db_pid else None
    return {
        "nodes": nodes,
        "batches": len(requests),
        "refused": refused,
        "batches_per_s": round(len(requests) / wall, 1),
        "cpu_ms_per_batch": round(cpu_ms, 3),
        "loop_thread_ms_per_batch": round(loop_ms, 3),
        "other_threads_ms_per_batch": round(cpu_ms - loop_ms, 3),
        # The database server's CPU per batch (PostgreSQL: every backend of the replica).
        "db_cpu_ms_per_batch": None if db_ms is None else round(db_ms, 3),
        "loadavg_1m": os.getloadavg()[0],
    }


def _server_ack_buckets(url: str, token: str) -> dict[float, float]:
    """Cumulative counts of the coordinator's own receive-to-commit histogram."""
    req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("sentinel_coordinator_ack_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _bucket_quantile(
    before: dict[float, float], after: dict[float, float], q: float
) -> float | None:
    """Upper bound (ms) of the histogram bucket holding quantile q of the step's batches;
    None when it lies past the largest finite bucket (JSON has no infinity)."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    for le, count in delta.items():
        if total and count >= q * total:
            return None if le == float("inf") else le * 1000
    return None


def _holds(step: dict[str, Any]) -> bool:
    p99 = step["ack_ms_p99"]
    return p99 is not None and p99 <= P99_LIMIT_MS


class _LargestFile(threading.Thread):
    """The largest size a file reaches while the block runs (sampled 4 times a second)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.largest, self._done = path, 0, threading.Event()

    def __enter__(self) -> _LargestFile:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        while True:
            with contextlib.suppress(FileNotFoundError):
                self.largest = max(self.largest, self.path.stat().st_size)
            if self._done.wait(0.25):
                return


def _start_coordinator(
    state: Path, store_url: str | None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, int, int]:
    """The coordinator pinned to its core; (process, API port, ingest port) once it answers."""
    port, ingest = free_port(), free_port()  # the API, and the fleet's ingest listener
    argv = [
        sys.executable,
        "-m",
        "sentinel",
        "--log-level",
        "warning",
        "coordinator",
        "--listen",
        f"127.0.0.1:{port}",
        "--ingest-listen",
        f"127.0.0.1:{ingest}",
        "--state-dir",
        str(state),
    ]
    if store_url:
        argv += ["--store", store_url]
    coord = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        preexec_fn=lambda: os.sched_setaffinity(0, _cores()[0]),
    )
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return coord, port, ingest


def _paced_step(
    coord: subprocess.Popen,
    url: str,
    token: str,
    ingest: int,
    node_tokens: list[str],
    nodes: int,
    seconds: float,
    wal: Path | None,
) -> dict[str, Any]:
    proc = psutil.Process(coord.pid)
    hist0 = _server_ack_buckets(url, token)
    q: mp.Queue = mp.Queue()
    cpu0, t0 = proc.cpu_times(), time.perf_counter()
    loader = mp.Process(target=_loader, args=(ingest, node_tokens, nodes, seconds, q))
    with _LargestFile(wal or Path("/nonexistent")) as largest:
        loader.start()
        lat, late, elapsed = q.get()
        loader.join()
    hist1 = _server_ack_buckets(url, token)
    wall, cpu1 = time.perf_counter() - t0, proc.cpu_times()
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
    acked = hist1.get(float("inf"), 0.0) - hist0.get(float("inf"), 0.0)
    cpu_s = cpu1.user + cpu1.system - cpu0.user - cpu0.system
    cpu_ms = 1000 * cpu_s / max(acked, 1.0)
    rate = acked / elapsed  # what the coordinator acknowledged while the fleet sent
    return {
        "nodes": nodes,
        "batches_per_s": round(rate, 1),
        "events_per_s": round(9 * rate, 1),
        "ack_ms_p50": percentile_ms(lat, 0.5),
        "ack_ms_p99": percentile_ms(lat, 0.99),
        "cpu_core_fraction": round(cpu, 3),
        # CPU the coordinator spent per acknowledged batch, and the 1 Hz fleet one
        # core would carry at that cost: robust to a starved load generator.
        "cpu_ms_per_batch": round(cpu_ms, 3),
        "projected_nodes_per_core": int(1000 / cpu_ms) if cpu_ms > 0 else None,
        "server_ack_ms_p50_le": _bucket_quantile(hist0, hist1, 0.5),
        "server_ack_ms_p99_le": _bucket_quantile(hist0, hist1, 0.99),
        "loader_lag_ms_p99": percentile_ms(late, 0.99),
        # SQLite's write-ahead log stays bounded however long the load lasts.
        "wal_mib_max": round(largest.largest / 2**20, 1) if wal else None,
        "loadavg_1m": os.getloadavg()[0],
    }


def _measure_store(
    store_url: str | None,
    sizes: list[int],
    seconds: float,
    closed_loop: int | None,
    db_pid: int | None,
    drain_s: float | None = None,
) -> dict[str, Any]:
    """Paced steps (or the closed loop) against one coordinator on this store; with `drain_s`,
    each step with a drain pending that takes that long (`slow_drain.py`)."""
    state = Path(tempfile.mkdtemp(prefix="sentinel-bench-"))
    token, node_tokens = _make_tokens(state, store_url, max(sizes))
    env = slow_drain.coordinator_env(state, drain_s) if drain_s else None
    if env:
        os.environ.update(env)  # the stand-in reads them too, from the coordinator's environment
    coord, port, ingest = _start_coordinator(state, store_url, env)
    url = f"http://127.0.0.1:{port}"
    try:
        if closed_loop:
            return _closed_loop_step(ingest, coord.pid, node_tokens, sizes[0], closed_loop, db_pid)
        wal = None if store_url else wal_path(state / STORE_FILE)
        steps = []
        for i, nodes in enumerate(sizes):
            draining = slow_drain.start(url, token, state, i) if drain_s else None
            step = _paced_step(coord, url, token, ingest, node_tokens, nodes, seconds, wal)
            if draining:
                step["drain_pending_throughout"] = slow_drain.pending(state, draining)
            print(json.dumps(step), flush=True)
            steps.append(step)
            if not _holds(step) and nodes >= TARGET_NODES:  # always measure the target fleet
                break
    finally:
        stop_process(coord, 10.0)
    ok = [s for s in steps if _holds(s)]
    at_target = next((s for s in steps if s["nodes"] == TARGET_NODES), steps[-1])
    keys = (
        "events_per_s",
        "batches_per_s",
        "ack_ms_p50",
        "ack_ms_p99",
        "cpu_ms_per_batch",
        "projected_nodes_per_core",
        "cpu_core_fraction",
    )
    return {
        **{k: at_target[k] for k in keys},
        "fleet_nodes": at_target["nodes"],
        "max_nodes_at_1hz": max((s["nodes"] for s in ok), default=0),
        "steps": steps,
    }


PROJECTED_NODES = 12_500  # 100,000 GPUs at 8 a node, each node's batch once a second


def _projection(cost: dict[str, Any]) -> dict[str, Any]:
    """Cores a 100,000-GPU fleet needs on PostgreSQL, from the measured CPU per batch."""
    coord_ms, db_ms = cost["cpu_ms_per_batch"], cost["db_cpu_ms_per_batch"]
    per_replica = int(1000 / coord_ms)  # one core's batches a second at that cost
    replicas = -(-PROJECTED_NODES // per_replica)
    db_cores = PROJECTED_NODES * db_ms / 1000
    return {
        "nodes": PROJECTED_NODES,
        "coordinator_cpu_ms_per_batch": coord_ms,
        "db_cpu_ms_per_batch": db_ms,
        "replicas_needed": replicas,
        "db_cores_needed": round(db_cores, 1),
        "arithmetic": (
            f"replicas = ceil({PROJECTED_NODES} / floor(1000 / {coord_ms})) = {replicas};"
            f" database cores = {PROJECTED_NODES} x {db_ms} ms / 1000 ms = {db_cores:.1f}"
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0, help="per fleet size (>1)")
    ap.add_argument("--sizes", default="1024,2048,3072,4096", help="fleet sizes, ascending")
    ap.add_argument(
        "--closed-loop",
        type=int,
        metavar="N",
        help="instead of paced steps: N batches per node of the first size, sent back to back",
    )
    ap.add_argument(
        "--store",
        choices=["sqlite", "postgresql"],
        default="postgresql",
        help="postgresql (the default, what `make bench` runs): a throwaway server too, with "
        "SQLite's figures first in the same run, failover over --kills leader kills, a rolling "
        "restart and the projection to 100,000 GPUs; sqlite: SQLite's figures alone",
    )
    ap.add_argument("--kills", type=int, default=10, help="leader kills for the failover time")
    ap.add_argument(
        "--slow-drain",
        type=float,
        metavar="S",
        help="SQLite only: every paced step runs with a drain pending whose scontrol takes S s",
    )
    args = ap.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    _cores()
    sqlite = _measure_store(None, sizes, args.seconds, args.closed_loop, None, args.slow_drain)
    if args.store == "sqlite":
        print(json.dumps({**sqlite, "run_id": uuid.uuid4().hex[:8]}))
        return
    with ThrowawayPostgres() as pg:
        os.environ.update(pg.client_env())
        # The split: the coordinator on one core, the database and the load generator on the
        # other (forked from the postmaster, every backend inherits its affinity).
        db_pid = pg.postmaster_pid()
        os.sched_setaffinity(db_pid, _cores()[1])
        postgres = _measure_store(pg.dsn, sizes, args.seconds, args.closed_loop, db_pid)
        cost = postgres if args.closed_loop else _measure_store(pg.dsn, sizes[:1], 0, 20, db_pid)
        failover = measure_failover(pg, args.kills)
    print(
        json.dumps(
            {
                "sqlite": sqlite,
                "postgresql": postgres,
                "postgresql_cost": cost,
                "failover": failover,
                "projection_100k_gpus": _projection(cost),
                "cores": {"coordinator": sorted(_cores()[0]), "db_and_load": sorted(_cores()[1])},
                "run_id": uuid.uuid4().hex[:8],
            }
        )
    )


if __name__ == "__main__":
    main()
