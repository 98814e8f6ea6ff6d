"""`benchmarks/recovery.py`'s pure parts: step lines into commits, commits into each fault's
stall, a way's figures from its result.json, and the last line's shape, read back by the
reader `sentinel goodput --recovery-bench` uses. A whole run (four drills, ~15 minutes) is the
benchmark's, not a test's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sentinel.lab.goodput.recovery_bench import read_recovery_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "recovery_bench", ROOT / "benchmarks" / "recovery.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def steady(bench: ModuleType, steps: range, t0: float, step_s: float = 0.3) -> list[Any]:
    return [bench.Commit(t0 + i * step_s, s) for i, s in enumerate(steps)]


def test_a_fault_s_stall_is_the_longest_wait_between_commits_until_the_next_fault(
    bench: ModuleType,
) -> None:
    # Fault 1 strikes at step 50's commit; the survivors wait 35 s (collective timeout, then
    # the lighthouse's join timeout), step on, and wait 1 s more once before fault 2 strikes
    # at step 110, after which nothing commits again: fault 3 (step 170) is never reached.
    commits = steady(bench, range(1, 51), 10.0)  # step 50 at 24.7 s
    commits += steady(bench, range(51, 80), 24.7 + 35.0)
    commits += steady(bench, range(80, 111), commits[-1].t + 1.0)
    strikes = bench.strike_times(commits, [50, 110, 170])
    assert strikes[0] == pytest.approx(24.7) and strikes[2] is None
    assert strikes[1] == commits[-1].t
    assert bench.stalls_after(commits, strikes) == [35.0, None, None]


def test_a_rollback_s_replay_does_not_move_a_strike(bench: ModuleType) -> None:
    # A restart: step 50 commits, the job stalls 12 s, resumes from step 40's checkpoint and
    # replays 41..50: the fault struck at the first commit of step 50, and the step goes back.
    commits = steady(bench, range(1, 51), 0.0)
    commits += steady(bench, range(41, 61), commits[-1].t + 12.0)
    strikes = bench.strike_times(commits, [50])
    assert strikes == [commits[49].t]
    assert bench.stalls_after(commits, strikes) == [12.0]
    assert bench.step_at(commits, commits[49].t + 12.5) == 42


def test_step_lines_become_one_commit_per_step_at_its_commit_time(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Every replica writes each step; the quorum's first replica's line stands for it, at the
    trainer's commit time; heal, uncommitted and checkpoint lines are not steps."""
    metrics = tmp_path / "metrics.jsonl"
    t0 = 1_000.0
    lines: list[dict[str, Any]] = []
    for step, t in ((1, 1_001.0), (2, 1_001.5), (3, 1_037.25)):
        for replica, quorum_rank in ((0, 0), (1, 1), (2, 2)) if step < 3 else ((0, 0), (2, 1)):
            lines.append(
                {
                    "step": step,
                    "loss": 4.0,
                    "replica": replica,
                    "quorum_rank": quorum_rank,
                    "participants": 3 if step < 3 else 2,
                    "t": t + 0.125 * replica,
                }
            )
    lines.insert(4, {"uncommitted": {"step": 2, "error": "timeout", "t": 1_036.0}, "replica": 0})
    lines.append({"heal": {"step": 3, "from_step": 0, "quorum_s": 0.2}, "replica": 1})
    lines.append({"checkpoint": 20, "replica": 0, "wait_s": 0.0})
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "lo')
    follow = bench.Follow(metrics, t0)
    follow.tick()
    assert follow.commits == [bench.Commit(1.0, 1), bench.Commit(1.5, 2), bench.Commit(37.25, 3)]
    assert len(follow.load) == 1  # the load average, sampled as it follows


def result_json(
    path: str, stalls: list[float], joins: list[float], reads: int, restarted: int
) -> dict[str, Any]:
    repairs = [
        {
            "incident": 10 + i,
            "fault": "gpu_ecc_dbe",
            "path": path,
            "survivor_stall_s": s,
            "join_s": j,
            "checkpoint_reads": reads,
            "survivors_restarted": restarted,
        }
        for i, (s, j) in enumerate(zip(stalls, joins, strict=True))
    ]
    faults = [{"incident": 10 + i, "time_to_detect_s": 0.8} for i in range(3)]
    return {
        "verdict": "pass",
        "problems": [],
        "completed_steps": 210,
        "repairs": repairs,
        "faults": faults,
        "ledger_exact": True,
        "final_loss": 3.21,
        "reference_final_loss": 3.21,
    }


def test_the_last_line_has_one_object_per_way_and_the_goodput_reader_takes_it(
    bench: ModuleType, tmp_path: Path
) -> None:
    faults = bench.SCHEDULE["faults"]
    commits = steady(bench, range(1, 211), 0.0)
    results = {
        "restart": result_json("restart", [16.0, 15.1, 17.2], [15.0, 14.0, 16.0], 6, 4),
        "warm_restart": result_json("warm_restart", [4.1, 4.5, 3.9], [4.0, 4.4, 3.8], 6, 0),
        "live": result_json("live", [1.5, 1.6, 1.4], [1.3, 1.2, 1.3], 0, 0),
    }
    figures = {w: bench.way_figures(w, r, commits, faults) for w, r in results.items()}
    # Without detection: no repair; the first fault costs 35 s, the second stops training.
    shadow = steady(bench, range(1, 51), 0.0) + steady(bench, range(51, 111), 14.7 + 35.0)
    no_detection = {
        "verdict": "fail",
        "completed_steps": 110,
        "repairs": [],
        "faults": [],
        "ledger_exact": True,
        "final_loss": 3.9,
    }
    figures[bench.SHADOW] = bench.way_figures(bench.SHADOW, no_detection, shadow, faults)
    line = bench.summary(figures, [2.5, 3.0, 2.1], 30.0)

    live = line["live"]
    assert (live["stall_s"], live["join_s"], live["stall_s_max"], live["join_s_max"]) == (
        [1.5, 1.6, 1.4],
        [1.3, 1.2, 1.3],
        1.6,
        1.3,
    )
    assert (live["checkpoint_reads"], live["survivors_restarted"], live["paths"]) == (
        0,
        0,
        ["live"] * 3,
    )
    assert line["restart"]["checkpoint_reads"] == 18 and line["restart"]["wall_s"] == 62.7
    off = line[bench.SHADOW]
    assert off["stall_s"] == [35.0, None, None] and off["stall_s_max"] == 35.0
    assert (off["steps"], off["finished"], off["join_s_max"], off["repairs"]) == (
        110,
        False,
        None,
        0,
    )
    assert line["detection_saves_s"] == [33.5, None, None]
    assert line["live_targets_missed"] == []
    assert line["load_avg"] == [2.1, 3.0] and line["ft_timeout_s"] == 30.0
    for way in bench.WAYS:
        assert {
            "wall_s",
            "steps",
            "stall_s_max",
            "join_s_max",
            "checkpoint_reads",
            "ledger_exact",
            "final_loss",
            "stall_s",
            "join_s",
        } <= set(line[way])

    out = tmp_path / "recovery.txt"
    out.write_text("per way\n...\n" + json.dumps(line) + "\n")
    read, where = read_recovery_bench(out)
    assert (read.live.stall_s_max, read.live.join_s_max) == (1.6, 1.3)
    assert "load average [2.1, 3.0]" in where


def test_a_live_way_that_misses_its_targets_says_which(bench: ModuleType) -> None:
    commits = steady(bench, range(1, 211), 0.0)
    result = result_json("live", [1.5, 7.2, 1.4], [1.3, 18.0, 1.3], 2, 1)
    result["ledger_exact"] = False
    live = bench.way_figures("live", result, commits, bench.SCHEDULE["faults"])
    assert bench.live_misses(live) == [
        "survivors' stall 7.2 s (target <= 5 s)",
        "spare join 18.0 s (target <= 15 s)",
        "3 survivor processes restarted (target 0)",
        "6 checkpoint reads (target 0)",
        "the token ledger is not exact",
    ]


def test_the_progress_table_shows_each_way_s_step_every_few_seconds(bench: ModuleType) -> None:
    fast = bench.since_first(steady(bench, range(1, 101), 5.0, step_s=0.5))  # 49.5 s
    slow = bench.since_first(steady(bench, range(1, 41), 9.0, step_s=1.0))  # 39 s
    header, rows = bench.progress_rows({"live": fast, "restart": slow})
    assert header == ["seconds", "live", "restart"]
    assert rows[0] == ["0", 1, 1] and rows[1] == ["5", 11, 6] and rows[-1] == ["50", 100, 40]
    text = bench.table(header, [*rows, ["55", None, None]])
    assert text[0].split() == ["seconds", "live", "restart"] and text[-1].split() == [
        "55",
        "-",
        "-",
    ]


def test_the_schedule_is_a_valid_scenario_of_stalling_node_faults(bench: ModuleType) -> None:
    from sentinel.scenario import NODE_FAULTS, Scenario

    scenario = Scenario.model_validate(bench.SCHEDULE)
    assert scenario.trainer.steps >= 200 and scenario.trainer.dp >= 3 and scenario.trainer.tp == 2
    assert len(scenario.faults) >= 3
    assert all(isinstance(f, NODE_FAULTS) and f.stalls for f in scenario.faults)
    assert len({f.node for f in scenario.faults if isinstance(f, NODE_FAULTS)}) == 3
