"""All-rank stacks: ask a job's ranks for their Python stacks, and group their answers.

An operator's request (`POST /v1/jobs/{job}/stacks`, `request`) queues one `stacks.dump` to the
agent of every node of the job; each agent relays it to its ranks, whose hooks answer with a `rank.stacks`
event through the same agent (a node token reports only as its own node). `GET
/v1/jobs/{job}/stacks/{request}` answers the ranks grouped (`sentinel.stacks.group`): identical
stacks together, the odd ones out first, and the ranks that have not answered. The answers are
events in the store, so every replica serves them and they go with the events' retention. The
hang playbook's `stacks` action (`actions/stacks.py`) asks the same way.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from sentinel.coordinator.core.rows import NewCommand
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import CommandKind, RankStacksPayload, new_id
from sentinel.stacks.group import Grouped, group

log = logging.getLogger("sentinel.coordinator.stacks")


def ask(
    store: StateStore, job_id: str, request_id: str, now: float, incident_id: int | None = None
) -> list[str]:
    """Queue the `stacks.dump` for every node of the job (idempotent: a command id is
    `{request_id}@{node}`); the nodes asked. LookupError: no such job or it runs on no node."""
    job = store.job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id!r}")
    nodes = list(job.status.nodes)
    if not nodes:
        raise LookupError(f"job {job_id!r} reports no nodes (not running?)")
    args = {"request_id": request_id}
    kind = CommandKind.STACKS_DUMP.value
    store.insert_commands(
        [NewCommand(f"{request_id}@{n}", "node", n, kind, args, now, incident_id) for n in nodes]
    )
    return nodes


def answers(store: StateStore, job_id: str, request_id: str) -> Grouped:
    """The answers so far, grouped, against the job's world size now."""
    job = store.job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id!r}")
    found: list[tuple[int, RankStacksPayload]] = []
    for ev in store.rank_stacks(job_id, request_id):
        if ev.rank is None:
            continue
        try:
            found.append((ev.rank, RankStacksPayload.model_validate(ev.payload)))
        except ValidationError:  # stored by an older protocol: counted as no answer
            log.warning("unreadable rank.stacks event %s", ev.id)
    return group(found, job.status.world_size)


def request(store: StateStore, job_id: str, who: str, now: float) -> dict[str, Any]:
    request_id = f"stacks-{new_id()}"
    with store.tx():
        nodes = ask(store, job_id, request_id, now)
        store.audit(
            now,
            who,
            "stacks.requested",
            f"all-rank stacks of job {job_id}",
            detail={"request": request_id, "nodes": nodes},
        )
    job = store.job(job_id)
    world = job.status.world_size if job else 0
    return {"job": job_id, "request": request_id, "nodes": nodes, "world_size": world}
