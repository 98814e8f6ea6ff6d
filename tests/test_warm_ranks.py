"""Warm ranks on real processes: node hosts fork rank processes with the trainer imported, a
generation runs in them over real gloo, and a stop keeps the survivors for the next one.

The trainer is `tests/helpers/warm_trainer.py` (one gloo all_reduce per step, leaving when
asked); the reference trainer's own warm restarts are in test_supervised_reference.py and the
drills."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from coord_util import ROOT

from sentinel.processes import free_rendezvous_port, proc_stat
from sentinel.ranks import current, rank, wire
from sentinel.ranks.host import HostCommand
from sentinel.ranks.pool import RankPool
from sentinel.supervisor.launcher import GangPlan, GangStartError
from sentinel.supervisor.warm import LocalHosts, WarmGang, WarmLauncher

NODES = ["node-0", "node-1"]


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WarmLauncher]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests/helpers"), str(ROOT)]))
    warm = WarmLauncher(LocalHosts(tmp_path / "logs"), tmp_path / "logs", leave_grace_s=2.0)
    yield warm
    warm.close()


def _plan(
    tmp_path: Path, generation: int, *flags: str, spares: list[str] | None = None
) -> GangPlan:
    return GangPlan(
        argv=[sys.executable, "-m", "warm_trainer", "--out", str(tmp_path), *flags],
        nodes=NODES,
        gpus_per_node=2,
        generation=generation,
        master_port=free_rendezvous_port(),
        spares=spares or [],
    )


def _pids(gang: WarmGang) -> dict[int, int]:
    return {rank: proc.pid for rank, proc in gang.procs.items()}


def _steps(tmp_path: Path, generation: int) -> int:
    path = tmp_path / "steps.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for ln in lines if ln.split()[0] == str(generation))


def _wait(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_healthy_gang_leaves_together_and_the_next_generation_reuses_its_processes(
    launcher: WarmLauncher, tmp_path: Path
) -> None:
    gang = launcher.launch(_plan(tmp_path, 0, spares=["spare-0"]))
    assert isinstance(gang, WarmGang)
    _wait(lambda: _steps(tmp_path, 0) >= 20)
    before = _pids(gang)
    stop = gang.stop(5.0, keep=frozenset(NODES))
    assert stop.verified and not stop.killed and sorted(stop.kept) == sorted(before.values())
    assert gang.poll() == []  # a rank that left is no crash
    assert stop.seconds < 2.0  # a step boundary, not the grace period
    nxt = launcher.launch(_plan(tmp_path, 1, "--steps", "5", spares=["spare-0"]))
    assert isinstance(nxt, WarmGang) and _pids(nxt) == before
    _wait(lambda: nxt.running() == 0)
    assert [e.returncode for e in nxt.poll()] == [0, 0, 0, 0]
    # the spare's slots have warm processes too, waiting for a rank
    assert launcher.pool.process("spare-0", 0) is not None
    assert launcher.pool.process("spare-0", 1) is not None


def test_the_simulated_nodes_hosts_are_forked_from_one_template_and_end_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every simulated node is this machine: one template imports the trainer for all of them,
    and each node's host is forked from it, leading a process group of its own as a started
    host does. Closing the launcher ends the template, every host and every rank process."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests/helpers"), str(ROOT)]))
    hosts = LocalHosts(tmp_path / "logs")
    warm = WarmLauncher(hosts, tmp_path / "logs", leave_grace_s=2.0)
    try:
        gang = warm.launch(_plan(tmp_path, 0, "--steps", "3", spares=["spare-0"]))
        _wait(lambda: gang.running() == 0)
        [template] = hosts._templates.values()
        forked = {node: proc.pid for node, proc in hosts.procs.items()}
        assert sorted(forked) == ["node-0", "node-1", "spare-0"]
        for pid in forked.values():
            assert proc_stat(pid) is not None and proc_stat(pid)[0] == template.proc.pid
            assert os.getpgid(pid) == pid
        ranks = [p.pid for p in gang.procs.values()]  # type: ignore[attr-defined]
    finally:
        warm.close()
    assert template.gone

    def gone(pid: int) -> bool:  # or a zombie left to this machine's init to reap
        stat = proc_stat(pid)
        return stat is None or stat[1] == "Z"

    _wait(lambda: all(gone(p) for p in [*forked.values(), *ranks]), timeout_s=10.0)


def test_a_crashed_rank_is_reported_alone_and_only_its_slot_gets_a_new_process(
    launcher: WarmLauncher, tmp_path: Path
) -> None:
    gang = launcher.launch(_plan(tmp_path, 0, "--crash", "1:10"))
    before = _pids(gang)
    deadline = time.monotonic() + 60
    exits = []
    while not exits:
        assert time.monotonic() < deadline
        exits = gang.poll()
        time.sleep(0.05)
    time.sleep(1.0)  # its peers' collectives fail meanwhile: none of them is a crash
    assert [(e.rank, e.node, e.returncode) for e in exits + gang.poll()] == [(1, "node-0", 3)]
    stop = gang.stop(5.0, keep=frozenset(NODES))
    assert stop.verified and not stop.killed
    assert sorted(stop.kept) == sorted(p for r, p in before.items() if r != 1)
    nxt = launcher.launch(_plan(tmp_path, 1, "--steps", "5"))
    after = _pids(nxt)
    assert after[1] != before[1] and {r: after[r] for r in (0, 2, 3)} == {
        r: before[r] for r in (0, 2, 3)
    }
    _wait(lambda: nxt.running() == 0)
    assert [e.returncode for e in nxt.poll()] == [0, 0, 0, 0]


def test_a_hung_rank_is_killed_with_its_node_and_the_others_leave_at_once(
    launcher: WarmLauncher, tmp_path: Path
) -> None:
    gang = launcher.launch(_plan(tmp_path, 0, "--hang", "3:10"))
    before = _pids(gang)
    _wait(lambda: _steps(tmp_path, 0) >= 10 * 3)
    time.sleep(1.0)  # ranks 0-2 wait in their step-10 collective on rank 3
    assert gang.poll() == [] and gang.running() == 4
    stop = gang.stop(5.0, keep=frozenset({"node-0"}))  # node-1 holds the culprit
    assert stop.verified and sorted(stop.killed) == sorted([before[2], before[3]])
    assert sorted(stop.kept) == sorted([before[0], before[1]])
    # the culprit's death ends its peers' collective: no grace period spent on them
    assert stop.seconds < 2.0
    assert gang.poll() == []


def test_a_rank_that_fails_on_its_own_is_reported_and_not_used_again(
    launcher: WarmLauncher, tmp_path: Path
) -> None:
    gang = launcher.launch(_plan(tmp_path, 0, "--fail", "2:10"))
    before = _pids(gang)
    deadline = time.monotonic() + 60
    exits = []
    while not exits:
        assert time.monotonic() < deadline
        exits = gang.poll()
        time.sleep(0.05)
    # its process lives on, but the error is its own (no process died): a crash of rank 2
    assert [(e.rank, e.returncode, e.collateral) for e in exits] == [(2, 1, False)]
    stop = gang.stop(5.0, keep=frozenset(NODES))
    assert before[2] in stop.killed and before[2] not in stop.kept and stop.verified
    assert sorted(stop.kept) == sorted(p for r, p in before.items() if r != 2)


def test_a_rank_that_dies_as_the_stop_arrives_is_still_a_crash(
    launcher: WarmLauncher, tmp_path: Path
) -> None:
    """A repair's stop does not swallow a crash that coincides with it: the rank whose process
    died instead of leaving is reported by the next poll, and its slot is not kept."""
    gang = launcher.launch(_plan(tmp_path, 0, "--crash-on-leave", "3"))
    before = _pids(gang)
    _wait(lambda: _steps(tmp_path, 0) >= 20)
    stop = gang.stop(5.0, keep=frozenset(NODES))
    assert stop.verified and before[3] not in stop.kept
    assert [(e.rank, e.node, e.returncode) for e in gang.poll()] == [(3, "node-1", 3)]
    assert gang.poll() == []


def test_the_pool_takes_only_connections_that_know_the_jobs_secret() -> None:
    pool = RankPool("the-secret")
    try:
        for secret in ("wrong", ""):
            sock = wire.connect(pool.address)
            sock.sendall(wire.encode(wire.Hello(secret=secret, node="node-0", pid=1)))
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the pool
            sock.close()
        sock = wire.connect(pool.address)
        sock.sendall(b'{"op": "ended", "generation": 0, "code": 0}\n')  # no hello first
        sock.settimeout(5)
        assert sock.recv(1) == b""
        sock.close()
        good = wire.connect(pool.address)
        good.sendall(wire.encode(wire.Hello(secret="the-secret", node="node-0", pid=1)))
        assert pool.wait(lambda: pool.host_ready("node-0"), 5)
        good.close()
    finally:
        pool.close()


def test_a_leave_that_crosses_its_generations_start_holds_when_it_begins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second repair right after a first: the pool asks generation 7 to leave before the rank
    process has begun it. It leaves as soon as it begins; a late request for an earlier
    generation does not touch the next."""
    monkeypatch.setattr(current, "_asked", -1)
    try:
        current.request_leave(7)
        current.begin(7)
        assert current.leave_requested()
        current.end()
        current.request_leave(7)
        current.begin(8)
        assert not current.leave_requested()
    finally:
        current.end()


def test_a_rank_meets_rank_0s_store_as_it_opens_and_not_a_backoff_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 opens its rendezvous store 0.2 s after its peer began: the peer starts its own
    rendezvous within a few probes of it, not after the store client's half-second backoff;
    rank 0 does not wait for itself, and a leave ends the wait."""
    port = free_rendezvous_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1"}
    monkeypatch.setattr(current, "_asked", -1)
    t0 = time.monotonic()
    current.begin(3)
    try:
        threading.Timer(1.0, current.request_leave, args=(3,)).start()
        rank.wait_for_store(env)  # nothing listens: the leave ends it
        assert 0.9 < time.monotonic() - t0 < 2.0
    finally:
        current.end()
    opened: list[float] = []

    def open_store() -> None:
        time.sleep(0.2)
        server = socket.create_server(("127.0.0.1", port))
        opened.append(time.monotonic())
        time.sleep(1.0)
        server.close()

    threading.Thread(target=open_store).start()
    rank.wait_for_store(env)
    assert opened and time.monotonic() - opened[0] < 0.1
    t0 = time.monotonic()
    rank.wait_for_store({**env, "RANK": "0"})
    rank.wait_for_store({"RANK": "1"})  # no store to meet
    assert time.monotonic() - t0 < 0.05


def test_wire_lines_are_checked() -> None:
    with pytest.raises(wire.WireError, match="op"):
        wire.decode_to_pool(b'{"op": "spawn", "slot": 0}')
    with pytest.raises(wire.WireError, match="slot"):
        wire.decode_from_pool(b'{"op": "kill", "slot": -1}')
    reader = wire.LineReader()
    assert reader.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}']
    with pytest.raises(wire.WireError, match="longer than"):
        reader.feed(b"x" * (wire.MAX_LINE + 1))
    message = wire.Run(generation=3, rank=1, module="m", argv=["--x"], env={"A": "1"})
    assert wire.decode_from_pool(wire.encode(message).strip()) == message
    assert "secret" not in repr(wire.Hello(secret="s3cr3t", node="n", pid=1))


def test_a_node_host_refuses_a_trainer_that_is_not_a_module(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sentinel.ranks.host",
            "--connect",
            "127.0.0.1:1",
            "--node",
            "n",
            "--",
            sys.executable,
            "train.py",
        ],
        env={**os.environ, wire.SECRET_ENV: "s"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "python -m MODULE" in done.stderr


class _NoHostOn(LocalHosts):
    """A node whose host never comes up (its machine is broken)."""

    def __init__(self, log_dir: Path, broken: str) -> None:
        super().__init__(log_dir)
        self.broken = broken

    def start(self, node: str, host: HostCommand, env: dict[str, str]) -> None:
        if node != self.broken:
            super().start(node, host, env)


def test_a_node_whose_processes_never_come_fails_the_start_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests/helpers"), str(ROOT)]))
    warm = WarmLauncher(_NoHostOn(tmp_path / "logs", "node-1"), tmp_path, start_timeout_s=10.0)
    try:
        with pytest.raises(GangStartError) as failed:
            warm.launch(_plan(tmp_path, 0))
        assert [(e.rank, e.node) for e in failed.value.ranks] == [(2, "node-1"), (3, "node-1")]
        # node-0's processes came up and wait, idle: none of them runs the generation
        slots = [("node-0", 0), ("node-0", 1)]
        assert warm.pool.wait(lambda: all(warm.pool.process(*s) is not None for s in slots), 60)
        assert not any(p.busy for s in slots if (p := warm.pool.process(*s)) is not None)
        assert not (tmp_path / "steps.txt").exists()
    finally:
        warm.close()


HOLD_CUT = """
import socket, sys, threading, time
from sentinel.ranks import current, rank
keep = socket.create_server(("127.0.0.1", 0))
current.begin(9)
threading.Thread(target=rank.hold_cut, args=(keep, 9), daemon=True).start()
time.sleep(0.1)
# a connection the generation opens after the leave's first cut (a store client, a new group)
server = socket.create_server(("127.0.0.1", 0))
late = socket.create_connection(server.getsockname())
late.settimeout(5.0)
t0 = time.monotonic()
print("cut" if late.recv(1) == b"" else "data", round(time.monotonic() - t0, 2), flush=True)
time.sleep(rank.STACKS_AFTER_S)
current.end()
"""


def test_an_at_once_leave_cuts_what_its_generation_opens_later_and_logs_where_it_waits() -> None:
    """A rank that was connecting when the at-once leave's cut came (its rendezvous store, a
    new process group's links) is cut again until its generation ends, and one still running
    after a second writes its stacks to its log: a rank the supervisor kills says where it
    was. In a process of its own: the cut reaches every TCP connection of the process."""
    done = subprocess.run(
        [sys.executable, "-c", HOLD_CUT], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    verdict, seconds = done.stdout.split()[:2]
    assert verdict == "cut" and float(seconds) < 1.0, done.stdout
    assert "generation 9 still running 1 s after an at-once leave" in done.stderr
    assert 'File "<string>"' in done.stderr  # the main thread's frames, where it waits
