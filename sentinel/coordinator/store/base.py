"""What every repository of the store stands on: the backend's few primitives (a backend is a
subclass that brings the connection, transactions, migrations and the places where dialects
differ), typed rows out of driver rows, and the column lists every statement shares.

What every backend promises:

- `tx()` is a transaction; nested, a savepoint. Everything a method writes inside it commits or
  rolls back with it. Outside one, each write is its own transaction.
- Ids the store assigns are 64-bit integers; an id outside that range names no row (a lookup
  answers None, not an error).
- Event arrival order is an opaque integer cursor (SQLite's rowid, a PostgreSQL sequence).
- A lost database raises `StoreUnavailable` (the API answers 503), never a driver's error.

Typed rows (`core/rows.py`) are what leaves: no driver's row type crosses this line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from enum import Enum
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from sentinel.coordinator.core.rows import (
    IncidentDetail,
    RepairStagesRow,
)
from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.core.store import MAX_ID

# Built once: json.dumps with any argument builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


class Cursor(Protocol):
    """What a statement's result offers, whatever the driver."""

    @property
    def rowcount(self) -> int: ...


class SqlBase(ABC):
    """The backend's primitives and the helpers every repository uses."""

    # The column that orders events by arrival (see `prune_events`).
    EVENT_CURSOR = "rowid"

    @abstractmethod
    def tx(self) -> AbstractContextManager[None]:
        """A transaction (nested calls become savepoints): all of it commits, or none of it."""

    @abstractmethod
    def close(self) -> None: ...

    def start_background(self) -> None:  # noqa: B027 (a hook most backends leave empty)
        """Housekeeping threads the backend needs (SQLite: the WAL checkpointer)."""

    def file_sizes(self) -> dict[str, int]:
        """Bytes on this host's disk the store takes (none for a database server)."""
        return {}

    @contextmanager
    def fenced(self, epoch: int) -> Iterator[None]:
        """Writes inside carry the leader's `epoch`; a store several coordinators share refuses
        them once the epoch is stale (`Fenced`). One coordinator's store has nothing to fence."""
        yield

    def lock_key(self, key: str) -> None:  # noqa: B027 (one writer needs nothing)
        """Serialize, until the transaction ends, every writer that takes the same key: two
        coordinators ingesting the same fault at once must open one incident, not two. One
        writer (SQLite) needs nothing."""

    @abstractmethod
    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    @abstractmethod
    def _first(self, sql: str, params: Sequence[Any] = ()) -> Any | None: ...

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement; the result has the driver's `rowcount`."""

    @abstractmethod
    def _runmany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    @abstractmethod
    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT of one row; the id the database gave it."""

    @abstractmethod
    def _json_text(self, column: str, key: str) -> str:
        """SQL for a JSON column's top-level field, as text."""

    @abstractmethod
    def _json_number(self, column: str, key: str) -> str:
        """SQL for a JSON column's top-level field, as a number."""

    @abstractmethod
    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows as {column: value}, for `query`."""

    # Ad-hoc reads and writes for tests and operators inspecting a store; the coordinator
    # itself uses only the typed methods below.
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [decode_json(row) for row in self._dicts(sql, params)]

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Cursor:
        return self._run(sql, params)

    def _row(self, cls: type[_R], sql: str, params: Sequence[Any] = ()) -> _R | None:
        row = self._first(sql, params)
        return None if row is None else from_row(cls, row)

    def _rows(self, cls: type[_R], sql: str, params: Sequence[Any] = ()) -> list[_R]:
        return [from_row(cls, r) for r in self._all(sql, params)]

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self._first(sql, params)
        return int(row[0]) if row is not None and row[0] is not None else 0


# entity -> (table, state column, column stamped with the time of a move)
STATE_COLUMNS: dict[Entity, tuple[str, str, str | None]] = {
    Entity.INCIDENT: ("incidents", "state", "updated_at"),
    Entity.RUN: ("runs", "status", "updated_at"),
    Entity.STEP: ("actions", "state", None),
    Entity.NODE: ("nodes", "state", "state_changed_at"),
    Entity.JOB: ("jobs", "state", None),
    Entity.EFFECT: ("effects", "state", None),
}
KEYS: dict[Entity, str] = {
    Entity.INCIDENT: "id",
    Entity.RUN: "id",
    Entity.STEP: "key",
    Entity.NODE: "name",
    Entity.JOB: "id",
    Entity.EFFECT: "key",
}


def key_ok(key: str | int) -> bool:
    """An integer key a 64-bit column can hold: larger ones name no row (and would overflow)."""
    return not isinstance(key, int) or -MAX_ID - 1 <= key <= MAX_ID


NODE_COLS = "name, last_seen, verdict, state, state_changed_at, reason"
JOB_COLS = "id, state, generation, last_heartbeat, status"
INCIDENT_COLS = (
    "id, key, fault, target, job, state, playbook, opened_at, updated_at, first_step,"
    " acknowledged_by, detail"
)
RUN_COLS = (
    "id, incident_id, playbook, status, step_index, context, dry_run, created_at, updated_at,"
    " step_started_at"
)
STEP_COLS = (
    "id, key, incident_id, run_id, action, target, params, state, result, dry_run, who,"
    " started_at, done_at"
)
AUDIT_COLS = "id, ts, who, what, why, incident_id, detail"
COMMAND_COLS = (
    "id, target_kind, target, kind, args, created_at, delivered_at, acked_at, result, incident_id"
)
TOKEN_COLS = "id, hash, role, node, job, created_at, revoked_at"
EFFECT_COLS = (
    "id, key, kind, target, args, state, attempts, result, incident_id, created_at, done_at"
)
EVENT_COLS = "id, kind, node, rank, job, ts, payload"
STAGE_COLS = ", ".join(f.name for f in dataclasses.fields(RepairStagesRow))


_JSON_COLUMNS = frozenset({"payload", "status", "detail", "context", "params", "result", "args"})


def decode_json(row: dict[str, Any]) -> dict[str, Any]:
    for key in _JSON_COLUMNS & row.keys():
        value = row[key]
        if isinstance(value, str) and value[:1] in ("{", "["):  # runs.status is plain text
            row[key] = json.loads(value)
    return row


def jobs_not_in(states: Iterable[str]) -> tuple[str, list[str]]:
    """The jobs in none of these states: (SQL, its parameters)."""
    out = [str(s) for s in states]
    return f"SELECT {JOB_COLS} FROM jobs WHERE state NOT IN ({','.join('?' * len(out))})", out


def detail_json(detail: IncidentDetail) -> str:
    return detail.model_dump_json(exclude_none=True)


_CHUNK = 256  # rows per INSERT statement at most (8 parameters each for events)
_T = TypeVar("_T")
_R = TypeVar("_R")


def chunks(rows: list[_T]) -> Iterator[list[_T]]:
    """`rows` in chunks of fixed sizes (256, then powers of two): few statements, each of a
    size seen before, so the driver's statement cache keeps them prepared."""
    start = 0
    while start < len(rows):
        size = _CHUNK
        while size > len(rows) - start:
            size //= 2
        yield rows[start : start + size]
        start += size


@functools.cache
def values_sql(head: str, row: str, size: int, tail: str = "") -> str:
    return head + ",".join([row] * size) + tail


_Row = TypeVar("_Row")


def from_row(cls: type[_Row], values: Any) -> _Row:
    """A typed row from a driver's row (a sequence in the dataclass's field order): each value
    converted by its field's type: an enum by value, a pydantic model and a dict from their
    JSON text, a flag from its integer."""
    converters: tuple[Callable[[Any], Any], ...] = _converters(cls)  # type: ignore[arg-type]
    return cls(*[convert(v) for convert, v in zip(converters, values, strict=True)])


@functools.cache
def _converters(cls: Any) -> tuple[Callable[[Any], Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(_converter(hints[f.name]) for f in dataclasses.fields(cls))


def _same(value: Any) -> Any:
    return value


def _converter(tp: Any) -> Callable[[Any], Any]:
    args = typing.get_args(tp)
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        tp = next(a for a in args if a is not type(None))
    convert: Callable[[Any], Any]
    if isinstance(tp, type) and issubclass(tp, Enum):
        convert = tp
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        convert = tp.model_validate_json
    elif typing.get_origin(tp) is dict:
        convert = json.loads
    elif tp is bool:
        convert = bool
    else:
        return _same
    if optional:
        return lambda v: convert(v) if v else None
    return convert
