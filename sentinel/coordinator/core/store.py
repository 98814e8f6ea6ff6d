"""The store as the repair core sees it: one narrow typed interface (`StateStore`), holding only
what `core/` calls, grouped by aggregate; the store package implements it (`store/sql.py`).
Beyond its methods: the id range, which methods write a state, and how the store fails.

The methods named in `STATE_WRITERS` write a state column. Only `lifecycle.py` calls them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sentinel.coordinator.core.rows import (
        CommandRow,
        DoneStepRow,
        EffectRow,
        IncidentDetail,
        IncidentRow,
        JobRow,
        NewCommand,
        NodeRow,
        PruneResult,
        RepairStagesRow,
        RunContext,
        RunRow,
        StepRow,
        StoredEvent,
        TokenRow,
    )
    from sentinel.coordinator.core.states import Entity
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


class StoreUnavailable(RuntimeError):
    """The database cannot be reached (or went away mid-transaction): nothing of the work in
    hand was committed. The API answers 503 with Retry-After; clients try again."""


class Fenced(RuntimeError):
    """The database refused a write made under a leadership epoch that is no longer the
    leader's: this coordinator was deposed and must step down."""


class StateStore(Protocol):
    """Every read and write the repair core makes, and nothing else (the API's listings and
    `/metrics`' counts read the store itself)."""

    # --- transactions ----------------------------------------------------------------------------
    def tx(self) -> AbstractContextManager[None]:
        """A transaction; nested, a savepoint: all of it commits, or none of it."""

    def lock_key(self, key: str) -> None:
        """Serialize every writer taking `key` until the transaction ends (replicas ingesting one
        fault at once open one incident)."""

    # --- states (lifecycle.py only) --------------------------------------------------------------
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
    def audit(
        self,
        now: float,
        who: str,
        what: str,
        why: str,
        incident_id: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None: ...
    # --- events ----------------------------------------------------------------------------------
    def insert_events(self, events: Sequence[Event], received_at: float) -> set[str]: ...
    def link_events(self, links: Iterable[tuple[str, int]]) -> None: ...
    def events_from(
        self, who: str, value: str, kinds: Sequence[str], since: float, limit: int
    ) -> list[StoredEvent]: ...
    def sdc_digests(
        self, job: str, check_id: str, since: float, after_step: int
    ) -> list[StoredEvent]: ...
    def sdc_digests_of_incident(self, incident_id: int) -> list[StoredEvent]: ...
    def fr_analysis(self, job: str, check_id: str) -> StoredEvent | None: ...
    def node_verdicts(self, node: str, since: float) -> list[tuple[float, str]]: ...
    def node_validation(self, node: str, request_id: str) -> StoredEvent | None: ...
    def rank_stacks(self, job: str, request_id: str) -> list[StoredEvent]: ...
    def prune_events(self, after: int, cutoff: float, chunk: int) -> PruneResult: ...
    def first_event_ts(self, incident_id: int) -> float | None: ...
    # --- fleet -----------------------------------------------------------------------------------
    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None: ...
    def insert_node(self, name: str, state: str, now: float, reason: str | None) -> bool: ...
    def node(self, name: str) -> NodeRow | None: ...
    def count_nodes(self, states: Iterable[str], changed_since: float | None = None) -> int: ...
    def insert_job(self, job_id: str, state: str, status: JobStatusPayload, now: float) -> None: ...
    def save_job_status(self, job_id: str, status: JobStatusPayload, now: float) -> None: ...
    def job(self, job_id: str) -> JobRow | None: ...
    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]: ...
    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]: ...
    # --- incidents, runs and steps ---------------------------------------------------------------
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
    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None: ...
    def active_incident_on(
        self, target: str, faults: Iterable[str], states: Iterable[str]
    ) -> int | None: ...
    def save_incident_detail(
        self, incident_id: int, detail: IncidentDetail, now: float
    ) -> None: ...
    def acknowledge_incident(self, incident_id: int, who: str, now: float) -> bool: ...
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
    def save_run(self, run: RunRow, now: float) -> None: ...
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
    def done_steps(self, action: str, job_id: str | None = None) -> list[DoneStepRow]: ...
    def save_step_result(
        self, key: str, result: dict[str, Any], target: str | None, done_at: float | None
    ) -> None: ...
    def incident_steps(self, incident_id: int) -> list[StepRow]: ...
    def run_steps(self, run_id: int) -> list[StepRow]: ...
    def relaunching_run(self, job: str, launched_at: float) -> int | None: ...
    def insert_repair_stages(self, stages: RepairStagesRow) -> None: ...
    # --- effects ---------------------------------------------------------------------------------
    def insert_effect(
        self,
        key: str,
        kind: str,
        target: str,
        args: dict[str, Any],
        state: str,
        incident_id: int | None,
        now: float,
    ) -> EffectRow: ...
    def effect(self, key: str) -> EffectRow | None: ...
    def effects(self, states: Iterable[str]) -> list[EffectRow]: ...
    def begin_effect(self, key: str) -> int: ...
    def save_effect_result(self, key: str, result: dict[str, Any], now: float) -> None: ...
    # --- commands --------------------------------------------------------------------------------
    def insert_commands(self, commands: Sequence[NewCommand]) -> None: ...
    def command(self, command_id: str) -> CommandRow | None: ...
    def take_commands(self, target_kind: str, target: str, now: float) -> list[CommandRow]: ...
    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool: ...
    # --- tokens ----------------------------------------------------------------------------------
    def insert_token(
        self, token_id: str, hashed: str, role: str, node: str | None, job: str | None, now: float
    ) -> bool: ...
    def token(self, token_id: str) -> TokenRow | None: ...
    def tokens(self) -> list[TokenRow]: ...
    def revoke_token(self, token_id: str, now: float) -> bool: ...
    def count_tokens(self, revoked: bool) -> int: ...
    # --- playbook modes: an operator's shadow/acting switch --------------------------------------
    def playbook_mode(self, playbook: str) -> str | None: ...
    def playbook_modes(self) -> dict[str, str]: ...
    def set_playbook_mode(self, playbook: str, mode: str, who: str, now: float) -> None: ...
    # --- flight-recorder dumps -------------------------------------------------------------------
    def put_fr_dump(self, check_id: str, node: str, name: str, data: bytes, now: float) -> None: ...
    def fr_dumps(self, check_id: str) -> list[tuple[str, str, bytes]]: ...
    def prune_fr_dumps(self, cutoff: float) -> int: ...
