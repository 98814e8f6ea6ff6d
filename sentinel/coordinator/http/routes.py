"""The route table: every route the API serves, which roles it lets in (the router enforces
them, `app.py`), what its path, query and body hold (the handlers and the OpenAPI description
read the same models), and its handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sentinel.coordinator.core import operator
from sentinel.coordinator.core.auth import Role
from sentinel.coordinator.core.fr_dumps import NAME_PATTERN
from sentinel.coordinator.core.store import MAX_ID
from sentinel.coordinator.http import commands, evidence, ingest, meta, reads
from sentinel.coordinator.http import operator as op
from sentinel.coordinator.http.common import ALL_ROLES
from sentinel.coordinator.http.openapi import Param, Route
from sentinel.protocol import EventBatch

NODE, JOB, OPERATOR, ADMIN = Role.NODE, Role.JOB, Role.OPERATOR, Role.ADMIN
READERS = frozenset({OPERATOR, ADMIN})


_INCIDENT_ID = Param("id", {"type": "integer", "minimum": 1, "maximum": MAX_ID}, "incident id")
_NAME = {"type": "string", "pattern": NAME_PATTERN}
_CHECK = Param("check", _NAME, "the fr.dump command's check id")
_JOB = Param("job", _NAME, "the job id")


def _listing(
    path: str, read: Callable[..., Any], model: type[reads.Listing], summary: str
) -> Route:
    """A list an operator reads: the same handler, roles and row limit for every one."""
    return Route("get", path, reads.listing(read, model), summary, READERS, query=model)


# One row a route: method, path, handler, summary, roles, then what it takes and answers.
ROUTES: tuple[Route, ...] = (
    Route("post", "/v1/events", ingest.post_events,
          "Ingest an event batch (idempotent by event id); ack = durable",
          frozenset({NODE, JOB, ADMIN}), "own node or job", body=EventBatch,
          responses=(200, 400, 401, 403, 413, 422)),
    Route("get", "/v1/commands", commands.get_commands,
          "Long-poll commands: ?node=NAME or ?job=ID, ?wait=SECONDS",
          ALL_ROLES, "a node or job token: its own", query=commands.CommandPoll),
    Route("post", "/v1/commands/{id}/ack", commands.ack_command,
          "Acknowledge a command with its result",
          ALL_ROLES, "its target", (Param("id", {"type": "string"}, "command id"),),
          body=commands.AckBody, responses=(200, 400, 401, 403, 404, 422)),
    _listing("/v1/nodes", reads.nodes, reads.NodeListing, "Known nodes and their state"),
    Route("get", "/v1/fleet/drift", reads.get_drift,
          "Nodes whose configuration fingerprint differs from the fleet's majority, and how",
          READERS, query=reads.DriftQuery, responses=(200, 400, 401, 403)),
    _listing("/v1/jobs", reads.jobs, reads.Listing,
             "Jobs, their generation and last supervisor heartbeat"),
    _listing("/v1/incidents", reads.incidents, reads.IncidentListing,
             "Incidents (?state=open|acting|...)"),
    Route("get", "/v1/incidents/{id}", reads.get_incident,
          "One incident with its events, runs, actions, audit",
          READERS, params=(_INCIDENT_ID,), responses=(200, 401, 403, 404)),
    Route("get", "/v1/incidents/{id}/bundle", evidence.get_bundle,
          "The incident's evidence bundle: one tar.gz (dumps, stacks, node evidence, timeline,"
          " manifest), its sha256 in X-Sentinel-Bundle-Sha256",
          READERS, params=(_INCIDENT_ID,), responses=(200, 401, 403, 404)),
    Route("post", "/v1/incidents/{id}/acknowledge", op.verb(operator.acknowledge),
          "Acknowledge an incident",
          READERS, params=(_INCIDENT_ID,), responses=(200, 401, 403, 404, 409)),
    Route("post", "/v1/incidents/{id}/approve", op.verb(operator.approve),
          "Approve a run awaiting approval or escalated",
          READERS, params=(_INCIDENT_ID,), responses=(200, 401, 403, 404, 409)),
    Route("post", "/v1/incidents/{id}/resolve", op.verb(operator.resolve),
          "Resolve an incident; cancels its runs",
          READERS, params=(_INCIDENT_ID,), responses=(200, 401, 403, 404, 409)),
    _listing("/v1/actions", reads.actions, reads.Listing,
             "Every action run (playbook steps and manual)"),
    Route("post", "/v1/actions", op.run_action,
          "Run an action by hand on an incident",
          READERS, body=op.RunActionBody, responses=(200, 400, 401, 403, 404, 422)),
    _listing("/v1/audit", reads.audit, reads.Listing, "Audit log: who did what, why"),
    Route("get", "/v1/playbooks", op.get_playbooks,
          "Every playbook the coordinator runs, shadow or acting, and what set it", READERS),
    Route("put", "/v1/playbooks/{name}/mode", op.set_playbook_mode,
          "Switch a playbook between shadow (dry runs) and acting, for the runs it opens next",
          READERS, params=(Param("name", _NAME, "the playbook's name"),), body=op.ModeBody,
          responses=(200, 400, 401, 403, 404, 422)),
    Route("put", "/v1/fr/{check}/{node}/{name}", evidence.put_dump,
          "Upload one flight-recorder dump file (or a node's evidence) of an fr.dump check",
          frozenset({NODE, JOB, ADMIN}), "own node, or a node of its own job",
          (_CHECK, Param("node", _NAME, "the node whose ranks wrote the dump"),
           Param("name", _NAME, "the dump file's name")), raw_body="the dump file's bytes"),
    Route("get", "/v1/fr/{check}", evidence.get_dumps,
          "Every dump file of a check (base64)",
          frozenset({JOB, OPERATOR, ADMIN}), params=(_CHECK,)),
    Route("post", "/v1/jobs/{job}/stacks", evidence.ask_stacks,
          "Ask every rank of a job for its Python stacks (all threads), through the agents",
          READERS, params=(_JOB,), responses=(200, 400, 401, 403, 404)),
    Route("get", "/v1/jobs/{job}/stacks/{request}", evidence.get_stacks,
          "The ranks' stacks of one request, grouped (odd ones out first) and who is silent",
          READERS, params=(_JOB, Param("request", _NAME, "the request id the POST answered")),
          responses=(200, 400, 401, 403, 404)),
    Route("get", "/v1/openapi.json", meta.openapi, "This description", ALL_ROLES),
    Route("get", "/metrics", meta.metrics, "Prometheus metrics", ALL_ROLES),
    Route("get", "/healthz", meta.healthz, "Liveness", frozenset(), responses=(200,)),
)  # fmt: skip


def route_for(method: str, path: str) -> Route:
    return next(r for r in ROUTES if (r.method, r.path) == (method, path))
