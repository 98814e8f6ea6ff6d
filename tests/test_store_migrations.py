"""One migration runner (Alembic) for both databases: a store made before it, at the last version
the old per-backend migrations reached, is taken over with everything it held."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from coord_util import query

from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.store import SqliteStore
from sentinel.coordinator.store.migrate import head, revision

# The SQLite layout the old migrations left (schema_version 6), as sqlite_master held it.
LEGACY_SQLITE = """
CREATE TABLE events (id TEXT PRIMARY KEY, kind TEXT NOT NULL, node TEXT, rank INTEGER, job TEXT,
  ts REAL NOT NULL, payload TEXT NOT NULL, received_at REAL NOT NULL, incident_id INTEGER);
CREATE TABLE nodes (name TEXT PRIMARY KEY, last_seen REAL, verdict TEXT,
  state TEXT NOT NULL DEFAULT 'active', state_changed_at REAL, reason TEXT);
CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0,
  last_heartbeat REAL, status TEXT NOT NULL DEFAULT '{}');
CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
  fault TEXT NOT NULL, target TEXT NOT NULL, job TEXT, state TEXT NOT NULL, playbook TEXT,
  opened_at REAL NOT NULL, updated_at REAL NOT NULL, first_step INTEGER, acknowledged_by TEXT,
  detail TEXT NOT NULL DEFAULT '{}');
CREATE INDEX incidents_key ON incidents(key, state);
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL,
  playbook TEXT NOT NULL, status TEXT NOT NULL, step_index INTEGER NOT NULL DEFAULT 0,
  context TEXT NOT NULL DEFAULT '{}', dry_run INTEGER NOT NULL DEFAULT 0,
  created_at REAL NOT NULL, updated_at REAL NOT NULL, step_started_at REAL);
CREATE TABLE actions (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,
  incident_id INTEGER, run_id INTEGER, action TEXT NOT NULL, target TEXT,
  params TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL, result TEXT NOT NULL DEFAULT '{}',
  dry_run INTEGER NOT NULL DEFAULT 0, who TEXT NOT NULL, started_at REAL NOT NULL, done_at REAL);
CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, who TEXT NOT NULL,
  what TEXT NOT NULL, why TEXT NOT NULL, incident_id INTEGER, detail TEXT NOT NULL DEFAULT '{}');
CREATE TABLE commands (id TEXT PRIMARY KEY, target_kind TEXT NOT NULL, target TEXT NOT NULL,
  kind TEXT NOT NULL, args TEXT NOT NULL, created_at REAL NOT NULL, delivered_at REAL,
  acked_at REAL, result TEXT, incident_id INTEGER);
CREATE INDEX commands_pending ON commands(target_kind, target, acked_at);
CREATE TABLE tokens (id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL,
  node TEXT, job TEXT, created_at REAL NOT NULL, revoked_at REAL);
CREATE INDEX events_incident ON events(incident_id) WHERE incident_id IS NOT NULL;
CREATE INDEX events_kind_ts ON events(kind, ts);
CREATE TABLE effects (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL, target TEXT NOT NULL, args TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, result TEXT NOT NULL DEFAULT '{}', incident_id INTEGER,
  created_at REAL NOT NULL, done_at REAL);
CREATE INDEX effects_state ON effects(state);
CREATE TABLE fr_dumps (check_id TEXT NOT NULL, node TEXT NOT NULL, name TEXT NOT NULL,
  data BLOB NOT NULL, stored_at REAL NOT NULL, PRIMARY KEY (check_id, node, name));
CREATE TABLE repair_stages (run_id INTEGER PRIMARY KEY, incident_id INTEGER NOT NULL,
  playbook TEXT NOT NULL, detected_at REAL NOT NULL, decided_at REAL NOT NULL, drained_at REAL,
  restart_at REAL NOT NULL, relaunched_at REAL NOT NULL, rendezvoused_at REAL NOT NULL,
  checkpoint_loaded_at REAL NOT NULL, first_step_at REAL NOT NULL, resume_step INTEGER NOT NULL);
CREATE INDEX repair_stages_incident ON repair_stages(incident_id);
CREATE TABLE schema_version (version INTEGER NOT NULL);
"""


def _legacy(path: Path, version: int) -> None:
    db = sqlite3.connect(path)
    db.executescript(LEGACY_SQLITE)
    db.execute("INSERT INTO schema_version VALUES (?)", (version,))
    for i, ev in enumerate(["a", "b", "c"]):
        db.execute(
            "INSERT INTO events (id, kind, node, ts, payload, received_at, incident_id)"
            " VALUES (?, 'gpu.xid', 'node-1', ?, '{}', ?, ?)",
            (ev, float(i), float(i), 1 if ev == "b" else None),
        )
    db.execute("DELETE FROM events WHERE id='a'")  # the cursor is the old rowid, gaps and all
    db.execute(
        "INSERT INTO incidents (key, fault, target, state, opened_at, updated_at)"
        " VALUES ('k', 'gpu_hardware', 'node-1', 'open', 1.0, 1.0)"
    )
    db.commit()
    db.close()


def test_a_store_made_before_alembic_is_taken_over_with_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _legacy(path, 6)
    store = SqliteStore(path)
    try:
        assert revision(store) == head()
        rows = query(store, "SELECT seq, id, incident_id FROM events ORDER BY seq")
        assert [(r["seq"], r["id"], r["incident_id"]) for r in rows] == [
            (2, "b", 1),
            (3, "c", None),
        ]
        incident = store.incident(1)
        assert incident is not None and incident.state == "open"
        assert store.state_of(Entity.INCIDENT, 1) == "open"
        tables = {
            r["name"] for r in query(store, "SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert "schema_version" not in tables and "leadership" in tables
        new = store.insert_events([], 5.0)  # the store works on: nothing new, and no error
        assert new == set()
    finally:
        store.close()
    reopened = SqliteStore(path)  # and opens again as it is
    assert revision(reopened) == head()
    reopened.close()


def test_a_store_at_an_older_legacy_version_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _legacy(path, 5)
    with pytest.raises(RuntimeError, match=r"legacy version 5.*release before this one"):
        SqliteStore(path)
