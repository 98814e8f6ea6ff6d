"""The coordinator's schema: one definition (SQLAlchemy Core) for SQLite and PostgreSQL alike.

Types are chosen per dialect by SQLAlchemy: an id is SQLite's rowid (`INTEGER PRIMARY KEY`) and
PostgreSQL's `BIGINT` from a sequence; a time is a double (seconds since the epoch); JSON
columns are text, read by the store's converters. Events keep their arrival order in `seq`,
the cursor retention walks. What only PostgreSQL has, the fence on the engine's tables, is DDL
that runs with the tables there (`FENCE`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import (
    DDL,
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    event,
    text,
)

from sentinel.coordinator.core.states import Entity

metadata = MetaData()
ID = BigInteger().with_variant(Integer, "sqlite")  # SQLite's rowid, PostgreSQL's bigint
EMPTY = text("'{}'")


def _id() -> Column[int]:
    return Column("id", ID, primary_key=True, autoincrement=True)


def _json(name: str) -> Column[str]:
    return Column(name, Text, nullable=False, server_default=EMPTY)


def _time(name: str, nullable: bool = False) -> Column[float]:
    return Column(name, Double, nullable=nullable)


# A node heard from for the first time starts in the column's default state (active).
NODE_DEFAULT_STATE = "active"

events = Table(
    "events",
    metadata,
    Column("seq", ID, primary_key=True, autoincrement=True),  # arrival order
    Column("id", Text, nullable=False, unique=True),
    Column("kind", Text, nullable=False),
    Column("node", Text),
    Column("rank", Integer),
    Column("job", Text),
    _time("ts"),
    Column("payload", Text, nullable=False),
    _time("received_at"),
    Column("incident_id", ID),
    # Most events belong to no incident; indexing their NULLs would only cost every insert.
    Index(
        "events_incident",
        "incident_id",
        sqlite_where=text("incident_id IS NOT NULL"),
        postgresql_where=text("incident_id IS NOT NULL"),
    ),
    # By kind, then time: a fleet's new rows share a few pages at the right end of each kind.
    Index("events_kind_ts", "kind", "ts"),
)
nodes = Table(
    "nodes",
    metadata,
    Column("name", Text, primary_key=True),
    _time("last_seen", nullable=True),
    Column("verdict", Text),
    Column("state", Text, nullable=False, server_default=NODE_DEFAULT_STATE),
    _time("state_changed_at", nullable=True),
    Column("reason", Text),
)
jobs = Table(
    "jobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("generation", Integer, nullable=False, server_default="0"),
    _time("last_heartbeat", nullable=True),
    _json("status"),
)
incidents = Table(
    "incidents",
    metadata,
    _id(),
    Column("key", Text, nullable=False),
    Column("fault", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("job", Text),
    Column("state", Text, nullable=False),
    Column("playbook", Text),
    _time("opened_at"),
    _time("updated_at"),
    Column("first_step", BigInteger),
    Column("acknowledged_by", Text),
    _json("detail"),
    Index("incidents_key", "key", "state"),
    sqlite_autoincrement=True,
)
runs = Table(
    "runs",
    metadata,
    _id(),
    Column("incident_id", ID, nullable=False),
    Column("playbook", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("step_index", Integer, nullable=False, server_default="0"),
    _json("context"),
    Column("dry_run", Integer, nullable=False, server_default="0"),
    _time("created_at"),
    _time("updated_at"),
    _time("step_started_at", nullable=True),
    sqlite_autoincrement=True,
)
actions = Table(
    "actions",
    metadata,
    _id(),
    Column("key", Text, nullable=False, unique=True),
    Column("incident_id", ID),
    Column("run_id", ID),
    Column("action", Text, nullable=False),
    Column("target", Text),
    _json("params"),
    Column("state", Text, nullable=False),
    _json("result"),
    Column("dry_run", Integer, nullable=False, server_default="0"),
    Column("who", Text, nullable=False),
    _time("started_at"),
    _time("done_at", nullable=True),
    sqlite_autoincrement=True,
)
audit = Table(
    "audit",
    metadata,
    _id(),
    _time("ts"),
    Column("who", Text, nullable=False),
    Column("what", Text, nullable=False),
    Column("why", Text, nullable=False),
    Column("incident_id", ID),
    _json("detail"),
    sqlite_autoincrement=True,
)
commands = Table(
    "commands",
    metadata,
    Column("id", Text, primary_key=True),
    Column("target_kind", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("args", Text, nullable=False),
    _time("created_at"),
    _time("delivered_at", nullable=True),
    _time("acked_at", nullable=True),
    Column("result", Text),
    Column("incident_id", ID),
    Index("commands_pending", "target_kind", "target", "acked_at"),
)
tokens = Table(
    "tokens",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hash", Text, nullable=False, unique=True),
    Column("role", Text, nullable=False),
    Column("node", Text),
    Column("job", Text),
    _time("created_at"),
    _time("revoked_at", nullable=True),
)
# Outside effects (drain, notify): recorded before they are made, settled after.
effects = Table(
    "effects",
    metadata,
    _id(),
    Column("key", Text, nullable=False, unique=True),
    Column("kind", Text, nullable=False),
    Column("target", Text, nullable=False),
    _json("args"),
    Column("state", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    _json("result"),
    Column("incident_id", ID),
    _time("created_at"),
    _time("done_at", nullable=True),
    Index("effects_state", "state"),
    sqlite_autoincrement=True,
)
# Flight-recorder dumps carried from the nodes: in the store, so that every coordinator
# sharing it serves a dump whichever one the agent uploaded it to.
fr_dumps = Table(
    "fr_dumps",
    metadata,
    Column("check_id", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
    _time("stored_at"),
    PrimaryKeyConstraint("check_id", "node", "name"),
)
# A repair's stages, timed once its job's new gang reports its launch and first step.
repair_stages = Table(
    "repair_stages",
    metadata,
    Column("run_id", ID, primary_key=True, autoincrement=False),
    Column("incident_id", ID, nullable=False),
    Column("playbook", Text, nullable=False),
    *(_time(f"{m}_at") for m in ("detected", "decided")),
    _time("drained_at", nullable=True),
    *(_time(f"{m}_at") for m in ("restart", "relaunched", "rendezvoused", "checkpoint_loaded")),
    _time("first_step_at"),
    Column("resume_step", BigInteger, nullable=False),
    Index("repair_stages_incident", "incident_id"),
)
# An incident's evidence bundle (`core/bundle.py`): one archive an incident, sealed once and
# never replaced; `sha256` names its bytes, `manifest` (JSON) says what it holds.
bundles = Table(
    "bundles",
    metadata,
    Column("incident_id", ID, primary_key=True, autoincrement=False),
    Column("sha256", Text, nullable=False),
    Column("manifest", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
    *(_time(f"{m}_at") for m in ("started", "captured", "sealed")),
)
# An operator's switch of a playbook between shadow (its runs are dry) and acting, over what
# its file and the coordinator's config say; one row a playbook switched.
playbook_modes = Table(
    "playbook_modes",
    metadata,
    Column("playbook", Text, primary_key=True),
    Column("mode", Text, nullable=False),
    Column("set_by", Text, nullable=False),
    _time("set_at"),
)
# Which replica runs the engine (`lease.py`): one row, moved by the lease's holder.
leadership = Table(
    "leadership",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text),
    Column("epoch", BigInteger, nullable=False, server_default="0"),
    Column("expires_at", Double, nullable=False, server_default="0"),
)
event.listen(leadership, "after_create", DDL("INSERT INTO leadership (name) VALUES ('engine')"))  # type: ignore[no-untyped-call]

# Tables the engine writes; on PostgreSQL each refuses a deposed leader's statement.
FENCED_TABLES = ("incidents", "runs", "actions", "nodes", "jobs", "effects", "commands", "audit")
FENCE_SQLSTATE = "SN001"  # raised by sentinel_fence(): a deposed leader's write
FENCE = [
    """
    CREATE FUNCTION sentinel_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
    DECLARE
        claimed TEXT := current_setting('sentinel.epoch', true);
    BEGIN
        IF claimed IS NULL OR claimed = '' THEN
            RETURN NULL;  -- not the engine's write: any replica ingests
        END IF;
        -- FOR SHARE: a successor's takeover waits for this transaction instead of racing it
        PERFORM 1 FROM leadership WHERE name = 'engine' AND epoch = claimed::BIGINT FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'fenced: epoch %% is no longer the leader''s', claimed
                USING ERRCODE = 'SN001';
        END IF;
        RETURN NULL;
    END
    $fence$
    """,
    *(
        f"CREATE TRIGGER {t}_fence BEFORE INSERT OR UPDATE OR DELETE ON {t}"
        " FOR EACH STATEMENT EXECUTE FUNCTION sentinel_fence()"
        for t in FENCED_TABLES
    ),
]
for statement in FENCE:
    fence = DDL(statement)  # type: ignore[no-untyped-call]
    event.listen(metadata, "after_create", fence.execute_if(dialect="postgresql"))


class StateColumns(NamedTuple):
    """Where an entity keeps its state: its key, its state column, and the column stamped with
    the time of each move (if any)."""

    key: Column[Any]
    state: Column[Any]
    stamp: Column[Any] | None


STATE_COLUMNS: dict[Entity, StateColumns] = {
    Entity.INCIDENT: StateColumns(incidents.c.id, incidents.c.state, incidents.c.updated_at),
    Entity.RUN: StateColumns(runs.c.id, runs.c.status, runs.c.updated_at),
    Entity.STEP: StateColumns(actions.c.key, actions.c.state, None),
    Entity.NODE: StateColumns(nodes.c.name, nodes.c.state, nodes.c.state_changed_at),
    Entity.JOB: StateColumns(jobs.c.id, jobs.c.state, None),
    Entity.EFFECT: StateColumns(effects.c.key, effects.c.state, None),
}
