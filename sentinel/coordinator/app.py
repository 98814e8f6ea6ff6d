"""The coordinator's HTTP API (aiohttp). Handlers parse, call the service, serialize.

Every route but `/healthz` needs a bearer token. Errors are JSON `{"error": "..."}` with the
precise reason: 400 malformed, 401 unauthenticated, 403 wrong scope, 404 unknown, 409 not
allowed in this state, 413 too large, 422 unknown protocol version or invalid message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sentinel.config import CoordinatorConfig
from sentinel.coordinator import fr_files, queries, stacks
from sentinel.coordinator.auth import Principal
from sentinel.coordinator.metrics import Metrics
from sentinel.coordinator.openapi import openapi_document
from sentinel.coordinator.service import Refused, Service
from sentinel.coordinator.store import MAX_ID, StoreUnavailable
from sentinel.protocol import EventBatch, ProtocolError, format_validation_error

SERVICE = web.AppKey("service", Service)
PRINCIPAL = web.RequestKey("principal", Principal)
METRICS = web.AppKey("metrics", Metrics)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _principal(request: web.Request) -> Principal:
    return request[PRINCIPAL]


UNAUTHENTICATED = "missing or invalid bearer token"
CHALLENGE = 'Bearer realm="sentinel"'


async def authenticate(service: Service, header: str | None) -> Principal | None:
    """The principal a bearer token names; None when it names none. Cached tokens cost no trip
    to the store thread."""
    principal = service.tokens.cached(header)
    if principal is None:
        principal = await service.db(service.tokens.authenticate, header)
    return principal


def too_large(limit: int, detail: str) -> str:
    return f"request body over the {limit} byte limit ({detail})"


def _authenticated(handler: Handler) -> Handler:
    """Every route but `/healthz` is wrapped in this: the bearer token names the principal.

    A wrapper per route rather than an aiohttp middleware: a middleware also costs every
    request aiohttp's per-request middleware plumbing, and at fleet scale that adds up.
    """

    async def check(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE]
        try:
            principal = await authenticate(service, request.headers.get("Authorization"))
            if principal is None:
                return web.json_response(
                    {"error": UNAUTHENTICATED}, status=401, headers={"WWW-Authenticate": CHALLENGE}
                )
            request[PRINCIPAL] = principal
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as e:
            return _error(413, too_large(service.cfg.max_body_bytes, e.text or "too large"))
        except StoreUnavailable as e:
            return web.json_response(
                {"error": unavailable(e)}, status=503, headers={"Retry-After": RETRY_AFTER_S}
            )

    return check


def _reader(request: web.Request) -> Principal:
    principal = _principal(request)
    if not principal.can_read:
        raise web.HTTPForbidden(
            text=json.dumps({"error": f"role {principal.role} may not read fleet state"}),
            content_type="application/json",
        )
    return principal


# --- ingest ----------------------------------------------------------------------------------


async def answer_batch(
    service: Service, metrics: Metrics, principal: Principal, body: bytes
) -> tuple[int, bytes]:
    """(status, JSON body) for a batch posted by `principal`: what `POST /v1/events` answers,
    through aiohttp or the ingest fast path (`sentinel.coordinator.front`) alike."""
    t0 = time.perf_counter()
    try:
        result = await service.ingest(body, principal.may_report_all)
    except ProtocolError as e:
        msg = str(e)
        status = 400 if msg.startswith(("not valid JSON", "expected a JSON object")) else 422
        metrics.rejected.labels(code=str(status)).inc()
        return status, error_body(msg)
    except Refused as e:
        metrics.rejected.labels(code="403").inc()
        return 403, error_body(str(e))
    except StoreUnavailable as e:  # nothing of the batch was committed: the sender retries
        metrics.rejected.labels(code="503").inc()
        return 503, error_body(unavailable(e))
    metrics.observe_batch(result, time.perf_counter() - t0)
    opened = ",".join(map(str, result.opened))
    return 200, (
        f'{{"accepted":{result.accepted},"duplicates":{result.duplicates},'
        f'"incidents_opened":[{opened}]}}'.encode()
    )


# Seconds a client should wait before retrying while the store is away (a database restart).
RETRY_AFTER_S = "2"


def unavailable(error: StoreUnavailable) -> str:
    return f"the coordinator's store is unavailable ({error}); nothing was stored, retry"


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def post_events(request: web.Request) -> web.Response:
    body = await request.read()
    status, answer = await answer_batch(
        request.app[SERVICE], request.app[METRICS], _principal(request), body
    )
    headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else None
    return web.Response(
        body=answer, status=status, content_type="application/json", headers=headers
    )


# --- commands (long-poll) --------------------------------------------------------------------


async def get_commands(request: web.Request) -> web.Response:
    service, principal = request.app[SERVICE], _principal(request)
    q = request.query
    if ("node" in q) == ("job" in q):
        return _error(400, "name exactly one of ?node=NAME or ?job=ID")
    kind = "node" if "node" in q else "job"
    target = q[kind]
    if not principal.may_target(kind, target):
        return _error(403, f"{principal} may not fetch commands for {kind} {target!r}")
    try:
        wait = min(float(q.get("wait", "0")), service.cfg.long_poll_max_s)
    except ValueError:
        return _error(400, f"wait must be a number of seconds, got {q.get('wait')!r}")
    deadline = asyncio.get_running_loop().time() + max(wait, 0.0)
    while True:
        commands = await service.db(queries.take_commands, service.store, kind, target, time.time())
        left = deadline - asyncio.get_running_loop().time()
        if commands or left <= 0:
            return web.json_response({"commands": commands})
        async with service.commands_changed:
            with contextlib.suppress(TimeoutError):  # asyncio.timeout keeps a cancel (see Service)
                async with asyncio.timeout(left):
                    await service.commands_changed.wait()


class AckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool = True
    detail: dict[str, Any] = Field(default_factory=dict)


async def _json_body(request: web.Request, model: type[BaseModel]) -> BaseModel:
    try:
        body = await request.read()
        raw = json.loads(body) if body else {}
    except ValueError as e:  # not JSON, or not UTF-8 at all
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"not valid JSON: {e}"}), content_type="application/json"
        ) from None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise web.HTTPUnprocessableEntity(
            text=json.dumps({"error": format_validation_error(e)}), content_type="application/json"
        ) from None


async def ack_command(request: web.Request) -> web.Response:
    service, principal = request.app[SERVICE], _principal(request)
    body = await _json_body(request, AckBody)
    assert isinstance(body, AckBody)
    cid = request.match_info["id"]
    cmd = await service.db(queries.command, service.store, cid)
    if cmd is None:
        return _error(404, f"no command {cid!r}")
    if not principal.may_target(cmd.target_kind, cmd.target):
        return _error(403, f"{principal} may not acknowledge command {cid!r}")
    await service.db(
        queries.ack_command, service.store, cid, body.ok, body.detail, str(principal), time.time()
    )
    service.kick()
    return web.json_response({"acked": cid})


# --- reads -----------------------------------------------------------------------------------


def _list_route(fn: Callable[..., Any]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        _reader(request)
        service = request.app[SERVICE]
        try:
            rows = await service.db(fn, service.store, dict(request.query))
        except ValueError as e:
            return _error(400, str(e))
        return web.json_response(rows)

    return handler


async def get_incident(request: web.Request) -> web.Response:
    _reader(request)
    service = request.app[SERVICE]
    doc = await service.db(queries.incident, service.store, _int_id(request))
    return web.json_response(doc) if doc else _error(404, "no such incident")


def _int_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise web.HTTPNotFound(
            text='{"error": "no such incident"}', content_type="application/json"
        ) from None


# --- operator --------------------------------------------------------------------------------


class RunActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    incident: int
    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    why: str = "run by hand"


def _operator_route(verb: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        principal = _reader(request)
        service = request.app[SERVICE]
        try:
            doc = await service.db(
                getattr(queries, verb), service, _int_id(request), str(principal), time.time()
            )
        except LookupError as e:
            return _error(404, str(e))
        except ValueError as e:
            return _error(409, str(e))
        service.kick()
        return web.json_response(doc)

    return handler


async def run_action(request: web.Request) -> web.Response:
    principal = _reader(request)
    service = request.app[SERVICE]
    body = await _json_body(request, RunActionBody)
    assert isinstance(body, RunActionBody)
    try:
        doc = await service.db(
            queries.run_action,
            service,
            body.incident,
            body.action,
            body.params,
            body.why,
            str(principal),
            time.time(),
        )
    except LookupError as e:
        return _error(404, str(e))
    except ValueError as e:
        return _error(422, str(e))
    await service.notify_commands()
    return web.json_response(doc)


def _fr_route(fn: Callable[..., Awaitable[web.Response]]) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return await fn(request, _principal(request), request.app[SERVICE])

    return handler


async def no_route(request: web.Request) -> web.Response:
    """What no route serves, for an authenticated caller (an anonymous one got 401 first, so a
    probe learns nothing about which routes exist): 405 where another method would do, else 404."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not request.match_info.route.resource:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        return web.json_response(
            {"error": f"{request.method} is not allowed on {request.path}"},
            status=405,
            headers={"Allow": ", ".join(sorted(allowed))},
        )
    return _error(404, f"no such route: {request.path}")


async def healthz(request: web.Request) -> web.Response:
    """Liveness, and this replica's part: the leader runs the engine, followers serve."""
    leadership = request.app[SERVICE].leadership
    epoch = leadership.epoch
    role = "leader" if epoch is not None else "follower"
    return web.json_response({"status": "ok", "role": role, "epoch": epoch})


async def metrics_handler(request: web.Request) -> web.Response:
    service, metrics = request.app[SERVICE], request.app[METRICS]
    body = await service.db(metrics.render, service)
    return web.Response(body=body, headers={"Content-Type": metrics.content_type})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(ROUTES))


# --- assembly --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """A path or query parameter, as the OpenAPI description declares it."""

    name: str
    where: Literal["path", "query"]
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


_INCIDENT_ID = Param(
    "id", "path", {"type": "integer", "minimum": 1, "maximum": MAX_ID}, "incident id", True
)
_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1}, "rows at most (10,000)")


@dataclass(frozen=True)
class Route:
    """One route: what the app serves and what the OpenAPI description says, from one entry."""

    method: str
    path: str
    handler: Handler
    summary: str
    roles: str
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    responses: tuple[int, ...] = (200, 400, 401, 403)
    public: bool = False  # served without a token (liveness only)
    raw_body: str | None = None  # a body of bytes, not JSON: what it holds


def _listing(path: str, query: Callable[..., Any], summary: str, *params: Param) -> Route:
    """A list an operator reads: the same handler, roles and row limit for every one."""
    return Route("get", path, _list_route(query), summary, "operator, admin", (_LIMIT, *params))


_FR_NAME = {"type": "string", "pattern": fr_files.NAME_PATTERN}


def _name_in_path(name: str, description: str) -> Param:
    """A required path segment that names a file, a check, a node or a job (no slashes)."""
    return Param(name, "path", _FR_NAME, description, True)


_CHECK = _name_in_path("check", "the fr.dump command's check id")
_JOB = _name_in_path("job", "the job id")

ROUTES: tuple[Route, ...] = (
    Route(
        "post",
        "/v1/events",
        post_events,
        "Ingest an event batch (idempotent by event id); ack = durable",
        "node, job (own scope), admin",
        body=EventBatch,
        responses=(200, 400, 401, 403, 413, 422),
    ),
    Route(
        "get",
        "/v1/commands",
        get_commands,
        "Long-poll commands: ?node=NAME or ?job=ID, ?wait=SECONDS",
        "node, job (own scope), operator, admin",
        params=(
            Param("node", "query", {"type": "string"}, "a node's commands"),
            Param("job", "query", {"type": "string"}, "a job's commands"),
            Param("wait", "query", {"type": "number", "minimum": 0}, "seconds to wait"),
        ),
    ),
    Route(
        "post",
        "/v1/commands/{id}/ack",
        ack_command,
        "Acknowledge a command with its result",
        "target, admin",
        params=(Param("id", "path", {"type": "string"}, "command id", True),),
        body=AckBody,
        responses=(200, 400, 401, 403, 404, 422),
    ),
    _listing("/v1/nodes", queries.nodes, "Known nodes and their state"),
    _listing("/v1/jobs", queries.jobs, "Jobs, their generation and last supervisor heartbeat"),
    _listing(
        "/v1/incidents",
        queries.incidents,
        "Incidents (?state=open|acting|...)",
        Param("state", "query", {"type": "string"}, "only incidents in this state"),
    ),
    Route(
        "get",
        "/v1/incidents/{id}",
        get_incident,
        "One incident with its events, runs, actions, audit",
        "operator, admin",
        (_INCIDENT_ID,),
        responses=(200, 401, 403, 404),
    ),
    *(
        Route(
            "post",
            f"/v1/incidents/{{id}}/{verb}",
            _operator_route(verb),
            summary,
            "operator, admin",
            (_INCIDENT_ID,),
            responses=(200, 401, 403, 404, 409),
        )
        for verb, summary in (
            ("acknowledge", "Acknowledge an incident"),
            ("approve", "Approve a run awaiting approval or escalated"),
            ("resolve", "Resolve an incident; cancels its runs"),
        )
    ),
    _listing("/v1/actions", queries.actions, "Every action run (playbook steps and manual)"),
    Route(
        "post",
        "/v1/actions",
        run_action,
        "Run an action by hand on an incident",
        "operator, admin",
        body=RunActionBody,
        responses=(200, 400, 401, 403, 404, 422),
    ),
    _listing("/v1/audit", queries.audit, "Audit log: who did what, why"),
    Route(
        "put",
        "/v1/fr/{check}/{node}/{name}",
        _fr_route(fr_files.put_dump),
        "Upload one flight-recorder dump file of an fr.dump check",
        "node (own node), admin",
        (
            _CHECK,
            _name_in_path("node", "the node whose ranks wrote the dump"),
            _name_in_path("name", "the dump file's name"),
        ),
        raw_body="the dump file's bytes",
    ),
    Route(
        "get",
        "/v1/fr/{check}",
        _fr_route(fr_files.get_dumps),
        "Every dump file of a check (base64)",
        "job, operator, admin",
        (_CHECK,),
    ),
    Route(
        "post",
        "/v1/jobs/{job}/stacks",
        _fr_route(stacks.post_request),
        "Ask every rank of a job for its Python stacks (all threads), through the agents",
        "operator, admin",
        (_JOB,),
        responses=(200, 400, 401, 403, 404),
    ),
    Route(
        "get",
        "/v1/jobs/{job}/stacks/{request}",
        _fr_route(stacks.get_answers),
        "The ranks' stacks of one request, grouped (odd ones out first) and who is silent",
        "operator, admin",
        (
            _JOB,
            _name_in_path("request", "the request id the POST answered"),
        ),
        responses=(200, 400, 401, 403, 404),
    ),
    Route("get", "/v1/openapi.json", openapi, "This description", "any token"),
    Route("get", "/metrics", metrics_handler, "Prometheus metrics", "any token"),
    Route("get", "/healthz", healthz, "Liveness", "none", responses=(200,), public=True),
)


def build_app(cfg: CoordinatorConfig, service: Service | None = None) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes)

    async def on_startup(app: web.Application) -> None:
        svc = service or Service(cfg)
        app[SERVICE] = svc
        app[METRICS] = Metrics()
        svc.on_ingest = app[METRICS].count_ingest
        svc.pruner.on_prune = app[METRICS].pruned.inc
        await svc.start()

    async def on_cleanup(app: web.Application) -> None:
        app[METRICS].close()
        await app[SERVICE].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    for route in ROUTES:
        handler = route.handler if route.public else _authenticated(route.handler)
        app.router.add_route(route.method.upper(), route.path, handler)
    # last: only what nothing else serves
    app.router.add_route("*", "/{tail:.*}", _authenticated(no_route))
    return app
