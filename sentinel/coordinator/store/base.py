"""What every repository of the store stands on: one SQLAlchemy connection used by one thread at
a time (the coordinator's store thread), transactions that nest as savepoints, the driver's
errors turned into the store's, and typed rows out of driver rows.

What every backend promises:

- `tx()` is a transaction; nested, a savepoint. Everything a method writes inside it commits or
  rolls back with it. Outside one, each statement is its own transaction (the connection runs
  in the driver's autocommit mode; `tx()` says BEGIN itself, as each database wants it).
- Ids the store assigns are 64-bit integers; an id outside that range names no row (a lookup
  answers None, not an error).
- Event arrival order is the `seq` column (SQLite's rowid, a PostgreSQL sequence).
- A lost database raises `StoreUnavailable` (the API answers 503), never a driver's error; a
  session lost inside a transaction fails every statement after it until the transaction ends:
  nothing the caller was told is committed was not.

Typed rows (`core/rows.py`) are what leaves: no driver's row type crosses this line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import threading
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Connection, Engine, Executable, Table, exc
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement
from sqlalchemy.types import Double, Text

from sentinel.coordinator.core.store import MAX_ID, StoreUnavailable

# Built once: json.dumps with any argument builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_R = TypeVar("_R")


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def key_ok(key: str | int) -> bool:
    """An integer key a 64-bit column can hold: larger ones name no row (and would overflow)."""
    return not isinstance(key, int) or -MAX_ID - 1 <= key <= MAX_ID


class SqlBase:
    """The connection and its transactions; a backend says how to begin and what failed."""

    BEGIN = "BEGIN"  # how a transaction starts
    # The dialect's insert, which can skip or update a row already there (ON CONFLICT).
    _insert: Callable[[Table], Any]

    def __init__(self, engine: Engine) -> None:
        # Every statement's count of rows changed is kept, whatever kind it is (an INSERT's
        # tells whether ON CONFLICT skipped the row).
        self.engine = engine.execution_options(preserve_rowcount=True)
        self._conn: Connection | None = None
        self._lock = threading.RLock()
        self._depth = 0
        self._lost = False  # the session died inside the transaction still open
        # `_many`'s statements as this database's SQL, and their parameters' order if positional
        self._compiled: dict[Any, tuple[str, Callable[[Any], Any] | None]] = {}

    # --- what a backend provides ---------------------------------------------------------

    def _connected(self, conn: Connection) -> None:
        """A new session is open (PostgreSQL: a leader's carries its epoch again)."""

    def _failure(self, error: BaseException | None) -> Exception | None:
        """The store's error for a driver's (None: raise it as it is); a lost session is
        closed here, and the next statement outside a transaction opens another."""
        return None

    def _before_begin(self, conn: Connection) -> None:
        """Work the session does before each transaction begins (SQLite: the WAL catch-up)."""

    def start_background(self) -> None:
        """Housekeeping threads the backend needs (SQLite: the WAL checkpointer)."""

    def file_sizes(self) -> dict[str, int]:
        """Bytes on this host's disk the store takes (none for a database server)."""
        return {}

    @contextmanager
    def fenced(self, epoch: int) -> Iterator[None]:
        """Writes inside carry the leader's `epoch`; a store several coordinators share refuses
        them once the epoch is stale (`Fenced`). One coordinator's store has nothing to fence."""
        yield

    def lock_key(self, key: str) -> None:
        """Serialize, until the transaction ends, every writer that takes the same key: two
        coordinators ingesting the same fault at once must open one incident, not two. One
        writer (SQLite) needs nothing."""

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self.engine.dispose()

    # --- the session -----------------------------------------------------------------------

    @property
    def conn(self) -> Connection:
        """The session, opened again if it was lost, except inside a transaction: what the lost
        session held died with it, and statements on a new one would commit on their own, half
        a transaction (a batch acknowledged, part of it never stored)."""
        if self._lost:
            raise StoreUnavailable(
                "the database connection was lost in a transaction: none of it committed"
            )
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            if self._depth > 0:
                raise StoreUnavailable(
                    "the database connection was lost in a transaction: none of it committed"
                )
            try:
                self._conn = self.engine.connect()
            except exc.DBAPIError as e:
                raise self._failure(e.orig) or e from None
            self._connected(self._conn)
        return self._conn

    @contextmanager
    def _driver(self) -> Iterator[Connection]:
        """The session, with the driver's errors turned into the store's."""
        with self._lock:
            conn = self.conn
            try:
                yield conn
            except (exc.DBAPIError, self.engine.dialect.loaded_dbapi.Error) as e:
                failure = self._failure(e.orig if isinstance(e, exc.DBAPIError) else e)
                if self._conn is None and self._depth > 0:
                    self._lost = True
                if failure is None:
                    raise
                raise failure from None

    def _x(self, stmt: Executable, params: Any = None) -> Any:
        """Run one statement; its result, read whole (rows, or the count of rows changed)."""
        with self._driver() as conn:
            result = conn.execute(stmt, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    def _sql(self, text_: str) -> None:
        """A statement of the session itself (BEGIN, SAVEPOINT, COMMIT, a PRAGMA), straight to
        the driver: it builds nothing and reads nothing."""
        with self._driver() as conn:
            conn.connection.driver_connection.execute(text_)  # type: ignore[union-attr]

    def _many(self, stmt: Any, rows: list[dict[str, Any]] | dict[str, Any]) -> Any:
        """The hot path's statements (a batch of events, the nodes it saw): compiled once by
        SQLAlchemy for this database, then run with the rows as the driver takes them (a list:
        executemany), so a fleet's rows skip SQLAlchemy's per-row parameter work. Its rows,
        or the count of rows changed."""
        found = self._compiled.get(stmt)
        if found is None:
            compiled = stmt.compile(dialect=self.engine.dialect)
            order = compiled.positiontup
            found = (str(compiled), operator.itemgetter(*order) if order else None)
            self._compiled[stmt] = found
        text_, pick = found
        params: Any = rows
        if pick is not None:  # a driver that takes parameters by position
            params = (
                [_tuple(pick(r)) for r in rows] if isinstance(rows, list) else _tuple(pick(rows))
            )
        with self._driver() as conn:
            result = conn.exec_driver_sql(text_, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    @contextmanager
    def tx(self) -> Iterator[None]:
        """A transaction (nested calls become savepoints): all of it commits, or none of it."""
        with self._lock:
            outer, name = self._depth == 0, f"sp{self._depth}"
            if outer:
                self._before_begin(self.conn)
            self._sql(self.BEGIN if outer else f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._undo(name, outer)
                raise
            else:
                self._sql("COMMIT" if outer else f"RELEASE {name}")
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._lost = False

    def _undo(self, savepoint: str, outer: bool) -> None:
        conn = self._conn
        if conn is None or self._lost or conn.invalidated:
            return  # the server rolled it back with the session
        try:
            if outer:
                self._sql("ROLLBACK")
            else:
                self._sql(f"ROLLBACK TO {savepoint}")
                self._sql(f"RELEASE {savepoint}")
        except Exception:  # the session is in no state to go on: the next call opens another
            conn.close()
            self._conn = None

    # --- typed rows ------------------------------------------------------------------------

    def _row(self, cls: type[_R], stmt: Executable) -> _R | None:
        rows = self._x(stmt)
        return from_row(cls, rows[0]) if rows else None

    def _rows(self, cls: type[_R], stmt: Executable) -> list[_R]:
        return [from_row(cls, r) for r in self._x(stmt)]

    def _scalar(self, stmt: Executable) -> Any:
        rows = self._x(stmt)
        return rows[0][0] if rows else None

    def _count(self, stmt: Executable) -> int:
        return int(self._scalar(stmt) or 0)


def _tuple(picked: Any) -> tuple[Any, ...]:
    """What `itemgetter` picked, as a tuple even when it picked one value."""
    return picked if isinstance(picked, tuple) else (picked,)


class json_field(FunctionElement[str]):
    """A JSON text column's top-level field, as text (`json_field(col, "key")`), or as a number
    (`json_field(col, "key", number=True)`): the one place the dialects' JSON syntax differs."""

    inherit_cache = True

    def __init__(self, column: ColumnElement[Any], key: str, number: bool = False) -> None:
        self.key, self.number = key, number
        self.type = Double() if number else Text()
        super().__init__(column)


@compiles(json_field, "sqlite")
def _json_sqlite(element: json_field, compiler: Any, **kw: Any) -> str:
    column = compiler.process(next(iter(element.clauses)), **kw)
    return f"json_extract({column}, '$.{element.key}')"


@compiles(json_field, "postgresql")
def _json_postgresql(element: json_field, compiler: Any, **kw: Any) -> str:
    column = compiler.process(next(iter(element.clauses)), **kw)
    text_ = f"({column}::json->>'{element.key}')"
    return f"{text_}::double precision" if element.number else text_


def columns(cls: type) -> list[str]:
    """The table columns a row type holds, in its fields' order."""
    return [f.name for f in dataclasses.fields(cls)]


def from_row(cls: type[_R], values: Sequence[Any]) -> _R:
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
