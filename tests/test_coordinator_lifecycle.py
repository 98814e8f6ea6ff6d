"""The lifecycle module is the only writer of state, and the store the only holder of SQL.

These tests read the source: every call of a store method that writes a state column must sit
in `sentinel/coordinator/core/lifecycle.py`, every SQL statement that writes a state column must sit
in one of those methods, and no SQL may appear outside the store package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from coord_util import ROOT
from sqlalchemy import DefaultClause

from sentinel.coordinator.core import lifecycle, states
from sentinel.coordinator.core.states import (
    INITIAL,
    STATE_TYPES,
    TABLES,
    Entity,
    IncidentState,
    NodeState,
    RunState,
    TransitionError,
)
from sentinel.coordinator.core.store import STATE_WRITERS
from sentinel.coordinator.store import SqliteStore
from sentinel.coordinator.store.schema import nodes

SENTINEL = ROOT / "sentinel"
STORE_PKG = SENTINEL / "coordinator" / "store"
LIFECYCLE = SENTINEL / "coordinator" / "core" / "lifecycle.py"
SQL = re.compile(
    r"\b(SELECT\s.+\sFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b", re.S
)
# Each table's state column: runs keep theirs in `status` (jobs.status is the last report).
STATE_COLUMNS = {
    "incidents": "state",
    "runs": "status",
    "actions": "state",
    "nodes": "state",
    "jobs": "state",
    "effects": "state",
}
WRITES_STATE = re.compile(
    "|".join(
        rf"UPDATE\s+{table}\s+SET\s[^;]*?\b{col}\s*="
        rf"|INSERT\s+(OR\s+\w+\s+)?INTO\s+{table}\s*\([^)]*\b{col}\b"
        for table, col in STATE_COLUMNS.items()
    ),
    re.S | re.I,
)


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _strings(node: ast.AST) -> list[str]:
    """The string constants under `node`, an f-string's literal parts joined."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr):
            out.append("".join(v.value for v in sub.values if isinstance(v, ast.Constant)))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.append(sub.value)
    return out


def test_only_the_lifecycle_module_calls_a_state_writer() -> None:
    offenders = []
    for path in _sources(SENTINEL):
        if path == LIFECYCLE or STORE_PKG in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STATE_WRITERS
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}")
    assert not offenders, f"state written outside lifecycle.py: {offenders}"


def _writes_a_state(fn: ast.FunctionDef) -> bool:
    """Whether a store method builds a statement that sets a state column: a `state=` value,
    or a run's `status=` (jobs.status is the last report, not a state)."""
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        keys = {k.arg for k in call.keywords}
        if "state" in keys or ("status" in keys and "runs" in names):
            return True
    return False


def test_every_statement_that_writes_a_state_is_a_declared_state_writer() -> None:
    checked = 0
    for path in _sources(STORE_PKG):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            writes = [t for t in _strings(fn) if WRITES_STATE.search(t)]  # as SQL text
            if _writes_a_state(fn):  # as a statement built in SQLAlchemy
                writes.append(f"{fn.name}'s statement")
            for text in writes:
                checked += 1
                assert fn.name in STATE_WRITERS, (
                    f"{path.name}: {fn.name} writes a state column: {text!r}"
                )
    assert checked >= 5  # the inserts of incidents, runs, steps, nodes, jobs, effects
    # ...and the module-level statements (migrations aside) write none.
    for path in _sources(STORE_PKG):
        tree = ast.parse(path.read_text(), str(path))
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and not any(
                isinstance(t, ast.Name) and t.id == "MIGRATIONS"
                for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
            ):
                for text in _strings(stmt):
                    assert not WRITES_STATE.search(text), f"{path.name}: {text!r}"


def test_no_sql_outside_the_store() -> None:
    offenders = []
    for path in _sources(SENTINEL / "coordinator") + _sources(SENTINEL / "commands"):
        if STORE_PKG in path.parents:
            continue
        for text in _strings(ast.parse(path.read_text(), str(path))):
            if SQL.search(text):
                offenders.append(f"{path.relative_to(ROOT)}: {text[:60]!r}")
    assert not offenders, f"SQL outside sentinel/coordinator/store: {offenders}"


def test_every_table_is_complete() -> None:
    for entity, table in TABLES.items():
        states = set(STATE_TYPES[entity])
        assert set(table) == states, f"{entity}: a state without a row"
        for source, targets in table.items():
            assert targets <= states and source not in targets, f"{entity} {source}"
        assert INITIAL[entity] <= states
    # a node heard from for the first time takes the column's default: an initial state
    default = nodes.c.state.server_default
    assert isinstance(default, DefaultClause) and NodeState(default.arg) in INITIAL[Entity.NODE]


def test_a_move_checks_the_table_and_writes_the_audit_entry(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    with store.tx():
        lifecycle.add_node(store, "node-1", NodeState.ACTIVE, 1.0)
    assert lifecycle.move(store, Entity.NODE, "node-1", NodeState.DRAINING, 2.0, "t", "test")
    assert not lifecycle.move(store, Entity.NODE, "node-1", NodeState.DRAINING, 3.0, "t", "again")
    with pytest.raises(TransitionError, match="draining -> spare"):
        lifecycle.move(store, Entity.NODE, "node-1", NodeState.SPARE, 4.0, "t", "no")
    with pytest.raises(LookupError):
        lifecycle.move(store, Entity.NODE, "node-9", NodeState.SPARE, 4.0, "t", "no")
    node = store.node("node-1")
    assert node is not None and (node.state, node.state_changed_at) == ("draining", 2.0)
    (entry,) = store.audit_log(10)
    assert (entry.what, entry.detail["from"], entry.detail["to"]) == (
        "node.draining",
        "active",
        "draining",
    )
    with pytest.raises(TransitionError, match="cannot start"):
        lifecycle.create_run(store, 1, "x", RunState.DONE, False, 5.0)


def test_a_stale_writer_loses() -> None:
    """`set_state` is compare-and-set: a writer that read an old state does not overwrite."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        store = SqliteStore(Path(d) / "c.db")
        lifecycle.add_node(store, "n", NodeState.ACTIVE, 1.0)
        assert store.set_state(Entity.NODE, "n", NodeState.DRAINING, 2.0, expected="active")
        assert not store.set_state(Entity.NODE, "n", NodeState.SPARE, 3.0, expected="active")
        assert store.state_of(Entity.NODE, "n") == "draining"


@pytest.mark.parametrize("page", ["README.md", "docs/repair-core.md"])
def test_the_docs_show_the_tables_the_code_uses(page: str) -> None:
    assert states.markdown_tables() in (ROOT / page).read_text(), (
        f"{page}: regenerate its tables with python -m sentinel.coordinator.core.states"
    )


def test_incident_ids_beyond_64_bits_name_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    huge = 10**30
    assert store.incident(huge) is None and store.incident_view(huge, 10) is None
    assert not store.acknowledge_incident(huge, "op", 1.0)
    assert store.state_of(Entity.INCIDENT, huge) is None
    assert IncidentState.OPEN in INITIAL[Entity.INCIDENT]
