"""The store's interface: what the coordinator asks of its durable state, with no SQL in it.

A backend is one module implementing `StateStore` (SQLite today: `sqlite.py`). The methods
speak of the domain (open an incident, the live runs, a job's last status), take and return
typed rows (`rows.py`), and promise what a second backend can keep too:

- `tx()` is a transaction; nested, a savepoint. Everything a method writes inside it commits or
  rolls back with it. Outside one, each write is its own transaction.
- Ids the store assigns are 64-bit integers; an id outside that range names no row (a lookup
  answers None, not an error).
- `set_state` writes only if the row still holds `expected` (compare-and-set), so a writer that
  read a stale state loses instead of overwriting: what several coordinators sharing one
  database need.
- Event arrival order is an opaque integer cursor (SQLite's rowid, a PostgreSQL sequence).

The methods named in `STATE_WRITERS` write a state column. Only `lifecycle.py` calls them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sentinel.coordinator.lifecycle import Entity
from sentinel.coordinator.store.rows import (
    AuditRow,
    CommandRow,
    EffectRow,
    IncidentDetail,
    IncidentRow,
    IncidentView,
    JobRow,
    NewCommand,
    NodeRow,
    PruneResult,
    RunContext,
    RunRow,
    StepRow,
    StoredEvent,
    TokenRow,
)
from sentinel.protocol import Event, JobStatusPayload

STATE_WRITERS = frozenset(
    {
        "set_state",
        "insert_incident",
        "insert_run",
        "insert_step",
        "insert_node",
        "insert_job",
        "insert_effect",
    }
)
MAX_ID = 2**63 - 1  # ids are signed 64-bit integers in every backend


class StateStore(Protocol):
    # --- lifetime and transactions -------------------------------------------------------
    def tx(self) -> AbstractContextManager[None]: ...
    def close(self) -> None: ...
    def start_background(self) -> None:
        """Housekeeping threads the backend needs (SQLite: the WAL checkpointer)."""

    def file_sizes(self) -> dict[str, int]: ...

    # --- state (lifecycle.py only) -------------------------------------------------------
    def state_of(self, entity: Entity, key: str | int) -> str | None: ...
    def set_state(
        self,
        entity: Entity,
        key: str | int,
        state: str,
        now: float,
        expected: str,
        reason: str | None = None,
    ) -> bool: ...

    # --- events --------------------------------------------------------------------------
    def insert_events(self, events: Sequence[Event], received_at: float) -> set[str]:
        """Store the events not stored yet (by id); the ids stored now."""

    def link_events(self, links: Iterable[tuple[str, int]]) -> None:
        """(event id, incident id): the event is part of that incident's record."""

    def events_from(
        self, who: str, value: str, kinds: Sequence[str], since: float, limit: int
    ) -> list[StoredEvent]:
        """Events of these kinds from one node (`who`="node") or job since `since`."""

    def sdc_digests(
        self, job: str, check_id: str, since: float, after_step: int
    ) -> list[StoredEvent]:
        """Whole-gang matmul SDC digests answering a check: quoting its id, or received since
        `since` for a later step than `after_step`."""

    def sdc_digests_of_incident(self, incident_id: int) -> list[StoredEvent]: ...
    def fr_analysis(self, job: str, check_id: str) -> StoredEvent | None: ...
    def prune_events(self, after: int, cutoff: float, chunk: int) -> PruneResult:
        """Delete events no incident holds that arrived before `cutoff`, among the next
        `chunk` past the arrival cursor `after`."""

    # --- nodes ---------------------------------------------------------------------------
    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None:
        """Nodes heard from now (with their verdict, if the event carried one); a node never
        heard from before starts active."""

    def insert_node(self, name: str, state: str, now: float, reason: str | None) -> bool: ...
    def node(self, name: str) -> NodeRow | None: ...
    def nodes(self, limit: int) -> list[NodeRow]: ...
    def count_nodes(self, states: Iterable[str], changed_since: float | None = None) -> int: ...

    # --- jobs ----------------------------------------------------------------------------
    def insert_job(self, job_id: str, state: str, status: JobStatusPayload, now: float) -> None: ...
    def save_job_status(self, job_id: str, status: JobStatusPayload, now: float) -> None:
        """The supervisor's latest heartbeat (all but the state, which `lifecycle` moves)."""

    def job(self, job_id: str) -> JobRow | None: ...
    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]: ...
    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]: ...

    # --- incidents -----------------------------------------------------------------------
    def insert_incident(
        self,
        key: str,
        fault: str,
        target: str,
        job: str | None,
        state: str,
        playbook: str,
        now: float,
        first_step: int | None,
        detail: IncidentDetail,
    ) -> int: ...
    def incident(self, incident_id: int) -> IncidentRow | None: ...
    def incidents(self, limit: int, state: str | None = None) -> list[IncidentRow]: ...
    def incident_view(self, incident_id: int, events_limit: int) -> IncidentView | None: ...
    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None:
        """The newest incident with this correlation key in one of `states`."""

    def active_incident_on(
        self, target: str, faults: Iterable[str], states: Iterable[str]
    ) -> int | None:
        """The oldest incident of one of `faults` on `target` in one of `states`."""

    def save_incident_detail(
        self, incident_id: int, detail: IncidentDetail, now: float
    ) -> None: ...
    def acknowledge_incident(self, incident_id: int, who: str, now: float) -> bool: ...
    def fault_counts(self) -> dict[str, int]: ...
    def detect_seconds(self) -> list[float]:
        """Per incident: from its first event to its opening."""

    def recover_seconds(self, states: Iterable[str]) -> list[float]: ...
    def state_counts(self, entity: Entity) -> dict[str, int]: ...

    # --- runs and steps ------------------------------------------------------------------
    def insert_run(
        self,
        incident_id: int,
        playbook: str,
        status: str,
        dry_run: bool,
        now: float,
        context: RunContext | None = None,
    ) -> int: ...
    def run(self, run_id: int) -> RunRow | None: ...
    def runs(self, statuses: Iterable[str], incident_id: int | None = None) -> list[RunRow]: ...
    def last_run_update(self, incident_id: int) -> float | None: ...
    def save_run(self, run: RunRow, now: float) -> None:
        """A run's progress: step index, context, step start (its status `lifecycle` moves)."""

    def insert_step(
        self,
        key: str,
        incident_id: int,
        run_id: int,
        action: str,
        params: dict[str, Any],
        state: str,
        dry_run: bool,
        who: str,
        now: float,
    ) -> None: ...
    def step(self, key: str) -> StepRow | None: ...
    def steps(self, limit: int) -> list[StepRow]: ...
    def save_step_result(
        self, key: str, result: dict[str, Any], target: str | None, done_at: float | None
    ) -> None: ...

    # --- outside effects -----------------------------------------------------------------
    def insert_effect(
        self,
        key: str,
        kind: str,
        target: str,
        args: dict[str, Any],
        state: str,
        incident_id: int | None,
        now: float,
    ) -> EffectRow:
        """Record an effect's intent; the row already recorded under `key` if there is one."""

    def effect(self, key: str) -> EffectRow | None: ...
    def effects(self, states: Iterable[str]) -> list[EffectRow]: ...
    def begin_effect(self, key: str) -> int:
        """Count one more attempt, before the call is made; the attempts before it."""

    def save_effect_result(self, key: str, result: dict[str, Any], now: float) -> None: ...

    # --- commands ------------------------------------------------------------------------
    def insert_commands(self, commands: Sequence[NewCommand]) -> None:
        """Queue commands; one whose id is queued already is left as it is (idempotent)."""

    def command(self, command_id: str) -> CommandRow | None: ...
    def take_commands(self, target_kind: str, target: str, now: float) -> list[CommandRow]:
        """Unacknowledged commands for a target, oldest first, marked delivered."""

    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool: ...
    def has_undelivered_commands(self) -> bool: ...

    # --- audit ---------------------------------------------------------------------------
    def audit(
        self,
        now: float,
        who: str,
        what: str,
        why: str,
        incident_id: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None: ...
    def audit_log(self, limit: int) -> list[AuditRow]: ...

    # --- tokens --------------------------------------------------------------------------
    def insert_token(
        self, token_id: str, hashed: str, role: str, node: str | None, job: str | None, now: float
    ) -> bool: ...
    def token(self, token_id: str) -> TokenRow | None:
        """An unrevoked token by id."""

    def tokens(self) -> list[TokenRow]: ...
    def revoke_token(self, token_id: str, now: float) -> bool: ...
    def count_tokens(self, revoked: bool) -> int: ...
