"""What each repair cost, read from the supervisor's log and the trainer's step lines
(sentinel/lab/demo/repairs.py)."""

from __future__ import annotations

import json
from pathlib import Path

from sentinel.lab.demo.repairs import repair_costs, restarts
from sentinel.lab.sim.inject import Launch

NODES = ["node-0", "node-1"]


def _log(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")
    return path


def _gen(ts: float, number: int, nodes: list[str]) -> dict[str, object]:
    return {"ts": ts, "msg": f"launching generation {number}", "generation": number, "nodes": nodes}


def _warm(ts: float, number: int, reused: dict[int, bool]) -> dict[str, object]:
    ranks = [
        {"rank": r, "node": f"node-{r // 2}", "pid": 100 + r, "reused": u}
        for r, u in reused.items()
    ]
    return {
        "ts": ts,
        "msg": f"generation {number} on warm ranks",
        "generation": number,
        "ranks": ranks,
    }


def _exited(ts: float, ranks: list[tuple[int, str]]) -> dict[str, object]:
    exits = [{"rank": r, "node": n, "code": 1, "why": "its process ended"} for r, n in ranks]
    return {"ts": ts, "msg": f"ranks {[r for r, _ in ranks]} exited abnormally", "exits": exits}


def _restart(ts: float, incident: int, fault: str, path: str) -> list[dict[str, object]]:
    args = {"reason": f"incident {incident} ({fault})"}
    return [
        {"ts": ts, "msg": "command job.restart c1", "command_args": args},
        {"ts": ts + 0.01, "msg": f"restart by {path}", "path": path},
    ]


def test_a_warm_restart_keeps_every_survivor_and_reads_the_checkpoint(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "s.log",
        [
            _gen(0.0, 0, NODES),
            _warm(0.1, 0, dict.fromkeys(range(4), False)),
            _exited(9.6, [(1, "node-0")]),
            *_restart(10.0, 4, "rank_crash", "warm_restart"),
            _gen(11.0, 1, NODES),
            _warm(11.1, 1, {0: True, 1: False, 2: True, 3: True}),
        ],
    )
    found = restarts(log, t0=0.0)
    assert [(r.incident, r.fault, r.path, r.generation) for r in found] == [
        (4, "rank_crash", "warm_restart", 1)
    ]
    steps = [(9.0, 30, 0), (9.5, 31, 0), (12.5, 21, 1), (12.8, 22, 1)]
    launches = [
        Launch(main_t=0.2, rendezvous_s=0.1, load_s=0.0, ready_t=1.0, resume_step=0),
        Launch(main_t=11.2, rendezvous_s=0.1, load_s=0.4, ready_t=12.0, resume_step=20),
    ]
    # rank 1's process ended (the supervisor logged it): its new one is no survivor restarted
    (cost,) = repair_costs(found, steps, launches, gpus_per_node=2)
    assert cost == {
        "incident": 4,
        "fault": "rank_crash",
        "path": "warm_restart",
        "at": 10.0,
        "generation": 1,
        "survivor_stall_s": 3.0,
        "join_s": 2.5,
        "checkpoint_reads": 4,
        "survivors_restarted": 0,
    }


def test_a_cold_restart_restarts_every_survivor(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "s.log",
        [
            _gen(0.0, 0, NODES),
            *_restart(10.0, 2, "gpu_hardware", "restart"),
            _gen(11.0, 1, ["node-0", "spare-0"]),
        ],
    )
    found = restarts(log, t0=0.0)
    (cost,) = repair_costs(found, [(9.0, 5, 0), (20.0, 1, 1)], [], gpus_per_node=2)
    # node-1 left (its ranks are no survivors); node-0's two ranks got new processes
    assert cost["survivors_restarted"] == 2 and cost["path"] == "restart"
    assert cost["survivor_stall_s"] == 11.0 and cost["checkpoint_reads"] == 0


def test_a_process_that_ended_during_another_repair_is_no_survivor_restarted(
    tmp_path: Path,
) -> None:
    """A rank of replica 1 (job rank 3, its replica's rank 1 on node-1) dies while replica 0
    is repaired live: the next generation's new process for it is no survivor restarted,
    whichever incident the restart answers, and the dead process counts only until the
    generation after it."""
    log = _log(
        tmp_path / "s.log",
        [
            _gen(0.0, 0, NODES),
            *_restart(10.0, 2, "thermal", "live"),
            _gen(10.5, 1, ["spare-0", "node-1"]),
            _warm(10.6, 1, {0: False, 1: False, 2: True, 3: True}),
            _exited(10.8, [(3, "node-1")]),
            *_restart(11.0, 3, "gpu_hardware", "warm_restart"),
            _gen(11.5, 2, ["spare-0", "node-1"]),
            _warm(11.6, 2, {0: True, 1: True, 2: True, 3: False}),
            *_restart(20.0, 4, "gpu_hardware", "warm_restart"),
            _gen(20.5, 3, ["spare-0", "node-1"]),
            _warm(20.6, 3, {0: True, 1: True, 2: True, 3: False}),
        ],
    )
    found = restarts(log, t0=0.0)
    assert [r.died for r in found] == [frozenset(), frozenset({("node-1", 3)}), frozenset()]
    costs = repair_costs(found, [(9.0, 5, 0), (12.0, 6, 2), (21.0, 9, 3)], [], gpus_per_node=2)
    assert [c["survivors_restarted"] for c in costs] == [0, 0, 1]


def test_a_live_join_is_judged_before_the_next_repair(tmp_path: Path) -> None:
    """The struck replica was back before the survivors' next quorum (no narrow step): its join
    ends at the first full-width step after the decision; the next repair's narrow steps (a
    hang's warm restart) are that repair's."""
    log = _log(
        tmp_path / "s.log",
        [
            _gen(0.0, 0, NODES),
            *_restart(10.0, 5, "gpu_hardware", "live"),
            _gen(10.6, 1, ["spare-0", "node-1"]),
            _warm(10.7, 1, {0: False, 1: False}),
            *_restart(30.0, 6, "collective_hang", "warm_restart"),
            _gen(30.5, 2, ["spare-0", "node-1"]),
            _warm(30.6, 2, dict.fromkeys(range(4), True)),
        ],
    )
    steps = [(9.9, 77, 0), (11.8, 78, 1), (12.0, 79, 1), (31.5, 81, 2), (32.2, 83, 2)]
    widths = [(9.9, 2), (11.8, 2), (12.0, 2), (31.5, 1), (32.2, 2)]
    live, hang = repair_costs(restarts(log, t0=0.0), steps, [], 2, widths)
    assert live["join_s"] == 1.8 and hang["path"] == "warm_restart"


def test_a_joiner_ended_before_it_reported_read_no_checkpoint(tmp_path: Path) -> None:
    """A live repair's joiner is ended by the next repair (a warm restart from a checkpoint)
    before its launch report: the live repair read nothing; the reads are the warm restart's."""
    log = _log(
        tmp_path / "s.log",
        [
            _gen(0.0, 0, NODES),
            *_restart(10.0, 1, "gpu_hardware", "live"),
            _gen(10.2, 1, ["node-0", "spare-0"]),
            *_restart(10.3, 2, "gpu_hardware", "warm_restart"),
            _gen(11.0, 2, ["spare-1", "spare-0"]),
        ],
    )
    launches = [
        Launch(main_t=0.2, rendezvous_s=0.1, load_s=0.0, ready_t=1.0, resume_step=0, generation=0),
        Launch(
            main_t=11.1, rendezvous_s=0.1, load_s=0.5, ready_t=12.0, resume_step=20, generation=2
        ),
    ]
    steps = [(9.9, 25, 0), (12.5, 21, 2)]
    live, warm = repair_costs(restarts(log, t0=0.0), steps, launches, gpus_per_node=2)
    assert (live["checkpoint_reads"], warm["checkpoint_reads"]) == (0, 4)


def test_a_join_another_fault_cut_short_is_not_the_live_repairs_miss() -> None:
    """The spare heals from the other replica; a hang strikes that replica 3 s later, so the
    spare can join only through the hang's own repair, 20 s on: the live repair's entry names
    the hang, and the judge counts no miss for it. A join past its target with no other
    fault in its way stays a miss."""
    from sentinel.lab.demo.result import _repair_problems

    def live(join: float) -> dict[str, object]:
        return {
            "incident": 5,
            "path": "live",
            "at": 40.0,
            "survivor_stall_s": 1.5,
            "join_s": join,
            "checkpoint_reads": 0,
            "survivors_restarted": 0,
        }

    cut = live(20.0)
    assert _repair_problems([cut], [(30.0, "xid"), (43.0, "hang")]) == []
    assert cut["join_cut_short_by"] == "hang"
    assert _repair_problems([live(20.0)], [(30.0, "xid"), (70.0, "hang")]) == [
        "live repair of incident #5: the spare joined in 20.0 s (target 15 s)"
    ]
