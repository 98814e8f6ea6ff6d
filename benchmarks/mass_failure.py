"""Mass failure: 10% of a 2,048-node fleet fails within 30 s, through two real coordinator
replicas on a throwaway PostgreSQL and the exclude-file backend, and the leader is killed
(SIGKILL) in the middle of the storm.

The fleet: 2,048 nodes, each posting its agent's batch (a heartbeat and 8 GPU verdicts) once a
second on its own keep-alive connection with its own node token (`coordinator.py`'s load
generator), to the replica that is not killed, as agents that fail over would. The storm: 205
nodes (10%) each report an uncorrectable ECC error (XID 48, unhealthy), spread evenly over 30 s,
each through its own node's token. Halfway through, the leader is killed; the other replica
takes the lease when it runs out (`lease_ttl_s`, 5 s) and goes on. The eviction budget is 150
nodes a window (`--budget`): the first 150 are drained, the rest escalated to a person.

Measured: each drained node from its fault's acknowledgement to its line in the exclude file
(`drain_p90_s`, `drain_p99_s`; targets 5 and 10 s); the fleet's acknowledgements over the
storm (`ingest_ack_p99_ms`, target 50 ms as in `coordinator.py`); nodes drained and incidents
escalated (`evicted` must be the budget exactly, `escalated` the rest); drains made twice
(`actions_repeated`: a node with two eviction effects, or an incident whose eviction step ran to
its end twice); and acknowledged fault events the store lacks (`events_lost`). Also the machine's
load average. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from coordinator import _loader, _make_tokens
from failover import Replica, _fault, _leader, _wait
from stats import percentile, percentile_ms

from sentinel.lab.harness.postgres import ThrowawayPostgres
from sentinel.processes import stop_process

NODES = 2048
FAILING = NODES // 10
STORM_S = 30.0
TARGETS = {"drain_p90_s": 5.0, "drain_p99_s": 10.0, "ingest_ack_p99_ms": 50.0}


class _Drains(threading.Thread):
    """When each node first appears in the exclude file (read every 20 ms)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.seen, self.stop = path, dict[str, float](), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.path.exists():
                now = time.time()
                for line in self.path.read_text().splitlines():
                    self.seen.setdefault(line.strip(), now)
            time.sleep(0.02)


def _storm(
    survivor: Replica, tokens: list[str], failing: list[int], acked: dict[str, tuple[float, str]]
) -> None:
    """Each failing node's fault at its time, through its own token; when it was acknowledged."""
    start = time.time()
    for k, i in enumerate(failing):
        time.sleep(max(0.0, start + k * STORM_S / len(failing) - time.time()))
        body = _fault(f"node-{i}")
        while not survivor.post(tokens[i], body):
            time.sleep(0.05)
        event_id = json.loads(body)["events"][0]["id"]
        acked[f"node-{i}"] = (time.time(), event_id)


def _counts(dsn: str, acked_ids: list[str]) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:

        def one(sql: str, *params: object) -> int:
            row = conn.execute(sql, params or None).fetchone()
            return int(row[0]) if row else 0

        twice_effects = one(
            "SELECT count(*) FROM (SELECT target FROM effects WHERE kind = 'evict'"
            " GROUP BY target HAVING count(*) > 1) t"
        )
        twice_steps = one(
            "SELECT count(*) FROM (SELECT incident_id FROM audit WHERE what = 'action.evict_node'"
            " AND why LIKE %s GROUP BY incident_id HAVING count(*) > 1) t",
            "done%",
        )
        stored = one("SELECT count(*) FROM events WHERE id = ANY(%s)", acked_ids)
        results = conn.execute("SELECT result FROM actions WHERE state = 'escalated'").fetchall()
        why = Counter(
            re.sub(r"\d+", "N", str((r if isinstance(r, dict) else json.loads(r)).get("reason")))[
                :120
            ]
            for (r,) in results
        )
        return {
            "escalated": one("SELECT count(*) FROM incidents WHERE state = 'escalated'"),
            "escalated_because": dict(why.most_common(4)),  # type: ignore[dict-item]
            "actions_repeated": twice_effects + twice_steps,
            "events_lost": len(set(acked_ids)) - stored,
        }


def measure(budget: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="sentinel-mass-"))
    exclude = work / "exclude.txt"
    env = {
        "SENTINEL_COORDINATOR__EXCLUDE_FILE": str(exclude),
        "SENTINEL_COORDINATOR__EVICTION__MAX_PER_WINDOW": str(budget),
    }
    failing = list(range(0, NODES, NODES // FAILING))[:FAILING]
    with ThrowawayPostgres() as pg:
        os.environ.update(pg.client_env())
        _, tokens = _make_tokens(work, pg.dsn, NODES)
        group = [Replica(pg.dsn, env), Replica(pg.dsn, env)]
        loader: mp.Process | None = None
        try:
            for r in group:
                r.start()
            if not _wait(lambda: _leader(group) is not None, 30):
                raise RuntimeError("no replica leads")
            leader = _leader(group)
            assert leader is not None and leader.proc is not None
            survivor = next(r for r in group if r is not leader)
            q: mp.Queue = mp.Queue()
            window = STORM_S + 45.0
            loader = mp.Process(target=_loader, args=(survivor.port, tokens, NODES, window, q))
            loader.start()
            time.sleep(5.0)  # the fleet connected and steady before the storm
            drains = _Drains(exclude)
            drains.start()
            acked: dict[str, tuple[float, str]] = {}
            storm = threading.Thread(target=_storm, args=(survivor, tokens, failing, acked))
            storm_began = time.time()
            storm.start()
            time.sleep(STORM_S / 2)
            leader.proc.send_signal(signal.SIGKILL)
            killed_at = time.time() - storm_began
            leader.proc.wait()
            storm.join()
            _wait(lambda: len(drains.seen) >= min(budget, FAILING), 60)
            time.sleep(5.0)  # anything past the budget would show by now
            drains.stop.set()
            lat, late, _ = q.get(timeout=window + 60)
            loader.join()
            counts = _counts(pg.dsn, [eid for _, eid in acked.values()])
        finally:
            if loader is not None and loader.is_alive():
                loader.terminate()
            for r in group:
                stop_process(r.proc, 10.0)
    drain_s = [drains.seen[n] - acked[n][0] for n in drains.seen if n in acked]
    figures = {
        "drain_p90_s": round(percentile(drain_s, 0.9), 3) if drain_s else None,
        "drain_p99_s": round(percentile(drain_s, 0.99), 3) if drain_s else None,
        "ingest_ack_p99_ms": percentile_ms(lat, 0.99),
    }
    return {
        "nodes": NODES,
        "failed": len(acked),
        **figures,
        "drain_max_s": round(max(drain_s), 3) if drain_s else None,
        "ingest_ack_p50_ms": percentile_ms(lat, 0.5),
        "loader_lag_ms_p99": percentile_ms(late, 0.99),
        "evicted": len(drains.seen),
        **counts,
        "budget": {
            "max_per_window": budget,
            "evicted_exactly_the_budget": len(drains.seen) == min(budget, FAILING),
            "escalated_the_rest": counts["escalated"] == len(acked) - min(budget, len(acked)),
        },
        "leader_killed_at_s": round(killed_at, 2),
        "targets": TARGETS,
        "met": all(figures[k] is not None and figures[k] <= v for k, v in TARGETS.items())  # type: ignore[operator]
        and counts["actions_repeated"] == 0
        and counts["events_lost"] == 0
        and len(drains.seen) == min(budget, FAILING)
        and counts["escalated"] == len(acked) - min(budget, len(acked)),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=150, help="nodes the budget lets be evicted")
    args = ap.parse_args()
    print(json.dumps({**measure(args.budget), "run_id": uuid.uuid4().hex[:8]}))


if __name__ == "__main__":
    main()
