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
    # rank 1 crashed: its new process is not a survivor restarted
    (cost,) = repair_costs(found, steps, launches, {4: {1}}, gpus_per_node=2)
    assert cost == {
        "incident": 4,
        "fault": "rank_crash",
        "path": "warm_restart",
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
    (cost,) = repair_costs(found, [(9.0, 5, 0), (20.0, 1, 1)], [], {}, gpus_per_node=2)
    # node-1 left (its ranks are no survivors); node-0's two ranks got new processes
    assert cost["survivors_restarted"] == 2 and cost["path"] == "restart"
    assert cost["survivor_stall_s"] == 11.0 and cost["checkpoint_reads"] == 0
