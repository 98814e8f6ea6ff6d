"""Flight-recorder dumps carried from the nodes, kept for the job that asked for them.

A node's agent uploads each dump file of an `fr.dump` check (`PUT /v1/fr/{check}/{node}/{name}`);
a node token may upload only as its own node, a job's supervisor (which may read the ranks' dumps
from a directory of its own) only for the nodes its job runs on, or ran on when their ranks dumped
for that check. The same check holds a node's
own evidence for an incident's bundle (`core/bundle.py`). The job's supervisor (or an operator) reads every
file of that check (`GET /v1/fr/{check}`) and runs the analysis on them; a node token reads
none. Files live in the store (`fr_dumps`), so every coordinator sharing it serves every upload;
they go with the events' retention.
"""

from __future__ import annotations

import re

from sentinel.coordinator.core.auth import Principal, Role
from sentinel.coordinator.core.store import StateStore

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$"  # a check id, node, job or file name
_NAME = re.compile(NAME_PATTERN)


class BadName(ValueError):
    """A name that cannot be a check id, node, job or file name (the API answers 400)."""


class Refused(PermissionError):
    """The principal may not do this (the API answers 403)."""


def check_name(part: str, what: str) -> str:
    if not _NAME.fullmatch(part) or ".." in part:
        raise BadName(f"bad {what} {part[:40]!r}")
    return part


def upload(
    store: StateStore, who: Principal, check: str, node: str, name: str, data: bytes, now: float
) -> None:
    """Store one dump file of a check (an upload again replaces it)."""
    if not may_upload(store, who, node, check):
        raise Refused(f"{who} may not upload dumps for node {node}")
    store.put_fr_dump(check, node, name, data, now)


def may_upload(store: StateStore, who: Principal, node: str, check: str) -> bool:
    """A node as itself; a job's supervisor for the nodes its job runs on, or ran on when its
    ranks there dumped for this check (a repair may have taken the node out of the job since:
    its evidence is what the incident's bundle needs most)."""
    if who.role == Role.ADMIN or (who.role == Role.NODE and who.node == node):
        return True
    job = store.job(who.job) if who.role == Role.JOB and who.job else None
    if job is None or who.job is None:
        return False
    if node in (*job.status.nodes, *job.status.spares):
        return True
    return any(ev.node == node for ev in store.rank_fr_dumps(who.job, check))


def dumps(store: StateStore, who: Principal, check: str) -> list[tuple[str, str, bytes]]:
    """(node, file name, bytes) of every file of a check."""
    if who.role == Role.NODE:
        raise Refused("a node token may not read other nodes' dumps")
    return store.fr_dumps(check)
