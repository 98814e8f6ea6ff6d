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
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sentinel.config import CoordinatorConfig
from sentinel.coordinator import fr_files, queries
from sentinel.coordinator.auth import Principal
from sentinel.coordinator.metrics import Metrics
from sentinel.coordinator.openapi import openapi_document
from sentinel.coordinator.service import Refused, Service
from sentinel.protocol import ProtocolError, format_validation_error

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
        principal = await authenticate(service, request.headers.get("Authorization"))
        if principal is None:
            return web.json_response(
                {"error": UNAUTHENTICATED}, status=401, headers={"WWW-Authenticate": CHALLENGE}
            )
        request[PRINCIPAL] = principal
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as e:
            return _error(413, too_large(service.cfg.max_body_bytes, e.text or "too large"))

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
    metrics.observe_batch(result, time.perf_counter() - t0)
    opened = ",".join(map(str, result.opened))
    return 200, (
        f'{{"accepted":{result.accepted},"duplicates":{result.duplicates},'
        f'"incidents_opened":[{opened}]}}'.encode()
    )


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def post_events(request: web.Request) -> web.Response:
    body = await request.read()
    status, answer = await answer_batch(
        request.app[SERVICE], request.app[METRICS], _principal(request), body
    )
    return web.Response(body=answer, status=status, content_type="application/json")


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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(service.commands_changed.wait(), left)


class AckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool = True
    detail: dict[str, Any] = Field(default_factory=dict)


async def _json_body(request: web.Request, model: type[BaseModel]) -> BaseModel:
    try:
        raw = await request.json() if request.can_read_body else {}
    except json.JSONDecodeError as e:
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
    cmd = await service.db(service.store.one, "SELECT * FROM commands WHERE id=?", (cid,))
    if cmd is None:
        return _error(404, f"no command {cid!r}")
    if not principal.may_target(cmd["target_kind"], cmd["target"]):
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
        return await fn(request, _principal(request), request.app[SERVICE].cfg.state_dir)

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
    return web.json_response({"status": "ok"})


async def metrics_handler(request: web.Request) -> web.Response:
    service, metrics = request.app[SERVICE], request.app[METRICS]
    body = await service.db(metrics.render, service)
    return web.Response(body=body, headers={"Content-Type": metrics.content_type})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# --- assembly --------------------------------------------------------------------------------


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
    r = app.router
    r.add_post("/v1/events", _authenticated(post_events))
    r.add_get("/v1/commands", _authenticated(get_commands))
    r.add_post("/v1/commands/{id}/ack", _authenticated(ack_command))
    r.add_get("/v1/nodes", _authenticated(_list_route(queries.nodes)))
    r.add_get("/v1/jobs", _authenticated(_list_route(queries.jobs)))
    r.add_get("/v1/incidents", _authenticated(_list_route(queries.incidents)))
    r.add_get("/v1/incidents/{id}", _authenticated(get_incident))
    r.add_post("/v1/incidents/{id}/acknowledge", _authenticated(_operator_route("acknowledge")))
    r.add_post("/v1/incidents/{id}/approve", _authenticated(_operator_route("approve")))
    r.add_post("/v1/incidents/{id}/resolve", _authenticated(_operator_route("resolve")))
    r.add_get("/v1/actions", _authenticated(_list_route(queries.actions)))
    r.add_post("/v1/actions", _authenticated(run_action))
    r.add_get("/v1/audit", _authenticated(_list_route(queries.audit)))
    r.add_put("/v1/fr/{check}/{node}/{name}", _authenticated(_fr_route(fr_files.put_dump)))
    r.add_get("/v1/fr/{check}", _authenticated(_fr_route(fr_files.get_dumps)))
    r.add_get("/v1/openapi.json", _authenticated(openapi))
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", _authenticated(metrics_handler))
    r.add_route("*", "/{tail:.*}", _authenticated(no_route))  # last: only what nothing else serves
    return app
