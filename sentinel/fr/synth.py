"""Synthesized flight-recorder dumps in the shape PyTorch writes them (for drills and benchmarks).

`write_job` lays out a data-parallel x tensor-parallel job: a world group, one TP group per
node-sized block and one DP group per TP index; every step each rank all-reduces in the world,
its TP and its DP group. A `stop_rank` stops before its TP all-reduce at `stop_step` (the
culprit); `simulate` works out where everyone else then blocks: its TP peers in the TP group,
their DP groups behind them, and the rest of the gang in the next world all-reduce.
Entries, `pg_status` and `pg_config` follow PyTorch 2.10's dump format (NCCL flavour, with
ranks in `pg_config`; `gloo=True` empties it as gloo does).
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

VERSION = "2.10"


def _entry(record_id: int, pg_id: int, name: str, desc: str, seq: int, op: str) -> dict[str, Any]:
    return {
        "record_id": record_id,
        "pg_id": pg_id,
        "process_group": (name, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": op,
        "time_created_ns": 1_700_000_000_000_000_000 + record_id * 1000,
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "output_sizes": [[1024]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": False,
        "timeout_ms": 600000,
        "is_p2p": False,
        "thread_id": "1",
        "thread_name": "python",
    }


def groups_of(rank: int, world: int, tp: int) -> list[tuple[str, str, range]]:
    """(name, desc, global ranks) for the groups `rank` belongs to; names agree across ranks."""
    node, local = divmod(rank, tp)
    return [
        ("0", "default_pg", range(world)),
        (str(1 + node), f"tp{node}", range(node * tp, node * tp + tp)),
        (str(1 + world // tp + local), f"dp{local}", range(local, world, tp)),
    ]


def simulate(world: int, tp: int, steps: int, stop_rank: int, stop_step: int) -> dict[int, int]:
    """How many collectives each rank issues before the gang stops (ranks not listed: all).

    Every step each rank issues world, TP and DP all-reduces in that order. A collective
    completes when all its members issued it; a member of one that cannot complete blocks in it.
    """
    issued: dict[int, int] = {}
    for step in range(steps):
        for kind in range(3):
            index = step * 3 + kind
            if kind == 1 and step == stop_step and stop_rank >= 0 and stop_rank not in issued:
                issued[stop_rank] = index  # stops before issuing its TP all-reduce
            if not issued:
                continue
            for members in _instances(kind, world, tp):
                if any(m in issued for m in members):
                    for m in members:
                        issued.setdefault(m, index + 1)
    return issued


def _instances(kind: int, world: int, tp: int) -> list[range]:
    if kind == 0:
        return [range(world)]
    if kind == 1:
        return [range(n * tp, n * tp + tp) for n in range(world // tp)]
    return [range(local, world, tp) for local in range(tp)]


def synth_rank(
    rank: int, world: int, tp: int, steps: int, buffer: int, issued: int, gloo: bool = False
) -> dict[str, Any]:
    groups = groups_of(rank, world, tp)
    seq = {name: 0 for name, _, _ in groups}
    entries: list[dict[str, Any]] = []
    op = "gloo:all_reduce" if gloo else "nccl:all_reduce"
    first = max(0, issued - buffer)
    for index in range(issued):
        pg_id = index % 3
        name, desc, _ = groups[pg_id]
        seq[name] += 1
        if index >= first:
            entries.append(_entry(index, pg_id, name, desc, seq[name], op))
    blocked = issued < steps * 3 and entries and entries[-1]["process_group"][0]
    pg_status = {
        str(pg_id): {
            "last_enqueued_collective": seq[name],
            "last_started_collective": -1,
            "last_completed_collective": seq[name] - (1 if name == blocked else 0),
        }
        for pg_id, (name, _, _) in enumerate(groups)
    }
    config = (
        {"": {"name": "", "desc": "", "ranks": "[]"}}
        if gloo
        else {n: {"name": n, "desc": d, "ranks": _ranks_str(r)} for n, d, r in groups}
    )
    return {
        "version": VERSION,
        "comm_lib_version": "" if gloo else "2.21.5",
        "pg_config": config,
        "pg_status": pg_status,
        "entries": entries,
    }


@functools.lru_cache(maxsize=4096)
def _ranks_str(ranks: range) -> str:
    return str(list(ranks))


def write_job(
    out: str | Path,
    world: int,
    tp: int = 8,
    steps: int = 8,
    buffer: int = 20,
    stop_rank: int = -1,
    stop_step: int = -1,
    gloo: bool = False,
    prefix: str = "nccl_trace_rank_",
) -> Path:
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    issued = simulate(world, tp, steps, stop_rank, stop_step)
    for rank in range(world):
        n = issued.get(rank, steps * 3)
        dump = synth_rank(rank, world, tp, steps, buffer, n, gloo)
        (root / f"{prefix}{rank}").write_bytes(pickle.dumps(dump))
    return root
