"""All-rank stacks without a gang: capturing this process's threads, grouping, rendering, and the
hang playbook's `evidence` and `teardown` steps on the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from coord_util import job_status, one, query
from test_coordinator_logic import heartbeat, setup

from sentinel.coordinator.core.operator import ack_command
from sentinel.coordinator.store import SqlStore
from sentinel.protocol import (
    MAX_STACK_FRAMES,
    EventBatch,
    EventKind,
    FrAnalysisPayload,
    RankFrDumpPayload,
    RankHangPayload,
    RankStacksPayload,
    Source,
    StackFrame,
    ThreadStack,
    make_event,
)
from sentinel.stacks.group import group, rank_ranges
from sentinel.stacks.render import render
from trainer_hooks.stacks import capture


def test_rank_ranges_are_runs() -> None:
    assert rank_ranges([7, 0, 1, 2, 3, 4, 5]) == "0-5,7"
    assert rank_ranges([3]) == "3" and rank_ranges([]) == ""
    assert rank_ranges([1, 2, 4, 5, 9, 1]) == "1-2,4-5,9"


def _answer(where: str, code: str = "") -> RankStacksPayload:
    frames = [
        StackFrame(file="t.py", line=i, func=f, code=code)
        for i, f in enumerate(["main", "train", where])
    ]
    return RankStacksPayload(
        request_id="r", pid=1, threads=[ThreadStack(name="MainThread", frames=frames)]
    )


def test_groups_put_the_odd_ones_out_first_and_list_the_silent() -> None:
    answers = [(r, _answer("all_reduce", code=f"pid {r}")) for r in (0, 2, 3, 5)]
    answers += [(4, _answer("save")), (1, _answer("barrier")), (1, _answer("late"))]
    grouped = group(answers, world_size=7)
    assert [g.ranks for g in grouped.groups] == [[1], [4], [0, 2, 3, 5]]  # the code text and
    assert grouped.missing == [6] and grouped.answered == 6  # a second answer do not count
    doc = {"job": "j", "request": "r", **grouped.as_json(), "elapsed_s": 1.0}
    text = render(doc)
    assert "6 of 7 rank(s) answered" in text and "NO ANSWER from ranks 6" in text
    order = [text.index(f"=== ranks {r} (") for r in ("1", "4", "0,2-3,5")]
    assert order == sorted(order) and "in barrier" in text


def _parked(event: threading.Event) -> None:
    event.wait()


def _deep(n: int, event: threading.Event) -> None:
    if n:
        _deep(n - 1, event)
    else:
        event.wait()


def test_capture_takes_every_thread_main_first_and_bounds_the_depth() -> None:
    release = threading.Event()
    threads = [
        threading.Thread(target=_parked, args=(release,), name="parked", daemon=True),
        threading.Thread(target=_deep, args=(200, release), name="deep", daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        got = capture("req-1", step=5)
    finally:
        release.set()
    names = [t.name for t in got.threads]
    assert names[0] == "MainThread" and {"parked", "deep"} <= set(names)
    by_name = {t.name: t for t in got.threads}
    assert by_name["parked"].frames[-3].func == "_parked"  # then Event.wait, Condition.wait
    deep = by_name["deep"]
    assert len(deep.frames) == MAX_STACK_FRAMES and deep.frames_left_out > 100
    assert deep.frames[-3].func == "_deep"  # the innermost frames are the ones kept
    assert got.request_id == "req-1" and got.step == 5
    assert len(got.model_dump_json()) < 1 << 20  # one line on the agent's socket


def test_hang_playbook_captures_evidence_then_tears_down_with_stage_times(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"], checkpoints=[10])

    def post(*events: object) -> None:
        ingest.ingest(EventBatch(events=list(events)), clock())  # type: ignore[arg-type]

    hang = make_event(
        EventKind.RANK_HANG,
        Source(node="node-0", rank=0, job="job1"),
        RankHangPayload(waited_s=90.0),
    )
    post(status, hang, heartbeat("node-0"), heartbeat("node-1"))  # each node's agent is up
    engine.tick()
    fr = one(store, "SELECT id FROM commands WHERE kind='fr.dump' AND target_kind='job'")["id"]
    clock.t += 4.0
    analysis = FrAnalysisPayload(verdict="hang", culprit_ranks=[1], check_id=fr)
    post(make_event(EventKind.FR_ANALYSIS, Source(job="job1"), analysis))
    engine.tick()  # analysed; the evidence is asked of every rank and of the culprit's node
    asked = query(store, "SELECT target, args FROM commands WHERE kind='stacks.dump' ORDER BY id")
    assert [a["target"] for a in asked] == ["node-0", "node-1"]
    rid = asked[0]["args"]["request_id"]
    kept = query(store, "SELECT target, args FROM commands WHERE kind='fr.dump' ORDER BY id")
    kept = [k for k in kept if not k["args"]["check_id"].startswith(fr)]
    check = kept[0]["args"]["check_id"]
    assert {a["args"]["purpose"] for a in kept} == {"evidence"}
    assert [k["target"] for k in kept] == ["job1", "node-0", "node-1"]
    node_asked = query(store, "SELECT target, args FROM commands WHERE kind='node.evidence'")
    assert node_asked == [{"target": "node-0", "args": {"check_id": check}}]  # the culprit's
    clock.t += 1.0
    answers = [
        make_event(
            EventKind.RANK_STACKS,
            Source(node=f"node-{r // 2}", rank=r, job="job1"),
            _answer("all_reduce" if r == 1 else "wait_elsewhere").model_copy(
                update={"request_id": rid}
            ),
        )
        for r in range(4)
    ]
    dumps = [
        make_event(
            EventKind.RANK_FR_DUMP,
            Source(node=f"node-{r // 2}", rank=r, job="job1"),
            RankFrDumpPayload(path=f"/fr/{r}", reason="command", check_id=check),
        )
        for r in range(4)
    ]
    post(*answers, *dumps[1:])
    engine.tick()  # rank 0, on the culprit's node, has not dumped: the step waits
    assert not query(store, "SELECT 1 FROM commands WHERE kind='job.stop'")
    post(dumps[0])
    engine.tick()  # every rank the repair ends wrote its part: captured; the gang is told to stop
    evidence = one(store, "SELECT result FROM actions WHERE action='evidence'")["result"]
    assert evidence["fr_dumped_ranks"] == "0-3" and evidence["timed_out"] == []
    assert evidence["captured_s"] == 1.0
    stacks = evidence["stacks"]
    assert stacks["missing_ranks"] == "" and [g["ranks"] for g in stacks["groups"]] == [
        "1",
        "0,2-3",
    ]
    stop = one(store, "SELECT id FROM commands WHERE kind='job.stop'")["id"]
    clock.t += 12.0
    teardown = {"processes": 4, "killed": [11], "survivors": [], "seconds": 10.4, "verified": True}
    ack_command(store, stop, True, {"state": "stopped", "teardown": teardown}, "job:job1", clock())
    engine.tick()
    done = one(store, "SELECT result FROM actions WHERE action='teardown'")["result"]
    assert done["teardown"] == teardown
    assert done["stages_s"] == {
        "dumps_saved_s": 4.0,
        "evidence_saved_s": 5.0,
        "all_ranks_gone_s": 17.0,
    }
    evict = one(store, "SELECT result FROM actions WHERE action='evict_node'")
    assert evict is not None  # the repair went on
    audited = query(store, "SELECT detail FROM audit WHERE what='action.teardown'")
    assert any(a["detail"].get("stages_s") for a in audited)


def test_a_rank_surviving_sigkill_escalates(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"])
    hang = make_event(
        EventKind.RANK_HANG,
        Source(node="node-0", rank=0, job="job1"),
        RankHangPayload(waited_s=90.0),
    )
    beats = [heartbeat("node-0"), heartbeat("node-1")]  # their agents are up, and will not answer
    ingest.ingest(EventBatch(events=[status, hang, *beats]), clock())
    engine.tick()
    fr = one(store, "SELECT id FROM commands WHERE kind='fr.dump' AND target_kind='job'")["id"]
    analysis = FrAnalysisPayload(verdict="hang", culprit_ranks=[1], check_id=fr)
    ingest.ingest(
        EventBatch(events=[make_event(EventKind.FR_ANALYSIS, Source(job="job1"), analysis)]),
        clock(),
    )
    engine.tick()
    engine.tick()
    assert one(store, "SELECT state FROM actions WHERE action='evidence'")["state"] != "done"
    clock.t += 3.0  # no agent answered the evidence commands: they relay to no rank
    engine.tick()
    evidence = one(store, "SELECT result FROM actions WHERE action='evidence'")["result"]
    stacks = evidence["stacks"]
    assert stacks["missing_ranks"] == "0-3" and stacks["answered"] == 0
    assert evidence["timed_out"] == [] and evidence["captured_s"] == 3.0
    stop = one(store, "SELECT id FROM commands WHERE kind='job.stop'")["id"]
    bad = {
        "processes": 4,
        "killed": [11, 12],
        "survivors": [12],
        "seconds": 15.0,
        "verified": False,
    }
    ack_command(store, stop, True, {"teardown": bad}, "job:job1", clock())
    engine.tick()
    assert one(store, "SELECT state FROM incidents")["state"] == "escalated"
    assert one(store, "SELECT 1 FROM actions WHERE action='evict_node'") is None
