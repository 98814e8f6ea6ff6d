"""Coordinator logic without a server: state machines, correlation, playbooks, safety rails."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from coord_util import ROOT, cfg, crash, execute, job_status, one, query, xid

from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core.auth import Principal, Role, TokenStore
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.playbooks import PlaybookError, load_playbook, load_playbooks
from sentinel.coordinator.core.retention import IDLE_CHECK_S, EventPruner
from sentinel.coordinator.core.states import INCIDENT as TRANSITIONS
from sentinel.coordinator.core.states import RUN as RUN_TRANSITIONS
from sentinel.coordinator.core.states import Entity, IncidentState, RunState, TransitionError, check
from sentinel.coordinator.runtime import Service
from sentinel.coordinator.store import SqliteStore, SqlStore, wal_path
from sentinel.coordinator.store.migrate import head, migrate, revision
from sentinel.protocol import Action as RecAction
from sentinel.protocol import (
    AgentHeartbeatPayload,
    Event,
    EventBatch,
    EventKind,
    GpuVerdict,
    NodeHealthPayload,
    NodeValidationPayload,
    RankFrDumpPayload,
    RankHangPayload,
    RankLaunchPayload,
    RankSdcPayload,
    RankStacksPayload,
    Source,
    ThreadStack,
    Verdict,
    make_event,
)

PLAYBOOKS = load_playbooks(ROOT / "playbooks")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def setup(
    tmp_path: Path, new_store: Callable[[], SqlStore], **kw: object
) -> tuple[SqlStore, Ingestor, Engine, Clock]:
    """A store on the test's backend (SQLite or PostgreSQL), ingest and engine on it."""
    c = cfg(tmp_path, **kw)
    store = new_store()
    clock = Clock()
    return (
        store,
        Ingestor(store, PLAYBOOKS, c),
        Engine(store, PLAYBOOKS, c, make_backend(c), clock),
        clock,
    )


def test_incident_transition_table() -> None:
    S = IncidentState
    check_transition = functools.partial(check, Entity.INCIDENT)
    check_run_transition = functools.partial(check, Entity.RUN)
    check_transition(S.OPEN, S.ACTING)
    check_transition(S.ACTING, S.MITIGATED)
    check_transition(S.ACTING, S.ESCALATED)
    with pytest.raises(TransitionError, match="resolved -> open"):
        check_transition(S.RESOLVED, S.OPEN)
    with pytest.raises(TransitionError):
        check_transition(S.OPEN, S.MITIGATED)  # mitigation needs an action first
    assert set(TRANSITIONS) == set(S) and not TRANSITIONS[S.RESOLVED]
    assert set(RUN_TRANSITIONS) == set(RunState)
    with pytest.raises(ValueError):
        check_run_transition(RunState.DONE, RunState.RUNNING)


def test_schema_is_versioned(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    assert revision(store) == head()
    assert one(store, "PRAGMA journal_mode")["journal_mode"] == "wal"
    store.close()
    assert migrate(SqliteStore(tmp_path / "c.db")) == head()  # reopening is a no-op


def test_the_wal_restarts_under_a_steady_stream_of_commits(tmp_path: Path) -> None:
    """A background checkpoint never catches up with commits made while it runs; unless the
    writer copies that remainder itself, the WAL grows with everything ever written."""
    store = SqliteStore(tmp_path / "c.db")
    store.start_checkpointer(every_s=0.02)
    wal = wal_path(store.path)
    row = "x" * 16_000  # four pages: a few frames per commit
    written = largest = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline or written < 2_000:
            with store.tx():
                store.audit(0.0, "test", "write", row)
            written += 1
            largest = max(largest, wal.stat().st_size)
    finally:
        store.close()  # the last connection to close removes the WAL
    # four frames of 4 KiB or more a commit: a WAL that never restarts holds them all
    assert largest < written * 16_000 / 4


def test_a_token_id_already_taken_is_drawn_again(
    new_store: Callable[[], SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = TokenStore(new_store())
    draws = iter(["0000beef", "0000beef", "0000beef", "0000cafe"])
    monkeypatch.setattr("secrets.token_hex", lambda _n: next(draws))
    first = tokens.create(Role.NODE, node="node-1")
    second = tokens.create(Role.NODE, node="node-2")  # met the first's id twice, then a new one
    assert (first[0], second[0]) == ("0000beef", "0000cafe")
    assert tokens.authenticate(f"Bearer {first[1]}").node == "node-1"  # type: ignore[union-attr]
    assert tokens.authenticate(f"Bearer {second[1]}").node == "node-2"  # type: ignore[union-attr]


def test_tokens_are_checked_in_memory_and_follow_other_writers(
    new_store: Callable[[], SqlStore],
) -> None:
    """Live tokens are held in memory (a request costs no store trip); a token made or revoked
    by another writer (the CLI, another replica) is seen at its first use or next reload."""
    store = new_store()
    ours, theirs = TokenStore(store), TokenStore(store)
    kept = ours.create(Role.NODE, node="node-1")
    ours.reload_if_revoked()
    assert ours.cached(f"Bearer {kept[1]}") == Principal(kept[0], Role.NODE, "node-1")
    assert ours.cached(f"Bearer {kept[1]}x") is None  # a held id with a wrong secret
    assert ours.authenticate(f"Bearer {kept[1]}x") is None
    late = theirs.create(Role.JOB, job="j")
    assert ours.cached(f"Bearer {late[1]}") is None  # not held yet: read from the store
    assert ours.authenticate(f"Bearer {late[1]}") == Principal(late[0], Role.JOB, job="j")
    assert theirs.revoke(kept[0])
    assert ours.cached(f"Bearer {kept[1]}") is not None  # until the next reload
    ours.reload_if_revoked()
    assert ours.cached(f"Bearer {kept[1]}") is None
    assert ours.authenticate(f"Bearer {kept[1]}") is None
    assert ours.authenticate(f"Bearer {late[1]}") is not None


def test_eight_gpus_one_node_is_one_incident_and_duplicates_are_ignored(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    fleet = job_status("j", [f"node-{i}" for i in range(4)], ["spare-0"])
    ingest.ingest(EventBatch(events=[fleet]), clock())
    events = [xid("node-3", gpu=g) for g in range(8)]
    r1 = ingest.ingest(EventBatch(events=events), clock())
    r2 = ingest.ingest(EventBatch(events=events), clock())  # replayed by a spooling agent
    assert (r1.accepted, r1.duplicates, len(r1.opened)) == (8, 0, 1)
    assert (r2.accepted, r2.duplicates, r2.opened) == (0, 8, [])
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 1
    assert one(store, "SELECT COUNT(*) n FROM runs")["n"] == 1
    assert one(store, "SELECT COUNT(*) n FROM events WHERE incident_id=1")["n"] == 8
    engine.tick()
    ingest.ingest(EventBatch(events=events), clock())  # replayed after the action ran
    engine.tick()
    evictions = query(store, "SELECT key FROM actions WHERE action='evict_node'")
    assert len(evictions) == 1
    assert (tmp_path / "state" / "exclude.txt").read_text().split() == ["node-3"]


def test_agent_and_trainer_reports_of_one_fault_are_one_incident(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, _, clock = setup(tmp_path, new_store)
    ingest.ingest(
        EventBatch(events=[job_status("job1", ["node-0", "node-1"], ["spare-0"])]), clock()
    )
    ingest.ingest(EventBatch(events=[xid("node-1", code=79)]), clock())
    # the ranks on that node die of it; the supervisor reports them
    ingest.ingest(EventBatch(events=[crash("node-1", 2), crash("node-1", 3)]), clock())
    rows = query(store, "SELECT fault, target, job FROM incidents")
    assert rows == [{"fault": "gpu_hardware", "target": "node-1", "job": "job1"}]
    assert one(store, "SELECT COUNT(*) n FROM events WHERE incident_id=1")["n"] == 3


def test_dbe_storm_evicts_within_budget_and_escalates_the_rest(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    nodes = [f"node-{i}" for i in range(50)]
    ingest.ingest(EventBatch(events=[xid(n) for n in nodes]), clock())
    engine.tick()
    evicted = query(store, "SELECT name FROM nodes WHERE state='evicted'")
    assert len(evicted) == 3  # max_per_window
    states = query(store, "SELECT state, COUNT(*) n FROM incidents GROUP BY state ORDER BY state")
    assert {r["state"]: r["n"] for r in states}["escalated"] == 47
    exclude = (tmp_path / "state" / "exclude.txt").read_text().split()
    assert sorted(exclude) == sorted(r["name"] for r in evicted)
    audit = query(store, "SELECT what FROM audit WHERE what='run.escalated'")
    assert len(audit) == 47
    clock.t += 3601  # a new window: an operator approves one escalated run, it goes through
    inc = one(store, "SELECT id FROM incidents WHERE state='escalated' LIMIT 1")["id"]
    execute(store, "UPDATE runs SET status='pending' WHERE incident_id=?", (inc,))
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM nodes WHERE state='evicted'")["n"] == 4


def test_a_spare_whose_agent_reported_first_is_still_a_spare(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    ingest.ingest(EventBatch(events=[xid("spare-0", code=13)]), clock())  # its agent, first
    fleet = job_status("job1", ["node-0", "node-1", "node-2"], ["spare-0"])
    ingest.ingest(EventBatch(events=[fleet, xid("node-1", code=79)]), clock())
    engine.tick()
    restart = one(store, "SELECT args FROM commands WHERE kind='job.restart'")
    assert restart["args"]["spare_map"] == {"node-1": "spare-0"}
    ingest.ingest(EventBatch(events=[fleet]), clock())  # a heartbeat from before the restart
    assert one(store, "SELECT state FROM nodes WHERE name='spare-0'")["state"] == "active"


def test_supervisor_resumes_from_committed_checkpoints_only(tmp_path: Path) -> None:
    from sentinel.supervisor.job import JobRecord, find_checkpoints

    for name in ("step-00000010", "step-00000020", "step-00000030"):
        (tmp_path / name).mkdir()
    for name in ("step-00000010", "step-00000020"):
        (tmp_path / name / "COMMITTED").touch()  # step 30 is torn: no marker
    (tmp_path / "step_40.json.tmp").touch()
    ckpts = find_checkpoints(tmp_path)
    assert sorted(ckpts) == [10, 20]
    job = JobRecord(nodes=["node-0", "node-1"], spares=["spare-0"], gpus_per_node=2)
    plan = {
        "exclude": ["node-1"],
        "spare_map": {"node-1": "spare-0"},
        "resume_before_step": 15,
        "skip_batches": [[12, 20]],
        "lr_scale": {"factor": 0.5, "steps": 10},
    }
    job.apply_restart(plan, ckpts)
    assert (job.nodes, job.spares, job.generation) == (["node-0", "spare-0"], [], 1)
    assert job.trainer_flags() == [
        "--resume-from",
        str(tmp_path / "step-00000010"),
        "--skip-batches",
        "12-20",
        "--lr-scale",
        "0.5:10",
    ]


def test_a_plan_that_shrinks_the_gang_is_refused_and_changes_nothing() -> None:
    from sentinel.supervisor.job import GangError, JobRecord

    job = JobRecord(nodes=["node-0", "node-1"], spares=[], gpus_per_node=2)
    with pytest.raises(GangError, match="node-1 out with no spare in its place: 1 of 2 nodes"):
        job.apply_restart({"exclude": ["node-1"], "spare_map": {}}, {})
    assert (job.nodes, job.generation, job.resume_from) == (["node-0", "node-1"], 0, None)


def test_min_fleet_is_never_crossed(tmp_path: Path, new_store: Callable[[], SqlStore]) -> None:
    from sentinel.config import EvictionBudgetConfig

    budget = EvictionBudgetConfig(max_per_window=10, window_s=60, min_fleet=2)
    store, ingest, engine, clock = setup(tmp_path, new_store, eviction=budget)
    ingest.ingest(EventBatch(events=[xid(f"node-{i}") for i in range(3)]), clock())
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM nodes WHERE state='active'")["n"] == 2


def test_a_node_a_spare_replaces_does_not_count_against_min_fleet(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """Both nodes of a two-node job fail at once, with two hot spares: each eviction brings a
    spare in, so neither leaves the fleet below min_fleet 1, although the first spare turns
    active only after its node has drained, while the second incident is already deciding."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    job = job_status("j", ["node-0", "node-1"], ["spare-0", "spare-1"])
    ingest.ingest(EventBatch(events=[job]), clock())
    ingest.ingest(EventBatch(events=[xid("node-0"), xid("node-1")]), clock())
    for _ in range(5):
        engine.tick()
    assert store.count_nodes(["evicted"]) == 2, query(store, "SELECT * FROM actions")
    assert query(store, "SELECT result FROM actions WHERE state='escalated'") == []
    assert store.count_nodes(["active"]) == 2  # the spares


def test_the_eviction_budget_as_a_share_of_the_fleet(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """10% of a 10-node fleet is one node per window, fewer than `max_per_window`'s 5: the
    second XID's eviction is refused and escalated, saying which cap it met."""
    from sentinel.config import EvictionBudgetConfig

    budget = EvictionBudgetConfig(max_per_window=5, max_percent=10, window_s=600)
    store, ingest, engine, clock = setup(tmp_path, new_store, eviction=budget)
    nodes = [f"node-{i}" for i in range(10)]
    ingest.ingest(EventBatch(events=[job_status("j", nodes, ["spare-0", "spare-1"])]), clock())
    ingest.ingest(EventBatch(events=[xid("node-1"), xid("node-2")]), clock())
    engine.tick()
    assert store.count_nodes(["evicted"]) == 1
    refused = query(store, "SELECT result FROM actions WHERE state='escalated'")
    assert "max 10% of 10 nodes = 1" in refused[0]["result"]["reason"]


def test_repeated_crash_on_one_node_escalates_to_eviction(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    ingest.ingest(
        EventBatch(events=[job_status("job1", ["node-0", "node-1"], ["spare-0"])]), clock()
    )
    ingest.ingest(EventBatch(events=[crash("node-1", 2)]), clock())
    ingest.ingest(
        EventBatch(events=[job_status("job1", ["node-0", "node-1"], ["spare-0"], 1)]), clock()
    )
    ingest.ingest(EventBatch(events=[crash("node-1", 3, generation=1)]), clock())
    books = [r["playbook"] for r in query(store, "SELECT playbook FROM incidents ORDER BY id")]
    assert books == ["rank_crash", "rank_crash_repeat"]
    engine.tick()
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
    cmd = query(store, "SELECT args FROM commands WHERE kind='job.restart' ORDER BY created_at")
    assert cmd[-1]["args"]["spare_map"] == {"node-1": "spare-0"}


def _crash_loop(
    ingest: Ingestor, engine: Engine, clock: Clock, gens: range, ckpts: list[int]
) -> None:
    """A job that dies at the same step after every restart, on node-1, before committing a
    checkpoint: each crash is reported, the engine acts, the supervisor comes back one
    generation later (its heartbeat) with the same checkpoints."""
    nodes, spares = ["node-0", "node-1"], ["spare-0"]
    for gen in gens:
        ingest.ingest(
            EventBatch(events=[job_status("job1", nodes, spares, gen, checkpoints=ckpts)]), clock()
        )
        ingest.ingest(
            EventBatch(events=[crash("node-1", 3, generation=gen, no_progress=gen > 0 or None)]),
            clock(),
        )
        engine.tick()
        clock.t += 30
        ingest.ingest(
            EventBatch(events=[job_status("job1", nodes, spares, gen + 1, checkpoints=ckpts)]),
            clock(),
        )
        engine.tick()
        clock.t += 30


def test_a_crash_that_comes_back_before_any_progress_stops_the_job_after_the_budget(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """A poison batch: the job crashes at the same step on every restart. Three restarts
    (the default budget) with no checkpoint committed since, then the fourth crash stops the
    job and escalates, with the restarts as its history; no node is evicted for it."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    _crash_loop(ingest, engine, clock, range(4), [3])
    incidents = query(store, "SELECT playbook, state FROM incidents ORDER BY id")
    assert [i["playbook"] for i in incidents] == ["rank_crash"] * 4
    assert [i["state"] for i in incidents] == ["mitigated"] * 3 + ["escalated"]
    restarts = query(store, "SELECT id FROM commands WHERE kind='job.restart'")
    assert len(restarts) == 3
    (stop,) = query(store, "SELECT args FROM commands WHERE kind='job.stop'")
    assert "restart budget spent: 3 restart(s) for rank_crash" in stop["args"]["reason"]
    last = query(store, "SELECT result FROM actions WHERE action='resume' ORDER BY id")[-1]
    assert last["result"]["newest_checkpoint"] == 3 and len(last["result"]["restarts"]) == 3
    assert store.count_nodes(["evicted", "draining"]) == 0


def test_a_committed_checkpoint_renews_the_restart_budget(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store, restart_budget=2)
    _crash_loop(ingest, engine, clock, range(2), [3])
    _crash_loop(ingest, engine, clock, range(2, 4), [3, 6])  # progress: two more restarts
    assert len(query(store, "SELECT id FROM commands WHERE kind='job.restart'")) == 4
    assert query(store, "SELECT id FROM commands WHERE kind='job.stop'") == []


def test_require_approval_holds_the_run_until_approved(tmp_path: Path) -> None:
    from sentinel.coordinator.core import operator as queries

    book = tmp_path / "books"
    book.mkdir()
    text = (ROOT / "playbooks" / "gpu_hardware_fault.yaml").read_text()
    (book / "hw.yaml").write_text(
        text.replace(
            "guards: {cooldown_s: 900}", "guards: {cooldown_s: 900, require_approval: true}"
        )
    )
    c = cfg(tmp_path)
    store = SqliteStore(tmp_path / "c.db")
    books = load_playbooks(book)
    ingest, engine = Ingestor(store, books, c), Engine(store, books, c, make_backend(c), time.time)
    ingest.ingest(
        EventBatch(events=[job_status("j", ["node-0", "node-1", "node-2"], []), xid("node-1")]), 1.0
    )
    engine.tick()
    assert one(store, "SELECT status FROM runs")["status"] == "awaiting_approval"
    assert one(store, "SELECT COUNT(*) n FROM actions")["n"] == 0

    queries.approve(store, 1, "operator:abc", 2.0)
    engine.tick()
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
    audit = query(store, "SELECT who, what FROM audit WHERE what='run.approve'")
    assert audit == [{"who": "operator:abc", "what": "run.approve"}]


def test_dry_run_changes_nothing(tmp_path: Path, new_store: Callable[[], SqlStore]) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store, dry_run=True)
    ingest.ingest(EventBatch(events=[xid("node-0"), xid("node-1")]), clock())
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM nodes WHERE state='evicted'")["n"] == 0
    assert not (tmp_path / "state" / "exclude.txt").exists()
    assert one(store, "SELECT COUNT(*) n FROM actions WHERE dry_run=1 AND state='done'")["n"] > 0
    assert {r["state"] for r in query(store, "SELECT state FROM incidents")} == {"open"}


def _history_samples(
    store: SqlStore, targets: dict[tuple[str, str], float] | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows of the stored history: {(sample name, sorted labels): value}."""
    from sentinel.coordinator.http.metrics import IncidentHistory

    history = IncidentHistory()
    history.store = store
    history.targets = targets or {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in history.collect()
        for sample in family.samples
    }


def test_a_repair_s_stages_are_histograms_per_playbook(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """An XID on a job's node, repaired with a spare: the run's decision and each of its steps
    are one observation each in `repair_stage_seconds{playbook, stage}`; the drain took the
    30 s the scheduler was slow (the clock moves while the drain is out)."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    ingest.ingest(EventBatch(events=[job_status("j", ["node-0", "node-1"], ["spare-0"])]), clock())
    ingest.ingest(EventBatch(events=[xid("node-1")]), clock())
    engine.tick()
    samples = _history_samples(store)
    name = "sentinel_coordinator_repair_stage_seconds_count"
    book = ("playbook", "gpu_hardware_fault")
    for stage in ("decide", "evict_node", "swap_spare", "rollback"):
        assert samples[(name, (book, ("stage", stage)))] == 1, stage
    assert (name, (book, ("stage", "resume"))) not in samples  # waits for the new generation
    ingest.ingest(
        EventBatch(events=[job_status("j", ["node-0", "spare-0"], [], generation=1)]), clock() + 30
    )
    clock.t += 30
    engine.tick()
    samples = _history_samples(store)
    assert samples[(name, (book, ("stage", "resume")))] == 1
    total = samples[("sentinel_coordinator_repair_stage_seconds_sum", (book, ("stage", "resume")))]
    assert total == pytest.approx(30.0)


def _launch(job: str, node: str, main_at: float) -> Event:
    """Rank 0's report of a new gang's start-up: rendezvous 2 s, load 3 s, ready 8 s after
    main, the first step done 2 s later."""
    payload = RankLaunchPayload(
        main_at=main_at,
        rendezvous_s=2.0,
        load_s=3.0,
        ready_at=main_at + 8,
        first_step_at=main_at + 10,
        resume_step=40,
    )
    return make_event(EventKind.RANK_LAUNCH, Source(node=node, rank=0, job=job), payload)


def test_a_relaunch_s_stages_are_recorded_with_its_incident(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """The new gang's launch report completes the repair's timeline: detected (the XID),
    decided, drained (the eviction), the restart, then the relaunch's own stages. They are
    stored with the incident (its API document shows them) and observed in
    `repair_stage_seconds`; a launch before any restart (the job's first), one from a node the
    job no longer runs on and a second report of the same relaunch record nothing."""
    from sentinel.coordinator.http import reads as queries

    store, ingest, engine, clock = setup(tmp_path, new_store)
    t0 = clock()
    ingest.ingest(EventBatch(events=[job_status("j", ["node-0", "node-1"], ["spare-0"])]), t0)
    ingest.ingest(EventBatch(events=[_launch("j", "node-0", t0 - 100)]), t0)
    assert store.repair_stages() == []  # the first launch: no repair relaunched it
    ingest.ingest(EventBatch(events=[xid("node-1", ts=t0 - 5)]), t0)
    engine.tick()
    clock.t += 30
    ingest.ingest(
        EventBatch(events=[job_status("j", ["node-0", "spare-0"], [], generation=1)]), clock()
    )
    engine.tick()
    # node-1 left the gang: it cannot speak for the job's relaunch.
    ingest.ingest(EventBatch(events=[_launch("j", "node-1", t0 + 5)]), clock())
    assert store.repair_stages() == []
    for _ in range(2):  # the same relaunch reported twice (a second event id)
        ingest.ingest(EventBatch(events=[_launch("j", "spare-0", t0 + 5)]), clock())
    (incident,) = store.incidents(10, None)
    (row,) = store.repair_stages(incident.id)
    assert row.playbook == "gpu_hardware_fault" and row.resume_step == 40
    assert row.detected_at == t0 - 5 and row.decided_at == t0 and row.restart_at == t0
    assert row.drained_at == t0  # the exclude-file backend drains at once
    assert (row.relaunched_at, row.rendezvoused_at) == (t0 + 5, t0 + 7)
    assert (row.checkpoint_loaded_at, row.first_step_at) == (t0 + 10, t0 + 15)
    doc = queries.incident(store, incident.id)
    assert doc is not None and doc["stages"][0]["first_step_at"] == t0 + 15
    targets = {("gpu_hardware_fault", "first_step"): 10.0, ("gpu_hardware_fault", "decide"): 5}
    samples = _history_samples(store, targets)
    book = ("playbook", "gpu_hardware_fault")
    for stage, seconds in (("rendezvous", 2.0), ("checkpoint_load", 3.0), ("first_step", 15.0)):
        key = (book, ("stage", stage))
        assert samples[("sentinel_coordinator_repair_stage_seconds_count", key)] == 1, stage
        assert samples[("sentinel_coordinator_repair_stage_seconds_sum", key)] == seconds
    over = "sentinel_coordinator_repair_stage_over_target_total"
    assert samples[(over, (book, ("stage", "first_step")))] == 1  # 15 s against 10
    assert samples[(over, (book, ("stage", "decide")))] == 0
    target = "sentinel_coordinator_repair_stage_target_seconds"
    assert samples[(target, (book, ("stage", "first_step")))] == 10.0


def test_a_timeline_without_a_drain_and_its_segments() -> None:
    """A restart that evicted nothing (rank_crash): no `drained`, and its segments go from the
    decision straight to the restart; a shadow step is no stage; a run without a live resume
    relaunched nothing."""
    from sentinel.coordinator.core.rows import RunContext, RunRow, StepRow
    from sentinel.coordinator.core.stages import milestones, segments, timeline
    from sentinel.coordinator.core.states import StepState

    def step(action: str, started: float, done: float, dry: bool = False) -> StepRow:
        return StepRow(
            0, action, 1, 7, action, None, {}, StepState.DONE, {}, dry, "c", started, done
        )

    run = RunRow(7, 1, "rank_crash", RunState.DONE, 2, RunContext(), False, 99.0, 99.0, None)
    launch = RankLaunchPayload(
        main_at=110.0,
        rendezvous_s=1.0,
        load_s=2.0,
        ready_at=115.0,
        first_step_at=116.0,
        resume_step=30,
    )
    steps = [
        step("evict_node", 99.0, 99.5, dry=True),
        step("rollback", 100.0, 100.0),
        step("resume", 101.0, 112.0),
    ]
    row = timeline(run, 98.0, steps, launch)
    assert row is not None and row.drained_at is None and row.decided_at == 100.0
    at = milestones(row)
    assert segments(at) == {
        "decide": 2.0,
        "prepare": 1.0,
        "relaunch": 9.0,
        "rendezvous": 1.0,
        "checkpoint_load": 2.0,
        "build_first_step": 3.0,
    }
    assert timeline(run, 98.0, steps[:2], launch) is None


def test_a_shadow_run_judges_the_rails_and_is_counted(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """Shadow mode (a dry run): the rails are judged as for real. The job has no spare, so the
    XID's run records that its eviction would escalate; nothing is drained, the incident stays
    open, and /metrics counts the run per playbook and mode, and the step it would have taken."""
    store, ingest, engine, clock = setup(tmp_path, new_store, dry_run=True)
    ingest.ingest(EventBatch(events=[job_status("j", ["node-0", "node-1"], [])]), clock())
    ingest.ingest(EventBatch(events=[xid("node-0")]), clock())
    engine.tick()
    assert store.count_nodes(["draining", "evicted"]) == 0
    (run,) = query(store, "SELECT status FROM runs")
    assert run["status"] == "escalated"
    (step,) = query(store, "SELECT result FROM actions WHERE action='evict_node'")
    assert step["result"]["dry_run"] == "would escalate"
    assert "no hot spare left to take node-0" in step["result"]["reason"]
    assert {r["state"] for r in query(store, "SELECT state FROM incidents")} == {"open"}
    samples = _history_samples(store)
    runs = ("mode", "shadow"), ("playbook", "gpu_hardware_fault"), ("status", "escalated")
    assert samples[("sentinel_coordinator_playbook_runs_total", runs)] == 1
    would = ("action", "evict_node"), ("playbook", "gpu_hardware_fault")
    assert samples[("sentinel_coordinator_shadow_actions_total", would)] == 1


def test_slurm_backend_against_a_stand_in_scontrol(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """A stand-in `scontrol` executable records its arguments (no Slurm on this machine)."""
    record = tmp_path / "args.txt"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    fake.chmod(0o755)
    _, ingest, engine, clock = setup(
        tmp_path, new_store, eviction_backend="slurm", scontrol=str(fake)
    )
    fleet = [f"node-{i}" for i in range(8)]
    ingest.ingest(EventBatch(events=[job_status("j", fleet, ["spare-0"]), xid("node-7")]), clock())
    engine.tick()
    assert record.read_text().strip() == (
        "update NodeName=node-7 State=DRAIN Reason=sentinel:1 GPU hardware fault"
    )


async def test_kubernetes_backend_against_a_local_api_server(tmp_path: Path) -> None:
    """A small local aiohttp server speaks the two Kubernetes API calls used (GET, PATCH node)."""
    import asyncio

    from aiohttp import web
    from loopback import serve

    from sentinel.coordinator.backends import KubernetesBackend

    calls: list[tuple[str, object]] = []
    node_doc = {"metadata": {"name": "node-2"}, "spec": {"taints": [{"key": "other"}]}}

    async def get(request: web.Request) -> web.Response:
        calls.append(("GET", request.headers.get("Authorization")))
        return web.json_response(node_doc)

    async def patch(request: web.Request) -> web.Response:
        calls.append((request.content_type, await request.json()))
        return web.json_response(node_doc)

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{name}", get)
    app.router.add_patch("/api/v1/nodes/{name}", patch)
    async with serve(app) as url:
        backend = KubernetesBackend(url, "tok", "sentinel.dev/evicted")
        await asyncio.to_thread(backend.evict, "node-2", "test")
    assert calls[0] == ("GET", "Bearer tok")
    kind, body = calls[1]
    assert kind == "application/strategic-merge-patch+json"
    assert body == {
        "spec": {
            "unschedulable": True,
            "taints": [
                {"key": "other"},
                {"key": "sentinel.dev/evicted", "value": "true", "effect": "NoSchedule"},
            ],
        }
    }


def test_playbook_check_reports_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nincident: {fault: x, scope: node}\ntrigger:\n  - kinds: [gpu.nope]\n"
        "steps:\n  - action: evict_node\n    params: {target: everyone}\n  - action: fly\n"
        "guards: {cooldown_s: 1, surprise: true}\n"
    )
    with pytest.raises(PlaybookError) as e:
        load_playbook(bad)
    text = "\n".join(e.value.errors)
    assert f"{bad}:4: trigger.0.kinds.0:" in text
    assert f"{bad}:7: steps.0.params.target: Input should be 'incident' or 'culprits'" in text
    assert f"{bad}:8: steps.1.action: Value error, unknown action 'fly'" in text
    assert f"{bad}:9: guards.surprise: Extra inputs are not permitted" in text
    done = subprocess.run(
        [sys.executable, "-m", "sentinel", "playbooks", "check", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown action 'fly'" in done.stderr
    budget = tmp_path / "budget" / "b.yaml"
    budget.parent.mkdir()
    budget.write_text(
        "name: b\nincident: {fault: x, scope: job}\ntrigger:\n  - kinds: [rank.crash]\n"
        "steps:\n  - {action: rollback}\n  - {action: resume, params: {budget: 0}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sentinel", "playbooks", "check", str(budget.parent)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert (
        f"{budget}:7: steps.1.params.budget: Input should be greater than or equal to 1"
        in done.stderr
    )
    ok = subprocess.run(
        [sys.executable, "-m", "sentinel", "playbooks", "check", str(ROOT / "playbooks")],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "gpu_hardware_fault: ok" in ok.stdout


def test_playbook_check_refuses_unknown_stages_and_targets_never_met(tmp_path: Path) -> None:
    """`stage_targets_s` names the playbook's own stages only (`decide`, its steps' actions,
    and the relaunch's when it resumes), with positive seconds, and a restart target no
    shorter than the parts it spans; each refusal names its file and line, exit 2."""
    head = (
        "incident: {fault: x, scope: job}\ntrigger:\n  - kinds: [rank.crash]\n"
        "steps:\n  - {action: evidence}\n  - {action: rollback}\n  - {action: resume}\n"
        "stage_targets_s:\n"
    )
    books = {
        "unknown": "  decide: 5\n  evict_node: 10\n",  # it evicts nothing
        "zero": "  first_step: 0\n",
        "never": "  rendezvous: 20\n  checkpoint_load: 15\n  first_step: 30\n",
    }
    for name, targets in books.items():
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\n{head}{targets}")
    (tmp_path / "good.yaml").write_text(
        "name: good\nincident: {fault: y, scope: job}\ntrigger:\n  - kinds: [rank.crash]\n"
        "steps:\n  - {action: evidence}\n  - {action: resume}\n"
        "stage_targets_s: {first_step: 60, rendezvous: 10}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sentinel", "playbooks", "check", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert f"{tmp_path}/unknown.yaml:11: stage_targets_s.evict_node: unknown stage" in err
    assert (
        "stages: decide, evidence, rollback, resume, bundle, rendezvous, checkpoint_load,"
        " first_step" in err
    )
    assert f"{tmp_path}/zero.yaml:10: stage_targets_s.first_step: Input should be greater" in err
    assert f"{tmp_path}/never.yaml:12: stage_targets_s.first_step: can never be met" in err
    assert "whose targets add up to 35 s" in err
    assert "good.yaml" not in err and "3 error(s)" in err
    good = load_playbook(tmp_path / "good.yaml")
    assert good.stage_targets_s == {"first_step": 60, "rendezvous": 10}
    assert good.all_stages() == [
        "decide",
        "evidence",
        "resume",
        "bundle",
        "rendezvous",
        "checkpoint_load",
        "first_step",
    ]


def test_coordinator_and_supervisor_never_import_torch() -> None:
    code = (
        "import sys, sentinel.coordinator.http.app, sentinel.coordinator.runtime, "
        "sentinel.supervisor.supervisor, sentinel.commands.coordinator_cmd; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _sdc(node: str, rank: int, step: int, digest: str, **kw: object) -> Event:
    payload = RankSdcPayload(step=step, digest=digest, **kw)  # type: ignore[arg-type]
    return make_event(EventKind.RANK_SDC, Source(node=node, rank=rank, job="job1"), payload)


def test_sdc_recompute_names_the_odd_node_and_rolls_back_before_the_last_clean_check(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    nodes = ["node-0", "node-0", "node-1", "node-1"]  # rank -> node
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"], checkpoints=[10, 20])
    ingest.ingest(EventBatch(events=[status]), clock())
    bad = _sdc("node-1", 2, 14, "b", mismatch=True, mismatched_ranks=[2], suspect_since=10)
    ingest.ingest(EventBatch(events=[bad]), clock())
    (inc,) = query(store, "SELECT first_step, detail FROM incidents")
    assert inc["first_step"] == 14 and inc["detail"]["suspect_since"] == 10
    engine.tick()
    (check,) = query(
        store, "SELECT id, args FROM commands WHERE kind='sdc.check' AND target='job1'"
    )
    clock.t += 1
    # The rest of the check that opened the incident arrives late: it is not a recompute.
    late = [_sdc(nodes[r], r, 14, "a", mismatched_ranks=[2]) for r in (0, 1, 3)]
    ingest.ingest(EventBatch(events=late), clock())
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM commands WHERE kind='job.restart'")["n"] == 0
    # The recompute, five steps on: one rank heard of it and quotes its id, the others do not.
    again = [
        _sdc(nodes[r], r, 19, "d" if r == 2 else "c", check_id=check["id"] if r == 0 else None)
        for r in range(4)
    ]
    ingest.ingest(EventBatch(events=again[:3]), clock())
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM commands WHERE kind='job.restart'")["n"] == 0
    ingest.ingest(EventBatch(events=again[3:]), clock())
    engine.tick()
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
    (restart,) = query(store, "SELECT args FROM commands WHERE kind='job.restart'")
    assert restart["args"]["spare_map"] == {"node-1": "spare-0"}
    assert restart["args"]["resume_before_step"] == 10  # the last clean check, not step 14 - 1

    # Repaired: the job runs again on the spare. A recompute answer that comes only now (a
    # late rank, a replayed spool) answers the coordinator's own question: it opens nothing.
    resumed = job_status("job1", ["node-0", "spare-0"], [], generation=1, checkpoints=[10, 20])
    ingest.ingest(EventBatch(events=[resumed]), clock())
    for _ in range(3):
        engine.tick()
    assert one(store, "SELECT state FROM incidents")["state"] == "mitigated"
    stale = _sdc("node-1", 2, 19, "d", mismatch=True, mismatched_ranks=[2], check_id=check["id"])
    ingest.ingest(EventBatch(events=[stale]), clock())
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 1
    # A rank's own check that disagrees still opens one.
    own = _sdc("spare-0", 2, 45, "e", mismatch=True, mismatched_ranks=[2], check_id="sdc-45")
    ingest.ingest(EventBatch(events=[own]), clock())
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 2


def _healthy(node: str, gpu: int) -> Event:
    gpus = [GpuVerdict(gpu=gpu, verdict=Verdict.HEALTHY, action=RecAction.NONE)]
    payload = NodeHealthPayload(verdict=Verdict.HEALTHY, action=RecAction.NONE, gpus=gpus)
    return make_event(EventKind.NODE_HEALTH, Source(node=node), payload)


def test_a_commit_group_stores_in_order_and_a_failing_batch_fails_alone(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, _, clock = setup(tmp_path, new_store)
    a = [_healthy("node-0", g) for g in range(3)]
    b = [a[1], _healthy("node-1", 0)]  # a[1] re-sent in another batch of the same group
    fault = [xid("node-2", code=79)]  # opens an incident: takes the per-batch path
    c = [a[2], fault[0], _healthy("node-3", 0)]
    with store.tx():
        out = ingest.ingest_group([EventBatch(events=e) for e in (a, b, fault, c)], clock())
    got = [(r.accepted, r.duplicates, len(r.opened)) for r in out]  # type: ignore[union-attr]
    assert got == [(3, 0, 0), (1, 1, 0), (1, 0, 1), (1, 2, 0)]
    assert one(store, "SELECT COUNT(*) n FROM events")["n"] == 6
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 1
    seen = {r["name"] for r in query(store, "SELECT name FROM nodes")}
    assert seen == {"node-0", "node-1", "node-2", "node-3"}
    # A batch the database refuses fails alone, its run's other batches are stored.
    if isinstance(store, SqliteStore):
        execute(
            store,
            "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.node='node-9'"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
    else:  # PostgreSQL
        execute(
            store,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.node = 'node-9' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
        )
        execute(
            store,
            "CREATE TRIGGER refuse BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse()",
        )
    good, bad = [_healthy("node-8", 0)], [_healthy("node-9", 0)]
    with store.tx():
        out = ingest.ingest_group([EventBatch(events=good), EventBatch(events=bad)], clock())
    assert out[0].accepted == 1 and isinstance(out[1], Exception)  # type: ignore[union-attr]
    assert one(store, "SELECT COUNT(*) n FROM events WHERE node IN ('node-8','node-9')")["n"] == 1
    assert one(store, "SELECT 1 AS x FROM nodes WHERE name='node-9'") is None


def heartbeat(node: str) -> Event:
    payload = AgentHeartbeatPayload(gpus=8, verdict=Verdict.HEALTHY, agent_version="t")
    return make_event(EventKind.AGENT_HEARTBEAT, Source(node=node), payload)


def test_events_past_the_retention_are_pruned_unless_an_incident_holds_them(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, _, clock = setup(tmp_path, new_store)
    week = 7 * 86400.0
    old_beats = [heartbeat(f"node-{i}") for i in range(5)]
    ingest.ingest(EventBatch(events=[*old_beats, xid("node-1")]), clock())  # the xid: an incident
    clock.t += 60
    ingest.ingest(EventBatch(events=[heartbeat("node-0")]), clock())
    pruned: list[int] = []
    pruner = EventPruner(store, week, chunk=2, on_prune=pruned.append)
    assert pruner.maybe_prune(clock.t) == 0  # nothing is a week old yet
    assert pruner._next_at == clock.t + IDLE_CHECK_S  # no backlog: look again later
    clock.t += week - 30  # the first batch is past the retention, the second is not
    for _ in range(10):  # a backlog is worked off pass after pass, two rows at a time
        pruner.maybe_prune(clock.t)
        if pruner._next_at > clock.t:
            break
    assert sum(pruned) == 5 and max(pruned) <= 2
    kinds = [r["kind"] for r in query(store, "SELECT kind FROM events ORDER BY seq")]
    assert kinds == ["node.health", "agent.heartbeat"]  # the incident's event and the newer one
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 1
    # A replay of a pruned event is new again (why no trigger window may outlast retention).
    assert ingest.ingest(EventBatch(events=old_beats[:1]), clock()).accepted == 1


def test_a_trigger_window_longer_than_the_retention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match=r"rank_crash_repeat: trigger window 3600 s"):
        Service(cfg(tmp_path, event_retention_s=600))


def test_a_node_that_keeps_being_evicted_is_a_lemon_until_a_person_clears_it(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """node-1 takes three XIDs, each repaired by an eviction (hardware evidence: 1.0 each). The
    operator's first two returns go through; at a blame of 3.0 (threshold 2.5) the third return
    escalates with the node's history, and the node stays evicted; asked again with
    `clear_lemon` (after a deep repair), it returns."""
    from sentinel.burnin.baseline import ValidationBaseline, save_validation_baseline
    from sentinel.config import ValidationConfig
    from sentinel.coordinator.core import operator as queries

    base = tmp_path / "base.json"
    save_validation_baseline(
        base,
        ValidationBaseline(
            gemm_s=0.002,
            gemm_size=384,
            loopback_gbps=1.0,
            loopback_bytes=1 << 24,
            sdc_digest="abc",
            device="cpu",
        ),
    )
    gate = ValidationConfig(baseline=base, hold_down_s=0)
    store, ingest, engine, clock = setup(tmp_path, new_store, validation=gate)

    def validated(node: str) -> None:
        """Its agent is healthy now and answers the return's validation with a pass."""
        ingest.ingest(EventBatch(events=[heartbeat(node)]), clock())
        engine.tick()
        rid = query(store, "SELECT id FROM commands WHERE kind='node.validate'")[-1]["id"]
        answer = NodeValidationPayload(request_id=rid, passed=True)
        ev = make_event(EventKind.NODE_VALIDATION, Source(node=node), answer)
        ingest.ingest(EventBatch(events=[ev]), clock())
        engine.tick()

    nodes = ["node-0", "node-1"]
    spares = [f"spare-{i}" for i in range(3)]
    returns = []
    for gen in range(3):
        ingest.ingest(EventBatch(events=[job_status("j", nodes, spares[gen:], gen)]), clock())
        ingest.ingest(EventBatch(events=[xid("node-1", ts=clock())]), clock())
        engine.tick()
        clock.t += 2.5  # node-1's agent, alive, never answers the evidence step: past its grace
        engine.tick()
        assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
        incident = query(store, "SELECT id FROM incidents ORDER BY id")[-1]["id"]
        body = {"node": "node-1"}
        queries.run_action(
            store, False, incident, "return_node", body, "reseated", "operator:o", clock()
        )
        engine.tick()
        if gen < 2:  # a lemon (the third) is held before any validation
            validated("node-1")
        returns.append(query(store, "SELECT status FROM runs ORDER BY id")[-1]["status"])
        clock.t += 1000  # past the playbook's cooldown: the next XID is a new episode
    assert returns == ["done", "done", "escalated"]
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
    (held,) = query(store, "SELECT result FROM actions WHERE state='escalated'")
    assert "node-1 is a lemon: blame 3 >= 2.5 within 60 days" in held["result"]["reason"]
    assert [h["fault"] for h in held["result"]["history"]] == ["gpu_hardware"] * 3
    incident = query(store, "SELECT id FROM incidents ORDER BY id")[-1]["id"]
    params = {"node": "node-1", "clear_lemon": True}
    queries.run_action(
        store, False, incident, "return_node", params, "GPU replaced", "operator:o", clock()
    )
    engine.tick()
    validated("node-1")
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "returned"


def test_circumstantial_blame_weighs_a_quarter_and_blame_ages_out() -> None:
    """Three evictions for hangs the node was only in the gang for weigh 0.75, far from the
    threshold; three for XIDs weigh 3.0, a lemon, until the window has passed."""
    from sentinel.faults import blame

    assert blame.confidence("collective_hang") == blame.LOW_CONFIDENCE
    assert blame.confidence("gpu_hardware") == blame.HIGH_CONFIDENCE
    policy = blame.LemonPolicy()
    hangs = [(t, blame.confidence("collective_hang")) for t in (0.0, 10.0, 20.0)]
    assert blame.lemon_score(hangs, 30.0, policy) == 0.75
    xids = [(t, blame.confidence("gpu_hardware")) for t in (0.0, 10.0, 20.0)]
    assert blame.lemon_score(xids, 30.0, policy) == 3.0 >= policy.threshold
    assert blame.lemon_score(xids, 30.0 + policy.window_s, policy) == 0.0  # all aged out


def peers_of(stuck: int) -> list[tuple[str, int]]:
    return [(f"node-{r // 2}", r) for r in range(4) if r != stuck]


def _stacks(node: str, rank: int, request_id: str) -> Event:
    thread = ThreadStack(name="MainThread", frames=[])
    payload = RankStacksPayload(request_id=request_id, pid=100 + rank, threads=[thread])
    return make_event(EventKind.RANK_STACKS, Source(node=node, rank=rank, job="job1"), payload)


def _dumped(node: str, rank: int, check_id: str) -> Event:
    payload = RankFrDumpPayload(path=f"/fr/{rank}", reason="command", check_id=check_id)
    return make_event(EventKind.RANK_FR_DUMP, Source(node=node, rank=rank, job="job1"), payload)


def _hang(node: str, rank: int, **kw: object) -> Event:
    payload = RankHangPayload(step=14, waited_s=15.0, timeout_s=15.0, **kw)  # type: ignore[arg-type]
    return make_event(EventKind.RANK_HANG, Source(node=node, rank=rank, job="job1"), payload)


def test_a_rank_its_agent_saw_hung_is_the_culprit_without_waiting_for_its_evidence(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """Rank 3 is stopped: its peers' watchdogs report the hang, its own cannot. Its agent
    reports it from outside (sentinel/agent/ranks/watch.py); the hang playbook takes the
    agent's word for the culprit instead of waiting for the flight-recorder analysis and the
    stacks a stopped rank will never give, and records the process state it saw."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"], checkpoints=[10])
    ingest.ingest(EventBatch(events=[status]), clock())
    peers = [_hang(node, rank) for node, rank in peers_of(3)]
    ingest.ingest(EventBatch(events=peers), clock())
    engine.tick()
    clock.t += 1
    engine.tick()
    assert one(store, "SELECT COUNT(*) n FROM commands WHERE kind='job.restart'")["n"] == 0
    seen = _hang("node-1", 3, observer="agent", process_state="T (stopped)", cpu_share=0.0)
    # a rank the agent saw asleep (its own watchdog late, say) is no culprit on that alone
    late = _hang("node-0", 0, observer="agent", process_state="S (sleeping)", cpu_share=0.01)
    ingest.ingest(EventBatch(events=[late, seen]), clock())
    assert one(store, "SELECT COUNT(*) n FROM incidents")["n"] == 1  # the same hang
    clock.t += 0.5
    engine.tick()  # the analysis is not waited for; the evidence is asked for
    asked = query(store, "SELECT args FROM commands WHERE kind='stacks.dump'")
    (ask,) = {c["args"]["request_id"] for c in asked}
    kept = query(store, "SELECT args FROM commands WHERE kind='fr.dump'")
    (check,) = {c["args"]["check_id"] for c in kept if c["args"].get("purpose") == "evidence"}
    answers = [_stacks(n, r, ask) for n, r in peers_of(3)]
    answers += [_dumped(n, r, check) for n, r in peers_of(3)]
    ingest.ingest(EventBatch(events=answers), clock())
    clock.t += 0.5
    engine.tick()
    (stop,) = query(store, "SELECT id FROM commands WHERE kind='job.stop'")
    store.ack_command(stop["id"], {"teardown": {"survivors": []}}, clock())  # the supervisor's
    for _ in range(4):
        clock.t += 0.5
        engine.tick()
    assert one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"] == "evicted"
    (restart,) = query(store, "SELECT args FROM commands WHERE kind='job.restart'")
    assert restart["args"]["spare_map"] == {"node-1": "spare-0"}
    steps = {r["action"]: r["result"] for r in query(store, "SELECT action, result FROM actions")}
    assert steps["fr_dump"]["culprit_nodes"] == ["node-1"]
    assert steps["fr_dump"]["silenced_ranks"] == {"3": "T (stopped), 0% of a core"}
    assert steps["evidence"]["silenced_ranks"] == {"3": "T (stopped), 0% of a core"}
    assert steps["evidence"]["timed_out"] == []
    assert clock.t - 1_000_000.0 < 10  # neither the analysis (120 s) nor the evidence (10 s)
