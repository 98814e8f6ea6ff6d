"""Burn-in judgement, schedules, the simulated GPU's clock and CLI input checks: no process
group."""

from __future__ import annotations

import io
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sentinel.burnin import links, sdc, stragglers
from sentinel.burnin.collectives import bus_factor, elements
from sentinel.burnin.comm import Compute
from sentinel.burnin.faults import FaultyCompute, RankFaults
from sentinel.burnin.progress import Progress
from sentinel.burnin.report import Findings, assemble, baseline_from, load_baseline, render
from sentinel.burnin.settings import BurninSettings, Thresholds, parse_size
from sentinel.cli import main
from sentinel.exitcodes import InputError

TH = Thresholds()


def test_bus_factors_match_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == bus_factor("sendrecv", 8) == 1.0
    assert elements(4096, 3) % 3 == 0 and elements(10, 8) == 8


@pytest.mark.parametrize("n", [2, 4, 5, 8, 9])
def test_circle_schedule_covers_every_pair_once(n: int) -> None:
    nodes = [f"node-{k}" for k in range(n)]
    rounds = links.circle_rounds(nodes)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, seen)) == sorted(
        map(sorted, map(frozenset, itertools.combinations(nodes, 2)))
    )
    for r in rounds:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))  # no node twice in a round


def _ring_measure(speed: dict[str, float], log: list[list[list[str]]]):
    def measure(groups: list[list[str]]) -> list[float]:
        log.append(groups)
        used = [x for g in groups for x in g]
        assert len(used) == len(set(used)), "a node in two concurrent groups"
        return [min(speed[x] for x in g) * random.uniform(0.97, 1.03) for g in groups]

    return measure


@pytest.mark.parametrize("n,bad", [(4, 3), (16, 11), (37, 0), (1024, 517)])
def test_bisection_finds_the_bad_node_in_log_rounds(n: int, bad: int) -> None:
    speed = {f"node-{k}": 1.0 for k in range(n)}
    speed[f"node-{bad}"] = 0.25
    log: list[list[list[str]]] = []
    found = links.bisect(list(speed), _ring_measure(speed, log), 0.3)
    assert found.found == f"node-{bad}"
    assert found.rounds == len(log) <= links.bisection_round_bound(n)
    assert len(links.circle_rounds(list(speed))) >= n - 1  # what the circle search would need


def test_bisection_on_a_clean_fleet_stops_after_one_round() -> None:
    speed = {f"node-{k}": 1.0 for k in range(8)}
    found = links.bisect(list(speed), _ring_measure(speed, []), 0.3)
    assert found.found is None and found.rounds == 1 and "no single bad node" in found.note


def _matrix(n: int, slow: str | None, rng: random.Random) -> dict[links.Pair, float]:
    nodes = [f"node-{k}" for k in range(n)]
    return {
        (a, b): (0.023 if slow in (a, b) else 1.0) * rng.uniform(0.85, 1.15)
        for a, b in itertools.combinations(nodes, 2)
    }


@pytest.mark.parametrize("n", [3, 4, 8])
def test_link_judge_flags_only_the_slow_node(n: int) -> None:
    rng = random.Random(n)
    nodes = [f"node-{k}" for k in range(n)]
    v = links.judge_matrix(nodes, _matrix(n, "node-1", rng), TH)
    assert list(v.node_reasons) == ["node-1"]
    assert "links slow" in v.node_reasons["node-1"][0]
    failing = {(r["a"], r["b"]) for r in v.rows if r["verdict"] == "fail"}
    assert failing and all("node-1" in p for p in failing)
    assert not links.judge_matrix(nodes, _matrix(n, None, rng), TH).node_reasons


def test_link_judge_uses_the_baseline() -> None:
    nodes = ["node-0", "node-1"]
    m = {("node-0", "node-1"): 0.5}
    assert not links.judge_matrix(nodes, m, TH).node_reasons  # two nodes: nothing to compare
    v = links.judge_matrix(nodes, m, TH, baseline={"node-0": 1.0, "node-1": 1.0})
    assert set(v.node_reasons) == {"node-0", "node-1"}
    assert "-50%" in v.node_reasons["node-0"][0]


def _timings(
    slow: dict[int, float], n: int = 8, rounds: int = 40, seed: int = 3
) -> list[stragglers.RankTiming]:
    """Rounds under a load that comes and goes (+-30%, shared by all), and +-2% per rank."""
    rng = random.Random(seed)
    load = [rng.uniform(0.85, 1.3) for _ in range(rounds)]
    return [
        stragglers.RankTiming(
            tuple(1e-3 * slow.get(r, 1.0) * x * rng.uniform(0.98, 1.02) for x in load),
            tuple(20.0 / x * rng.uniform(0.98, 1.02) for x in load),
        )
        for r in range(n)
    ]


def test_straggler_judge_flags_five_percent_and_nothing_on_clean() -> None:
    flagged, reasons = stragglers.judge(_timings({6: 1.05}), TH)
    assert flagged == [6] and "against the other ranks" in reasons[6]
    assert stragglers.judge(_timings({}), TH)[0] == []
    err = [*_timings({})[:7], stragglers.RankTiming(error="Xid 79")]
    assert stragglers.judge(err, TH)[0] == [7]


def test_a_second_pass_confirms_a_slow_gpu_and_clears_a_busy_moment() -> None:
    """The first pass flags rank 6 (5% slow). Pooled with a second pass in which it is slow
    again, it stays flagged; pooled with one in which it is not (the first was a busy moment
    for it), it is cleared, because it was slow in only half of the rounds."""
    first = _timings({6: 1.05})
    assert stragglers.judge(first, TH)[0] == [6]
    again = stragglers.pooled(first, _timings({6: 1.05}, seed=4))
    kept = stragglers.confirm([6], again, TH)
    assert list(kept) == [6] and "confirmed over two passes (80 rounds)" in kept[6]
    assert stragglers.confirm([6], stragglers.pooled(first, _timings({}, seed=4)), TH) == {}
    failed = [*_timings({})[:7], stragglers.RankTiming(error="Xid 79")]
    assert stragglers.pooled(failed, _timings({}))[7].error == "Xid 79"


def test_a_rank_just_under_the_line_is_measured_again_not_passed() -> None:
    """A pass that puts a rank 3% over its peers (threshold 4%) does not flag it, but does not
    clear it either: it is near the line and judged again on both passes. A clean pass names
    nobody near it."""
    first = _timings({6: 1.03})
    assert stragglers.judge(first, TH)[0] == []
    assert stragglers.near_the_line(first, TH) == [6]
    assert stragglers.near_the_line(_timings({}), TH) == []
    pooled = stragglers.pooled(first, _timings({6: 1.07}, seed=4))
    assert list(stragglers.confirm([6], pooled, TH)) == [6]


def test_round_scores_are_medians_of_ratios_to_the_other_ranks_median() -> None:
    assert stragglers.round_scores({0: [1.0, 2.0], 1: [1.1, 2.2], 2: [0.9, 1.8]}) == {
        0: 1.0,
        1: pytest.approx(1.1 / 0.95),
        2: pytest.approx(0.9 / 1.05),
    }
    # four ranks, one 10% slow in every round: scored 1.10, not against a median it raised
    rounds = {0: [1.0, 1.0], 1: [1.1, 1.1], 2: [0.98, 1.02], 3: [1.02, 0.98]}
    assert stragglers.round_scores(rounds)[1] == pytest.approx(1.1)


def test_a_simulated_gpus_clock_counts_its_own_work_only() -> None:
    """A CPU rank's clock is its CPU time: time the rank spends off the CPU (asleep
    here; on a shared machine, while the scheduler runs other processes) is not GEMM time."""
    cpu = Compute(torch.device("cpu"))
    _, asleep = cpu.timed(time.sleep, 0.2)
    assert asleep < 0.02
    a = torch.randn(256, 256)
    _, busy = cpu.timed(lambda: [cpu.matmul(a, a) for _ in range(20)])
    assert busy > 0


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Arithmetic on one thread, as a CPU burn-in rank runs it (runner._setup)."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


def test_a_straggler_fault_costs_work_in_proportion(one_thread: None) -> None:
    """A 1.5x straggler's product costs half as much again of its own clock: extra busy work,
    not a sleep, so the CPU-time clock sees it.

    Each slowed product is paired with a plain one run just before it: this VM's vCPUs change
    speed in spells of 0.2-1 s, so two sets measured one after the other can sit in different
    spells (a 1.18x ratio once in CI), while a pair a millisecond apart shares one. The pairs
    alternate which runs first, so a cache warmed by the first favours neither."""
    cpu, dev = Compute(torch.device("cpu")), torch.device("cpu")
    slow = FaultyCompute(dev, RankFaults(slowdown=1.5))
    a = torch.randn(256, 256)
    ratios = []
    for i in range(25):
        first, second = (cpu, slow) if i % 2 else (slow, cpu)
        t_first, t_second = first.timed(first.matmul, a, a)[1], second.timed(second.matmul, a, a)[1]
        plain, slowed = (t_first, t_second) if first is cpu else (t_second, t_first)
        ratios.append(slowed / plain)
    assert 1.35 < statistics.median(ratios) < 1.7


def test_sdc_judge_majority_and_self_mismatch() -> None:
    d = [sdc.RankDigest("aa", "aa", "cpu") for _ in range(6)]
    d[2] = sdc.RankDigest("bb", "bb", "cpu")
    d[4] = sdc.RankDigest("aa", "cc", "cpu")
    flagged, reasons = sdc.judge(d)
    assert flagged == [2, 4]
    assert "differs from 5/6" in reasons[2] and "own repeat" in reasons[4]
    assert sdc.judge([sdc.RankDigest("aa", "aa", "cpu")] * 4)[0] == []


def test_report_contract_and_summary(tmp_path: Path) -> None:
    f = Findings(["node-0", "node-0", "node-1", "node-1"])
    f.blame_rank(3, "SDC: digest differs")
    rep = assemble(f, {"phases": ["sdc"], "sdc": {"mismatched_ranks": [3]}})
    assert rep["verdict"] == "fail" and rep["exclude"] == ["node-1"]
    assert rep["nodes"]["node-1"]["reasons"] == ["rank 3 (local 1): SDC: digest differs"]
    assert rep["nodes"]["node-0"] == {"verdict": "pass", "reasons": [], "ranks": [0, 1]}
    for key in ("collectives", "links", "stragglers", "sdc", "exclude", "nodes", "verdict"):
        assert key in rep
    assert "node-1       fail" in render(rep)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(baseline_from(rep)))
    assert load_baseline(path)["world_size"] == 4


def test_bad_baseline_and_sizes_are_input_errors(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    bad.write_text('{"version": 99}')
    with pytest.raises(InputError, match="not a burn-in baseline"):
        load_baseline(bad)
    with pytest.raises(InputError, match="bad size"):
        parse_size("12Q")
    assert parse_size("16M") == 16 << 20
    s = BurninSettings()
    assert BurninSettings.from_json(s.to_json()) == s
    assert s.sizes()[0] == 4096 and s.sizes()[-1] == 16 << 20


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "nothing to test"),
        (["--sim-nodes", "1"], "at least 2 ranks"),
        (["--sim-nodes", "2", "--phases", "links,bogus"], "unknown phase"),
        (["--sim-nodes", "2", "-b", "1M", "-e", "4K"], "exceeds"),
        (["--sim-nodes", "2", "--scenario", "/nonexistent.yaml"], "no scenario file"),
        (["--sim-nodes", "2", "--json", "/nonexistent/dir/r.json"], "directory does not exist"),
        (["--sim-nodes", "2", "--link-tolerance", "3"], "between 0 and 1"),
    ],
)
def test_bad_usage_exits_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert main(["burnin", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_one_rank_launch_is_refused_before_any_collective(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun with one process (a one-GPU node): NCCL cannot send to a peer that is not
    there (seen on an H200: an internal NCCL error mid-sweep), so the launch is refused."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["burnin", "--quick"]) == 2
    assert "WORLD_SIZE is 1" in capsys.readouterr().err


def test_scenario_fleet_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("fleet: {nodes: 4, gpus_per_node: 2}\ntrainer: {tp: 2, pp: 2, dp: 2}\n")
    assert main(["burnin", "--scenario", str(sc), "--sim-nodes", "3"]) == 2
    assert "make them agree" in capsys.readouterr().err


def test_cli_modules_do_not_import_torch() -> None:
    code = (
        "import sys, sentinel.cli, sentinel.commands.burnin_cmd, sentinel.burnin.cli, "
        "sentinel.lab.sim.burnin; sentinel.cli.build_parser(); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _CorruptingComm:
    """Wraps a Comm and flips one element of every result, as a bad transport would."""

    def __init__(self, comm: object) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> object:
        return getattr(self._comm, name)

    def _corrupt(self, t: object) -> None:
        t.view(-1)[-1] += 1  # type: ignore[attr-defined]

    def all_reduce(self, t: object) -> None:
        self._comm.all_reduce(t)  # type: ignore[attr-defined]
        self._corrupt(t)

    def all_gather(self, out: object, t: object) -> None:
        self._comm.all_gather(out, t)  # type: ignore[attr-defined]
        self._corrupt(out)

    def reduce_scatter(self, out: object, t: object) -> None:
        self._comm.reduce_scatter(out, t)  # type: ignore[attr-defined]
        self._corrupt(out)

    def all_to_all(self, out: object, t: object) -> None:
        self._comm.all_to_all(out, t)  # type: ignore[attr-defined]
        self._corrupt(out)

    def broadcast(self, t: object, src: int) -> None:
        self._comm.broadcast(t, src)  # type: ignore[attr-defined]
        self._corrupt(t)


def test_exact_check_catches_a_corrupted_transport() -> None:
    import torch
    import torch.distributed as dist

    from sentinel.burnin.collectives import make_case
    from sentinel.burnin.comm import Comm

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = Comm(0, 1, ["node-0"], torch.device("cpu"))
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
            for wrapper, expect in ((comm, True), (_CorruptingComm(comm), False)):
                case = make_case(wrapper, op, 1024)  # type: ignore[arg-type]
                case.reset()
                case.run()
                assert case.check() is expect, (op, expect)
    finally:
        dist.destroy_process_group()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_bar_on_a_terminal_and_lines_elsewhere() -> None:
    tty = _Stream(True)
    bar = Progress("links", 4, stream=tty)
    for k in range(4):
        bar.step(f"round {k}")
    bar.finish("3 circle rounds")
    shown = tty.getvalue()
    assert "\x1b[" in shown and "burnin links" in shown and "4/4" in shown  # a drawn bar
    assert shown.endswith("\n") and "burnin links: done in" in shown and "3 circle rounds" in shown
    plain = _Stream(False)
    bar = Progress("collectives", 8, stream=plain)
    for _ in range(8):
        bar.step("x")
    bar.finish()
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue() and lines[-1].startswith("burnin collectives: done in")
    assert 2 <= len(lines) <= 6  # a line per quarter, not per step
