"""What an operator reads: the fleet, jobs, incidents (one with its whole record), steps and the
audit log, as JSON made from the store's typed rows (read in the store thread)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import to_jsonable_python

from sentinel.config import DRIFT_PATTERN
from sentinel.coordinator.core.states import IncidentState
from sentinel.coordinator.http.common import Refusal, query, service
from sentinel.coordinator.store.sql import SqlStore
from sentinel.fingerprint import drift

INCIDENT_EVENTS = 1000  # events an incident's page lists at most
MAX_ROWS = 10_000


class Listing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = Field(default=500, ge=1, le=MAX_ROWS, description="rows at most")


class NodeListing(Listing):
    limit: int = Field(default=MAX_ROWS, ge=1, le=MAX_ROWS, description="rows at most")


class IncidentListing(Listing):
    state: IncidentState | None = Field(default=None, description="only incidents in this state")


class DriftQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: str = Field(
        default="",
        max_length=8192,
        description="fields allowed to differ, besides coordinator.drift_allowed: "
        "comma-separated fnmatch patterns (env.NCCL_DEBUG,gpu.*.inforom)",
    )

    @field_validator("allow")
    @classmethod
    def _each_a_pattern(cls, value: str) -> str:
        for pattern in filter(None, value.split(",")):
            if not re.fullmatch(DRIFT_PATTERN, pattern):
                raise ValueError(f"{pattern[:40]!r} is not a field name or an fnmatch pattern")
        return value

    def patterns(self) -> list[str]:
        return [p for p in self.allow.split(",") if p]


def as_json(value: Any) -> Any:
    """Rows (dataclasses, models, enums) as the plain JSON values the API answers with."""
    return to_jsonable_python(value)


def nodes(store: SqlStore, q: NodeListing) -> Any:
    """The nodes, each with its NVLink domain (from its latest fingerprint; None: none)."""
    prints = store.fingerprints()
    return [
        {**row, "nvlink_domain": prints.get(row["name"], {}).get("nvlink_domain")}
        for row in as_json(store.nodes(q.limit))
    ]


def fleet_drift(store: SqlStore, allowed: list[str]) -> dict[str, Any]:
    """The nodes whose latest fingerprint differs from the fleet's majority, and how; with the
    seconds the judgement took, reading included."""
    t0 = time.perf_counter()
    prints = store.fingerprints()
    found = drift(prints, allowed)
    return {
        "nodes": len(prints),
        "allowed": allowed,
        "drifted": [
            {"node": d.node, "reason": d.reason(), "differences": as_json(d.differences)}
            for d in found
        ],
        "seconds": round(time.perf_counter() - t0, 6),
    }


async def get_drift(request: web.Request) -> web.Response:
    svc = service(request)
    asked = query(request, DriftQuery).patterns()
    allowed = sorted({*svc.cfg.drift_allowed, *asked})
    return web.json_response(await svc.db(fleet_drift, svc.store, allowed))


def jobs(store: SqlStore, q: Listing) -> Any:
    return as_json(store.jobs(q.limit))


def incidents(store: SqlStore, q: IncidentListing) -> Any:
    return as_json(store.incidents(q.limit, q.state))


def actions(store: SqlStore, q: Listing) -> Any:
    return as_json(store.steps(q.limit))


def audit(store: SqlStore, q: Listing) -> Any:
    return as_json(store.audit_log(q.limit))


def incident(store: SqlStore, incident_id: int) -> dict[str, Any] | None:
    view = store.incident_view(incident_id, INCIDENT_EVENTS)
    if view is None:
        return None
    doc: dict[str, Any] = as_json(view.incident)
    doc.update(
        events=as_json(view.events),
        runs=as_json(view.runs),
        actions=as_json(view.actions),
        audit=as_json(view.audit),
        stages=as_json(view.stages),  # each relaunching repair's timeline (`stages.py`)
        bundle=bundle_summary(store, incident_id),
    )
    return doc


def bundle_summary(store: SqlStore, incident_id: int) -> dict[str, Any] | None:
    """The incident's evidence bundle, less its bytes (`GET .../bundle` serves them)."""
    found = store.bundle(incident_id)
    if found is None:
        return None
    keys = ("capture_s", "seal_s", "missing", "started_at", "captured_at", "sealed_at")
    return {"sha256": found.sha256, "bytes": len(found.data)} | {
        k: found.manifest.get(k) for k in keys
    }


def listing(read: Callable[[SqlStore, Any], Any], model: type[Listing]) -> Callable[..., Any]:
    async def handler(request: web.Request) -> web.Response:
        svc = service(request)
        return web.json_response(await svc.db(read, svc.store, query(request, model)))

    return handler


def incident_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise Refusal(404, "no such incident") from None


async def get_incident(request: web.Request) -> web.Response:
    svc = service(request)
    doc = await svc.db(incident, svc.store, incident_id(request))
    if doc is None:
        raise Refusal(404, "no such incident")
    return web.json_response(doc)
