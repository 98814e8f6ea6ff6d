"""Concurrent incidents of one job make one repair: a restart takes with it every node another
open repair has decided to evict, and that repair is closed as done by it (audited).

Real store (SQLite and PostgreSQL), real ingest and engine, the shipped playbooks: a straggler
on node-2 waits for the next checkpoint to be evicted (playbooks/straggler.yaml) while an SDC
on node-1 is diagnosed, drained and the job restarted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coord_util import ROOT, cfg, job_status, query, xid
from test_coordinator_logic import heartbeat
from test_evidence_bundle import _dumped, _stacks

from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.playbooks import load_playbooks
from sentinel.coordinator.store import SqlStore
from sentinel.protocol import (
    Event,
    EventBatch,
    EventKind,
    RankCrashPayload,
    RankSdcPayload,
    RankStragglerPayload,
    Source,
    make_event,
)

PLAYBOOKS = load_playbooks(ROOT / "playbooks")
NODES = ["node-0", "node-1", "node-2", "node-3"]  # ranks 0-7, two a node
SPARES = ["spare-0", "spare-1"]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _sdc(rank: int, step: int, digest: str, **kw: object) -> Event:
    payload = RankSdcPayload(step=step, digest=digest, **kw)  # type: ignore[arg-type]
    source = Source(node=NODES[rank // 2], rank=rank, job="job1")
    return make_event(EventKind.RANK_SDC, source, payload)


def _straggler(rank: int) -> Event:
    payload = RankStragglerPayload(step=12, slowdown=1.3)
    source = Source(node=NODES[rank // 2], rank=rank, job="job1")
    return make_event(EventKind.RANK_STRAGGLER, source, payload)


def _coordinator(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> tuple[SqlStore, Clock, Engine, Callable[..., None]]:
    """A store, a clock, the engine, and `feed(*events)`: ingest them, then one engine tick."""
    c = cfg(tmp_path)
    store, clock = new_store(), Clock()
    ingest = Ingestor(store, PLAYBOOKS, c)
    engine = Engine(store, PLAYBOOKS, c, make_backend(c), clock)

    def feed(*events: Event) -> None:
        ingest.ingest(EventBatch(events=list(events)), clock())
        engine.tick()

    return store, clock, engine, feed


def test_an_sdc_restart_takes_the_waiting_straggler_with_it_and_closes_its_repair(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, clock, engine, feed = _coordinator(tmp_path, new_store)

    def rows(sql: str) -> list[dict[str, object]]:
        return query(store, sql)

    feed(job_status("job1", NODES, SPARES, checkpoints=[10]))
    feed(_straggler(4))  # node-2 is slow: its repair waits for the next checkpoint
    (straggler,) = rows("SELECT id, state FROM incidents WHERE fault='straggler'")
    assert rows("SELECT status FROM runs") == [{"status": "waiting"}]
    clock.t += 5
    feed(_sdc(2, 14, "b", mismatch=True, mismatched_ranks=[2], suspect_since=10))
    (check,) = rows("SELECT id FROM commands WHERE kind='sdc.check' AND target='job1'")
    clock.t += 1
    feed(*[_sdc(r, 19, "d" if r == 2 else "c", check_id=check["id"]) for r in range(8)])
    # One restart, carrying both nodes out, each mapped to a spare.
    (restart,) = rows("SELECT args FROM commands WHERE kind='job.restart'")
    plan = restart["args"]
    assert sorted(plan["exclude"]) == ["node-1", "node-2"]  # type: ignore[index]
    assert sorted(plan["spare_map"]) == ["node-1", "node-2"]  # type: ignore[index]
    assert sorted(plan["spare_map"].values()) == SPARES  # type: ignore[index]
    evicted = rows("SELECT name FROM nodes WHERE state='evicted' ORDER BY name")
    assert [r["name"] for r in evicted] == ["node-1", "node-2"]
    # The straggler's repair is done, by the SDC repair's restart, and says so.
    run = rows(f"SELECT status FROM runs WHERE incident_id={straggler['id']}")
    assert run == [{"status": "done"}]
    (closed,) = rows(f"SELECT state FROM incidents WHERE id={straggler['id']}")
    assert closed["state"] == "mitigated"
    why = rows(f"SELECT why FROM audit WHERE incident_id={straggler['id']} AND what='run.done'")
    assert len(why) == 1 and "node-2 left with the restart of incident" in str(why[0]["why"])
    # The job comes back, checkpoints on: nothing restarts it again.
    clock.t += 30
    feed(job_status("job1", ["node-0", "spare-0", "spare-1", "node-3"], [], 1, checkpoints=[10]))
    clock.t += 30
    feed(
        job_status("job1", ["node-0", "spare-0", "spare-1", "node-3"], [], 1, checkpoints=[10, 30])
    )
    engine.tick()
    assert len(rows("SELECT id FROM commands WHERE kind='job.restart'")) == 1
    states = {r["status"] for r in rows("SELECT status FROM runs")}
    assert states == {"done"}


def _crash(rank: int) -> Event:
    payload = RankCrashPayload(exit_code=1, generation=0, checkpoint=20, resumed_from=0)
    source = Source(node=NODES[rank // 2], rank=rank, job="job1")
    return make_event(EventKind.RANK_CRASH, source, payload)


def test_a_restart_waits_for_an_older_repair_that_is_evicting_its_node(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """The straggler's checkpoint and a crash on another node arrive together: in one pass the
    straggler's repair starts draining node-2 (its eviction is its current step: it evicts and
    restarts on its own) while the crash's repair reaches its restart. The crash's restart
    waits for the straggler's, so no restart is sent with node-2 still in the job."""
    store, clock, engine, feed = _coordinator(tmp_path, new_store)

    def restarts() -> list[dict[str, object]]:
        rows = query(store, "SELECT args FROM commands WHERE kind='job.restart' ORDER BY id")
        return [r["args"] for r in rows]  # type: ignore[misc]

    feed(job_status("job1", NODES, SPARES, checkpoints=[10]))
    feed(_straggler(4))  # node-2's repair waits for the next checkpoint
    clock.t += 5
    feed(job_status("job1", NODES, SPARES, checkpoints=[10, 20]), _crash(2))
    (first,) = restarts()  # the straggler's; the crash's waits for its generation
    assert first["exclude"] == ["node-2"] and first["spare_map"] == {"node-2": "spare-0"}
    crashes = "SELECT status FROM runs r JOIN incidents i ON i.id = r.incident_id WHERE "
    crash = query(store, crashes + "i.fault = 'rank_crash'")
    assert crash == [{"status": "waiting"}]
    clock.t += 5
    moved = ["node-0", "node-1", "spare-0", "node-3"]
    feed(job_status("job1", moved, ["spare-1"], 1, checkpoints=[10, 20]))
    engine.tick()
    assert len(restarts()) == 2
    assert all("node-2" not in (r["exclude"] or []) for r in restarts()[1:])
    second = restarts()[1]
    assert second["spare_map"] == {} and second["exclude"] == [], second


def test_a_restart_waits_for_another_repairs_capture_before_taking_its_node_along(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """Two GPU faults moments apart, each repair capturing its node's ranks first. The first
    reaches its restart while the second still waits for node-2's ranks' dumps: taking node-2
    along now would end the very ranks it captures. It waits for that capture, which is whole;
    only then is a restart sent."""
    store, clock, engine, feed = _coordinator(tmp_path, new_store)

    def rows(sql: str) -> list[dict[str, object]]:
        return query(store, sql)

    feed(job_status("job1", NODES, SPARES, checkpoints=[10]), *[heartbeat(n) for n in NODES])
    feed(xid("node-1"), xid("node-2"))
    first, second = (int(str(r["id"])) for r in rows("SELECT id FROM runs ORDER BY incident_id"))
    for rank in (2, 3):  # node-1's ranks answer the first capture
        feed(_dumped(rank, f"run{first}-step0-evidence"), _stacks(rank, f"run{first}-step0-stacks"))
    clock.t += 0.5
    engine.tick()
    resume = rows(f"SELECT result FROM actions WHERE run_id={first} AND action='resume'")
    assert resume and resume[0]["result"] == {"after_capture_of": second}  # type: ignore[comparison-overlap]
    assert rows("SELECT id FROM commands WHERE kind='job.restart'") == []
    for rank in (4, 5):  # node-2's ranks answer the second
        feed(
            _dumped(rank, f"run{second}-step0-evidence"),
            _stacks(rank, f"run{second}-step0-stacks"),
        )
    for _ in range(4):
        clock.t += 0.2
        engine.tick()
    assert rows("SELECT id FROM commands WHERE kind='job.restart'")
    captured = rows(f"SELECT result FROM actions WHERE run_id={second} AND action='evidence'")
    assert captured[0]["result"]["fr_dumped_ranks"] == "4-5"  # type: ignore[index]
