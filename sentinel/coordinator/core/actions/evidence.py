"""`evidence`: capture what a repair would destroy, before the first step that destroys it.

A teardown, an eviction or a restart ends the ranks' processes, and with them their stacks and
flight recorders; the next dump overwrites a rank's last one. This step asks, at once:
- every rank for its flight recorder without stack traces (`fr.dump`, `purpose: evidence`:
  the trainer hooks' dump, and the GIL-free one where an agent watches the rank), then with
  them on a thread of its own (`WITH_STACKS`: symbolizing needs the GIL and may never end),
  which the nodes' agents (or the supervisor, where the ranks dump into its directory) carry
  to the coordinator under the step's check id;
- every rank for its Python stacks (`stacks.dump`, `coordinator/stacks.py`);
- the agents of the incident's nodes (the culprits once a diagnosis named them) for their
  node's evidence (`node.evidence`: NVML snapshot, XID history, kernel-log tail, verdicts).
The step waits only until the ranks the repair ends (the culprits', a node-scoped incident's
node's, every rank on a cold restart) have *written* their part (a `rank.fr_dump` quoting the
check, a `rank.stacks` answer) or `timeout_s` (10 s): the others keep their processes, and the
carrying, the node evidence and the incident's timeline are gathered beside the repair and
sealed into the incident's bundle (`core/bundle.py`) within `bundle_s`. A rank that cannot
answer is evidence, not a failure: the step is done either way and the repair goes on. The
ranks waited for are those the agents reached (their acknowledgements say how many; an agent
silent for 2 s, or with no heartbeat in 45 s, reaches none), less the ranks an agent saw hung
from outside (they answer nothing).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sentinel.coordinator.core.actions.base import (
    ActionContext,
    BaseAction,
    StepResult,
    StepStatus,
    WaitParams,
)
from sentinel.coordinator.core.actions.diagnose import node_of_rank, silenced
from sentinel.coordinator.core.actions.eviction import nodes_of
from sentinel.coordinator.core.rows import NewCommand, StoredEvent
from sentinel.coordinator.core.stacks import answers, ask
from sentinel.faults.repairs import repair
from sentinel.protocol import WITH_STACKS, CommandKind, EventKind, Recovery
from sentinel.stacks.group import Grouped, StackGroup, rank_ranges

GROUPS_KEPT = 8  # groups whose frames go into the record; the rest by their ranks only
FRAMES_KEPT = 12  # innermost frames per thread in the record (all are in the stored answers)
NODES_ASKED = 8  # nodes asked for their own evidence (the incident's, or its culprits)
# An agent answers a command within a long-poll round trip: one silent this long relays to no
# rank. One whose last heartbeat (every 15 s) is older than three is down, or there is none.
AGENT_GRACE_S = 2.0
AGENT_STALE_S = 45.0


class EvidenceParams(WaitParams):
    timeout_s: float = Field(default=10.0, gt=0)  # the ranks' part, before the repair goes on
    # The ranks' dumps with stack traces, beside the repair (their symbolizing needs the GIL
    # and may never end): the bundle waits for them this long from the capture's start.
    with_stacks_s: float = Field(default=10.0, gt=0)
    bundle_s: float = Field(default=60.0, gt=0)  # everything, sealed into the bundle


def _summary(g: StackGroup, with_frames: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": rank_ranges(g.ranks), "count": len(g.ranks)}
    if with_frames:
        out["threads"] = {
            t.name: [f"{f.file}:{f.line} {f.func}" for f in t.frames[-FRAMES_KEPT:]]
            for t in g.threads
        }
    return out


def record(grouped: Grouped, request_id: str) -> dict[str, Any]:
    """What the incident keeps of the stacks: the request (its answers stay readable through
    the API while the events are retained), who answered, and the groups, odd ones out first."""
    return {
        "request": request_id,
        "answered": grouped.answered,
        "world_size": grouped.world_size,
        "missing_ranks": rank_ranges(grouped.missing),
        "groups": [_summary(g, i < GROUPS_KEPT) for i, g in enumerate(grouped.groups)],
    }


def expected(ctx: ActionContext, command_id: str, nodes: list[str], per_node: int) -> int:
    """How many ranks on these nodes can answer a command: as many as each node's agent
    relayed it to (a rank that crashed is reached by none). A node whose agent has not
    answered yet counts its whole share while the agent is alive, for `AGENT_GRACE_S`; a node
    with no live agent reaches none: its ranks report through it."""
    total = 0
    for node in nodes:
        row = ctx.store.command(f"{command_id}@{node}")
        if row is not None and row.acked_at is not None:
            total += int((row.result or {}).get("relayed_to_ranks") or 0)
        elif agent_alive(ctx, node) and not ctx.waited_past(AGENT_GRACE_S):
            total += per_node
    return total


def agent_alive(ctx: ActionContext, node: str) -> bool:
    since = ctx.now - AGENT_STALE_S
    return bool(ctx.store.events_from("node", node, [EventKind.AGENT_HEARTBEAT], since, 1))


def ended_nodes(ctx: ActionContext, job_nodes: list[str]) -> list[str]:
    """The job's nodes whose rank processes the repair ends: the culprits a diagnosis named, or
    a node-scoped incident's node (it leaves the job), or every node when the fault's path is
    a cold restart. A warm or live repair keeps every other rank's process, and its recorder
    with it: their part is gathered beside the repair."""
    if repair(ctx.incident.fault).path == Recovery.RESTART:
        return job_nodes
    struck = set(ctx.plan.culprits)
    if not struck and not ctx.incident.target.startswith("job:"):
        struck = {ctx.incident.target}
    return [n for n in job_nodes if n in struck]


def ranks_on(events: list[StoredEvent], nodes: list[str]) -> set[int]:
    """The ranks that answered from these nodes (a dump with stack traces is not the answer)."""
    return {
        e.rank
        for e in events
        if e.rank is not None and e.node in nodes and e.payload.get("reason") != WITH_STACKS
    }


def evidence_nodes(ctx: ActionContext) -> list[str]:
    return sorted(ctx.plan.culprits or nodes_of(ctx.incident))[:NODES_ASKED]


def ask_nodes(ctx: ActionContext, check: str, nodes: list[str]) -> None:
    """Queue `node.evidence` for each node (idempotent: the ids derive from the check)."""
    kind, args = CommandKind.NODE_EVIDENCE.value, {"check_id": check}
    ctx.store.insert_commands(
        [
            NewCommand(f"{check}-node@{n}", "node", n, kind, args, ctx.now, ctx.incident.id)
            for n in nodes
        ]
    )


class Evidence(
    BaseAction[EvidenceParams], name="evidence", dry_run="would capture the incident's evidence"
):
    """Capture the ranks' flight recorders and stacks and the nodes' evidence before a
    destructive step; the bundle is sealed beside the repair."""

    def act(self, ctx: ActionContext, params: EvidenceParams) -> StepResult:
        nodes = evidence_nodes(ctx)
        check = ctx.command_id("-evidence")
        ask_nodes(ctx, check, nodes)
        job = ctx.job()
        if ctx.job_id is None or job is None:  # no ranks to ask: the nodes' part only
            return StepResult(StepStatus.DONE, self._detail(ctx, params, check, nodes, {}))
        ctx.issue_command(
            CommandKind.FR_DUMP, {"check_id": check, "purpose": "evidence"}, "-evidence"
        )
        rid = ctx.command_id("-stacks")
        try:  # idempotent: the commands' ids derive from the step's key
            job_nodes = ask(ctx.store, ctx.job_id, rid, ctx.now, ctx.incident.id)
        except LookupError as e:  # the job runs on no node: nothing to ask, the repair goes on
            return StepResult(
                StepStatus.DONE, self._detail(ctx, params, check, nodes, {"error": str(e)})
            )
        reports = ctx.store.rank_fr_dumps(ctx.job_id, check)
        dumped = ranks_on(reports, job_nodes)
        ending = ended_nodes(ctx, job_nodes)  # only their ranks' part holds the repair back
        # Ranks seen hung from outside cannot answer: their silence is the evidence.
        seen = silenced(ctx)
        stuck = {r for r in seen if node_of_rank(job, r) in ending}
        late = [
            part
            for part, events, command in (
                ("fr_dumps", reports, check),
                ("stacks", ctx.store.rank_stacks(ctx.job_id, rid), rid),
            )
            if len(ranks_on(events, ending) - stuck)
            < expected(ctx, command, ending, job.status.gpus_per_node) - len(stuck)
        ]
        if late and not ctx.waited_past(params.timeout_s):
            # what a bundle of a capture cut short here still names (`core/bundle.py`)
            return StepResult(
                StepStatus.WAIT, {"waiting_for": late, "check": check, "nodes": nodes}
            )
        ranks = {
            "stacks": record(answers(ctx.store, ctx.job_id, rid), rid),  # grouped once, at the end
            "fr_dumps": len(dumped),
            "fr_dumped_ranks": rank_ranges(sorted(dumped)),
            "timed_out": late,
        }
        if seen:
            ranks["silenced_ranks"] = seen
        return StepResult(StepStatus.DONE, self._detail(ctx, params, check, nodes, ranks))

    @staticmethod
    def _detail(
        ctx: ActionContext,
        params: EvidenceParams,
        check: str,
        nodes: list[str],
        ranks: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "check": check,
            "nodes": nodes,
            **ranks,
            "bundle_s": params.bundle_s,
            "with_stacks_s": params.with_stacks_s,
            "captured_s": round(ctx.now - ctx.step_started_at, 3),
        }
