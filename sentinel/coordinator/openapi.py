"""The OpenAPI description served at /v1/openapi.json (schemas from the pydantic models)."""

from __future__ import annotations

from typing import Any

from sentinel.protocol import Command, EventBatch

_ROUTES: list[tuple[str, str, str, str]] = [
    (
        "post",
        "/v1/events",
        "Ingest an event batch (idempotent by event id); ack = durable",
        "node, job (own scope), admin",
    ),
    (
        "get",
        "/v1/commands",
        "Long-poll commands: ?node=NAME or ?job=ID, ?wait=SECONDS",
        "node, job (own scope), operator, admin",
    ),
    ("post", "/v1/commands/{id}/ack", "Acknowledge a command with its result", "target, admin"),
    ("get", "/v1/nodes", "Known nodes and their state", "operator, admin"),
    ("get", "/v1/jobs", "Jobs, their generation and last supervisor heartbeat", "operator, admin"),
    ("get", "/v1/incidents", "Incidents (?state=open|acting|...)", "operator, admin"),
    (
        "get",
        "/v1/incidents/{id}",
        "One incident with its events, runs, actions, audit",
        "operator, admin",
    ),
    ("post", "/v1/incidents/{id}/acknowledge", "Acknowledge an incident", "operator, admin"),
    (
        "post",
        "/v1/incidents/{id}/approve",
        "Approve a run awaiting approval or escalated",
        "operator, admin",
    ),
    (
        "post",
        "/v1/incidents/{id}/resolve",
        "Resolve an incident; cancels its runs",
        "operator, admin",
    ),
    ("get", "/v1/actions", "Every action run (playbook steps and manual)", "operator, admin"),
    ("post", "/v1/actions", "Run an action by hand on an incident", "operator, admin"),
    ("get", "/v1/audit", "Audit log: who did what, why", "operator, admin"),
    (
        "put",
        "/v1/fr/{check}/{node}/{name}",
        "Upload one flight-recorder dump file of an fr.dump check",
        "node (own node), admin",
    ),
    ("get", "/v1/fr/{check}", "Every dump file of a check (base64)", "job, operator, admin"),
    ("get", "/metrics", "Prometheus metrics", "any token"),
    ("get", "/healthz", "Liveness", "none"),
]


def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, roles in _ROUTES:
        op: dict[str, Any] = {
            "summary": summary,
            "description": f"Roles: {roles}.",
            "responses": {
                "200": {"description": "ok"},
                "400": {"description": "malformed"},
                "401": {"description": "no or bad token"},
                "403": {"description": "wrong scope"},
            },
        }
        if path == "/v1/events":
            op["requestBody"] = {
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/EventBatch"}}
                }
            }
            op["responses"]["413"] = {"description": "body too large"}
            op["responses"]["422"] = {"description": "unknown version or invalid message"}
        if path == "/healthz":
            op["security"] = []
        paths.setdefault(path, {})[method] = op
    batch = EventBatch.model_json_schema(ref_template="#/components/schemas/{model}")
    command = Command.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = {**batch.pop("$defs", {}), **command.pop("$defs", {})}
    schemas.update({"EventBatch": batch, "Command": command})
    return {
        "openapi": "3.1.0",
        "info": {"title": "Sentinel coordinator", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
