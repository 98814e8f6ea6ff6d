"""The hang watchdog from outside the rank (sentinel/beacon.py, sentinel/agent/ranks/watch.py):
real processes stopped with SIGSTOP and spinning in a C call that holds the GIL, whose own
watchdog threads cannot run, are reported by the agent with their process state; a rank whose
own watchdog reported, or that is paused, is not reported twice; and the real agent does it
through its rank socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until

from sentinel.agent.ranks.registry import Peer, RankRegistry, Watched
from sentinel.agent.ranks.watch import OutsideWatchdog
from sentinel.beacon import LAYOUT, Beacon, beacon_path, read_beacon, remove_leftovers
from sentinel.protocol import RankRegistration

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S, MARGIN_S = 1.0, 0.5

# A rank: a beacon kept by the hooks' own HangWatchdog, three steps, then its end (argv[1]).
RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    from sentinel.beacon import Beacon, beacon_path
    from trainer_hooks.watchdog import HangWatchdog
    rank, end = int(sys.argv[1]), sys.argv[2]
    beacon = Beacon(beacon_path(os.getpid(), rank), 60.0)
    dog = HangWatchdog(lambda *a: print("own watchdog fired", flush=True), k=1.0,
                       floor_s=float(sys.argv[3]), first_step_s=60.0, poll_s=0.1, beacon=beacon)
    dog.start()
    for step in range(3):
        time.sleep(0.05)
        dog.progress(step)
    print("stepped", flush=True)
    if end == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif end == "gil":
        sum(range(1 << 62))  # one C call: the GIL is never let go
    elif end == "paused":
        with dog.paused():
            time.sleep(60)
    time.sleep(60)  # "sleep": its own watchdog thread runs and reports
    """
)


def start_rank(rank: int, end: str, floor_s: float = TIMEOUT_S) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank), end, str(floor_s)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stepped"
    return proc


def watched(proc: subprocess.Popen[str], rank: int) -> Watched:
    path = beacon_path(proc.pid, rank)
    reg = RankRegistration(job="j", rank=rank, gpu=0, pid=proc.pid, beacon=str(path))
    return Watched(reg, Peer(proc.pid, os.getuid()), path)


@pytest.fixture
def ranks() -> Iterator[dict[str, subprocess.Popen[str]]]:
    procs = {
        end: start_rank(rank, end) for rank, end in enumerate(("sigstop", "gil", "sleep", "paused"))
    }
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()
        for rank in range(4):
            beacon_path(proc.pid, rank).unlink(missing_ok=True)


def test_a_stopped_and_a_gil_holding_rank_are_reported_from_outside(
    ranks: dict[str, subprocess.Popen[str]],
) -> None:
    dog = OutsideWatchdog("node-0", MARGIN_S)
    watch = [watched(p, rank) for rank, p in enumerate(ranks.values())]
    t0, found = time.monotonic(), {}
    while len(found) < 2 and time.monotonic() - t0 < 15:
        found |= {e.source.rank: (e, time.monotonic() - t0) for e in dog.check(watch)}
        time.sleep(0.1)
    assert sorted(found) == [0, 1], found  # sigstop, gil: not the one that reported, nor paused
    stopped, spinning = found[0][0].payload, found[1][0].payload
    assert stopped.observer == spinning.observer == "agent"
    assert stopped.process_state == "T (stopped)" and stopped.cpu_share == 0.0
    assert spinning.process_state == "R (running)", spinning.process_state
    assert spinning.cpu_share is not None and spinning.cpu_share > 0.3  # a core, shared here
    assert stopped.step == spinning.step == 2 and stopped.timeout_s == TIMEOUT_S
    # within the rank's own timeout + the margin + a sweep (0.1 s here)
    assert all(seconds <= TIMEOUT_S + MARGIN_S + 1.0 for _, seconds in found.values()), found
    assert dog.check(watch) == []  # once per stall
    own = ranks["sleep"].stdout
    assert own is not None and own.readline().strip() == "own watchdog fired"
    # a stopped process that is let go and steps again is a new stall when it stops again
    os.kill(ranks["sigstop"].pid, signal.SIGCONT)


def test_a_beacon_is_read_only_when_it_is_the_ranks_own(tmp_path: Path) -> None:
    path = beacon_path(os.getpid(), 7)
    beacon = Beacon(path, 30.0)
    try:
        beacon.progress(4, 12.5)
        state = read_beacon(path, os.getuid())
        assert state is not None and (state.step, state.timeout_s, state.paused) == (4, 12.5, False)
        assert read_beacon(path, os.getuid() + 1) is None  # another user's file
        link = tmp_path / "link"
        link.symlink_to(path)
        assert read_beacon(link) is None  # a link is no beacon
        short = tmp_path / "short"
        short.write_bytes(b"SNTB" + bytes(LAYOUT.size - 8))
        assert read_beacon(short) is None
        registry = RankRegistry()
        mine = RankRegistration(job="j", rank=7, gpu=0, pid=os.getpid(), beacon=str(path))
        assert registry.register("conn", mine, Peer(os.getpid(), os.getuid())) is None
        assert [w.beacon for w in registry.watched()] == [path]
        # another process's beacon, or one from a rank in another PID namespace: the
        # registration stands (its GPU's labels), its beacon is not watched
        theirs = mine.model_copy(update={"rank": 8, "beacon": str(beacon_path(1, 8))})
        refused = registry.register("conn", theirs, Peer(os.getpid(), os.getuid()))
        assert refused is not None and "not the connecting process's" in refused
        assert len(registry) == 2 and [w.reg.rank for w in registry.watched()] == [7]
    finally:
        beacon.close()
    assert not path.exists()


def test_a_new_rank_removes_what_killed_ranks_of_its_user_left(tmp_path: Path) -> None:
    """A rank killed without closing its hooks leaves its beacon and dump FIFO; the next rank
    of the same user removes them as it opens its own: only a dead process's, only the kind a
    rank makes, never through a link."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = gone.pid, os.getpid()
    (tmp_path / f"sentinel-beacon-{dead}-3").write_bytes(b"\0" * LAYOUT.size)
    os.mkfifo(tmp_path / f"sentinel-fr-{dead}-3")
    kept = [
        tmp_path / f"sentinel-beacon-{alive}-1",  # its process runs
        tmp_path / f"sentinel-fr-{dead}-4",  # not a FIFO
        tmp_path / f"sentinel-beacon-{dead}-5",  # a link
        tmp_path / f"other-{dead}-3",
    ]
    kept[0].write_bytes(b"")
    kept[1].write_bytes(b"")
    kept[2].symlink_to(kept[3])
    kept[3].write_bytes(b"")
    removed = remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == [f"sentinel-beacon-{dead}-3", f"sentinel-fr-{dead}-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


AGENT_RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    from sentinel.beacon import Beacon, beacon_path
    from sentinel.protocol import RankRegistration, encode_registration
    from trainer_hooks.transport import AgentTransport
    from trainer_hooks.watchdog import HangWatchdog
    beacon = Beacon(beacon_path(os.getpid(), 5), 60.0)
    reg = RankRegistration(job="llm", rank=5, gpu=1, pid=os.getpid(), beacon=str(beacon.path))
    transport = AgentTransport(sys.argv[1], reconnect_s=0.1)
    transport.register(encode_registration(reg))
    transport.start()
    dog = HangWatchdog(lambda *a: None, k=1.0, floor_s=1.0, first_step_s=60.0, beacon=beacon)
    for step in range(3):
        time.sleep(0.05)
        dog.progress(step)
    while not transport.connected:
        time.sleep(0.05)
    print("stepped", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    """
)


def test_the_agent_reports_a_stopped_rank_through_its_socket(tmp_path: Path, lib: Path) -> None:
    gpus = [FakeGpu(index=i) for i in range(2)]
    agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"])
    rank = subprocess.Popen(
        [sys.executable, "-c", AGENT_RANK, str(tmp_path / "agent.sock")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "stepped"

        def hangs() -> float:
            counts = agent.scrape().get("sentinel_agent_events_total", [])
            return sum(v for labels, v in counts if labels.get("kind") == "rank.hang")

        seconds = wait_until(lambda: hangs() == 1, timeout_s=20, what="the agent's rank.hang")
        assert seconds < 1.0 + 1.0 + 2.0  # the rank's timeout + the margin (1 s) + checks
    finally:
        rank.kill()
        rank.wait()
        beacon_path(rank.pid, 5).unlink(missing_ok=True)
        assert agent.stop() == 0, agent.log()
