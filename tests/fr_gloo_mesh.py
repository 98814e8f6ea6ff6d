"""Real gloo flight-recorder dumps of a DP2 x PP2 x TP2 mesh that hangs four ways, in one run.

Rank r is (dp, pp, tp) = divmod-wise r = 4 dp + 2 pp + tp. Each scenario makes fresh groups:
TP pairs, PP pairs (a pipeline's two stages, which exchange activations and gradients by
point-to-point, which gloo does not record), DP pairs, and per replica a `replica` group of its
four ranks (TP and PP groups nest inside it). A step: stage-0 TP all-reduce, activation to
stage 1, stage-1 TP all-reduce, gradient back to stage 0, replica all-reduce, DP all-reduce.
In step 1 the scenario's culprit stops at its point; the others block until the groups' short
timeout, and every rank dumps what this scenario recorded (and a sidecar with its groups), so
each scenario's directory reads as a job that hung. The ranks are forked from this process
(torch imported once), which keeps the whole run to a few seconds.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from sentinel.processes import free_port

WORLD = 8
# scenario: (culprit, the point in step 1 it stops at)
SCENARIOS = {"tp": (6, "fwd_tp"), "pp": (0, "send"), "replica": (3, "replica"), "dp": (1, "dp")}
STEPS = 3
TIMEOUT = timedelta(seconds=2)


def _mesh_groups(dist: Any) -> dict[str, tuple[str, list[int], Any]]:
    """{key: (desc, ranks, group)} for this rank's groups; every rank creates all of them."""
    specs = []
    for d in range(2):
        for p in range(2):
            specs.append((f"tp{d}{p}", "mesh_tp", [4 * d + 2 * p, 4 * d + 2 * p + 1]))
        for t in range(2):
            specs.append((f"pp{d}{t}", "mesh_pp", [4 * d + t, 4 * d + 2 + t]))
        specs.append((f"replica{d}", "replica", list(range(4 * d, 4 * d + 4))))
    for p in range(2):
        for t in range(2):
            specs.append((f"dp{p}{t}", "mesh_dp", [2 * p + t, 4 + 2 * p + t]))
    rank = dist.get_rank()
    mine = {}
    for key, desc, ranks in specs:
        group = dist.new_group(ranks, timeout=TIMEOUT, group_desc=desc)
        if rank in ranks:
            mine[key.rstrip("0123456789")] = (desc, ranks, group)
    return mine


def _step(dist: Any, torch: Any, groups: dict, rank: int, stop: str | None) -> None:
    stage = rank // 2 % 2
    peer = groups["pp"][1][1 - stage]
    x = torch.ones(4)

    def point(name: str) -> None:
        if name == stop:
            raise _Stopped

    if stage == 0:
        point("fwd_tp")
        dist.all_reduce(x, group=groups["tp"][2])
        point("send")
        dist.send(x, peer, group=groups["pp"][2])
        dist.recv(x, peer, group=groups["pp"][2])
    else:
        dist.recv(x, peer, group=groups["pp"][2])
        point("fwd_tp")
        dist.all_reduce(x, group=groups["tp"][2])
        dist.send(x, peer, group=groups["pp"][2])
    point("replica")
    dist.all_reduce(x, group=groups["replica"][2])
    point("dp")
    dist.all_reduce(x, group=groups["dp"][2])


class _Stopped(Exception):
    pass


def _dump(torch: Any, dist: Any, out: Path, rank: int, groups: dict, since: int) -> None:
    """This scenario's entries (the recorder's buffer outlives groups) and its groups."""
    from torch.distributed import distributed_c10d as c10d

    trace = pickle.loads(
        torch._C._distributed_c10d._dump_fr_trace(
            includeCollectives=True, includeStackTraces=False, onlyActive=False
        )
    )
    names = {c10d._get_process_group_name(g) for _, _, g in groups.values()}
    trace["entries"] = [
        e
        for e in trace.get("entries", [])
        if e.get("time_created_ns", 0) >= since and str(e["process_group"][0]) in names
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(trace))
    pgs = {
        c10d._get_process_group_name(g): {"desc": desc, "ranks": ranks}
        for desc, ranks, g in groups.values()
    }
    meta = {"rank": rank, "world_size": WORLD, "process_groups": pgs}
    (out / f"sentinel_fr_meta.{rank}.json").write_text(json.dumps(meta))


def _rank_main(rank: int, port: int, out: Path) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        TORCH_FR_BUFFER_SIZE="2000",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    store = dist.distributed_c10d._get_default_store()
    for n, (scenario, (culprit, where)) in enumerate(SCENARIOS.items()):
        groups = _mesh_groups(dist)
        _wait_for_all(store, f"ready{n}")  # step 0 must not time out on a late peer
        since = time.time_ns()
        for step in range(STEPS):
            try:
                _step(dist, torch, groups, rank, where if (rank, step) == (culprit, 1) else None)
            except (_Stopped, RuntimeError):
                if step == 0:
                    raise  # the scenario did not run as laid out
                break  # the culprit stopped; the others' collectives timed out waiting on it
        _dump(torch, dist, out / scenario, rank, groups, since)
        _wait_for_all(store, f"scenario{n}")
    # Rank 0 serves the store: it leaves last.
    if rank == 0:
        _wait_for_all(store, "left")
    else:
        store.add("left", 1)


def _wait_for_all(store: Any, key: str) -> None:
    store.add(key, 1)
    while int(store.add(key, 0)) < WORLD:
        time.sleep(0.02)


def run_mesh(out: Path, timeout_s: float = 60) -> dict[str, int]:
    """Fork the ranks, run every scenario, and return {scenario dir name: culprit rank}."""
    import torch  # noqa: F401  (imported once, before the fork, for every rank)

    port = free_port()
    pids = []
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _rank_main(rank, port, out)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    deadline = time.monotonic() + timeout_s
    codes = {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes and (done := os.waitpid(pid, os.WNOHANG))[0]:
                codes[pid] = os.waitstatus_to_exitcode(done[1])
        time.sleep(0.05)
    for pid in set(pids) - set(codes):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert len(codes) == WORLD and set(codes.values()) == {0}, codes
    return {name: culprit for name, (culprit, _) in SCENARIOS.items()}
