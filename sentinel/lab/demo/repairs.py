"""What each repair cost the job, from the supervisor's log and the trainer's metrics.

For every restart the supervisor carried out (a `job.restart` command): the path it took
(`live`, `warm_restart`, `restart`), how long no step completed (`survivor_stall_s`: the last
step line before the restart to the first one after it), how long from the command to the
first step at full width (`join_s`), how many ranks read a checkpoint to come back
(`checkpoint_reads`), and how many ranks that were alive and stayed in the job got a new
process anyway (`survivors_restarted`: none on a warm restart, every one on a cold one). A rank
is alive unless the supervisor logged its process's end since the last generation started,
whichever fault ended it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.lab.sim.inject import Launch

_INCIDENT = re.compile(r"incident (\d+) \(([^)]+)\)")


@dataclass(frozen=True)
class Restart:
    """One restart as the supervisor's log tells it (demo seconds)."""

    t: float  # when the supervisor took the command
    incident: int | None
    fault: str | None
    path: str
    nodes_before: tuple[str, ...]
    generation: int | None = None  # the generation it launched
    nodes_after: tuple[str, ...] = ()
    # the new generation's ranks on warm rank processes: {rank, node, pid, reused}; None when
    # the launcher started every rank anew (cold ranks)
    ranks: tuple[dict[str, Any], ...] | None = None
    # (node, rank) of the processes that ended on their own since the last generation started
    died: frozenset[tuple[str, int]] = frozenset()


def _records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def restarts(supervisor_log: Path, t0: float) -> list[Restart]:
    """Every restart in the supervisor's log, with the generation it launched."""
    out: list[Restart] = []
    nodes: tuple[str, ...] = ()
    pending: dict[str, Any] | None = None
    died: set[tuple[str, int]] = set()
    for rec in _records(supervisor_log):
        msg = str(rec.get("msg", ""))
        if isinstance(rec.get("exits"), list):  # "ranks [...] exited abnormally"
            died |= {(str(e["node"]), int(e["rank"])) for e in rec["exits"]}
        elif msg.startswith("command job.restart"):
            m = _INCIDENT.search(str((rec.get("command_args") or {}).get("reason", "")))
            pending = {
                "t": float(rec["ts"]) - t0,
                "incident": int(m.group(1)) if m else None,
                "fault": m.group(2) if m else None,
                "path": "restart",
                "nodes_before": nodes,
            }
        elif msg.startswith("restart by") and pending is not None:
            pending["path"] = str(rec.get("path", pending["path"]))
        elif "generation" in rec and isinstance(rec.get("nodes"), list):
            nodes = tuple(rec["nodes"])
            if pending is not None:
                gen = int(rec["generation"])
                out.append(
                    Restart(**pending, generation=gen, nodes_after=nodes, died=frozenset(died))
                )
                pending = None
            died = set()
        elif (
            isinstance(rec.get("ranks"), list)
            and out
            and out[-1].generation == rec.get("generation")
        ):
            last = out[-1]
            out[-1] = Restart(**{**last.__dict__, "ranks": tuple(rec["ranks"])})
    return out


def _stall(steps: list[tuple[float, int, int]], t: float, gen: int | None) -> float | None:
    before = [st for (st, _s, _g) in steps if st <= t]
    after = [st for (st, _s, g) in steps if st > t and (gen is None or g >= gen)]
    if not before or not after:
        return None
    return round(min(after) - max(before), 2)


def _survivors_restarted(r: Restart, gpus_per_node: int) -> int:
    """Ranks whose process was alive at the restart and whose node stays, given a new one. A
    process is its node's GPU slot (the supervisor's exits name the job's rank, a replica's
    generation record its rank in the replica; replicas hold whole nodes)."""
    stay = set(r.nodes_before) & set(r.nodes_after)
    dead = {(node, rank % gpus_per_node) for node, rank in r.died}

    def restarted(node: str, rank: int, reused: bool) -> bool:
        return node in stay and (node, rank % gpus_per_node) not in dead and not reused

    if r.ranks is None:  # cold ranks: every rank process is new
        world = len(r.nodes_after) * gpus_per_node
        return sum(restarted(r.nodes_after[k // gpus_per_node], k, False) for k in range(world))
    return sum(restarted(str(x["node"]), int(x["rank"]), bool(x.get("reused"))) for x in r.ranks)


def _full_again(
    widths: list[tuple[float, int]], t: float, full: int | None, until: float
) -> float | None:
    """The first step at full width after the narrower ones that follow `t` (a step may still
    commit at full width between the decision and the struck replica's end), before the next
    repair (`until`: its narrow steps are its own)."""
    narrow = min((s for s, w in widths if t < s < until and w != full), default=t)
    return min((s for s, w in widths if s > narrow and w == full), default=None)


def _reads(r: Restart, launches: list[Launch], world: int) -> int:
    """The ranks of the restart's generation that loaded a checkpoint: each launch report of
    that generation (a gang's, or each replica's that relaunched) that resumed from one; none
    when it made no report (a joiner ended by the next repair before it came up). A trainer
    whose reports carry no generation: the first report after the restart."""
    if any(la.generation is not None for la in launches):
        mine = [la for la in launches if la.generation == r.generation]
        return sum((la.ranks or world) for la in mine if la.resume_step)
    first = next((la for la in launches if la.main_t >= r.t - 1.0), None)
    return world if first is not None and first.resume_step else 0


def repair_costs(
    restart_list: list[Restart],
    steps: list[tuple[float, int, int]],
    launches: list[Launch],
    gpus_per_node: int,
    widths: list[tuple[float, int]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per restart: its path and what it cost (see the module's docstring).
    `widths`: (demo time, replicas that trained it) of each step of a replica-mode job, for a
    live repair's join."""
    out = []
    full = max((w for _t, w in widths or []), default=None)
    for i, r in enumerate(restart_list):
        until = restart_list[i + 1].t if i + 1 < len(restart_list) else float("inf")
        first = min(
            (st for (st, _s, g) in steps if st > r.t and g >= (r.generation or 0)), default=None
        )
        if r.path == "live" and widths:  # the job back at full width with the joiner in it
            first = _full_again(widths, r.t, full, until)
        world = len(r.nodes_after) * gpus_per_node
        out.append(
            {
                "incident": r.incident,
                "fault": r.fault,
                "path": r.path,
                "at": round(r.t, 2),  # the supervisor took the command (demo seconds)
                "generation": r.generation,
                "survivor_stall_s": _stall(steps, r.t, r.generation),
                "join_s": round(first - r.t, 2) if first is not None else None,
                "checkpoint_reads": _reads(r, launches, world),
                "survivors_restarted": _survivors_restarted(r, gpus_per_node),
            }
        )
    return out
