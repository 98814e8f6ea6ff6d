"""The coordinator's HTTP API (aiohttp): the router admits each request by its route's roles,
parses its query with the route's model, and hands it to the handler, which translates and
delegates to the core through the runtime.

Every route but `/healthz` needs a bearer token. Errors are JSON `{"error": "..."}` with the
precise reason: 400 malformed, 401 unauthenticated, 403 wrong role or scope, 404 unknown, 405
wrong method, 409 not allowed in this state, 413 too large, 422 unknown protocol version or
invalid message, 503 the store is away (with Retry-After).
"""

from __future__ import annotations

from aiohttp import web
from pydantic import ValidationError

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core.store import StoreUnavailable
from sentinel.coordinator.http.common import (
    ALL_ROLES,
    METRICS,
    PRINCIPAL,
    QUERY,
    ROUTE_TABLE,
    SERVICE,
    Refusal,
    admit,
    too_large,
    unavailable,
)
from sentinel.coordinator.http.meta import no_route
from sentinel.coordinator.http.metrics import Metrics
from sentinel.coordinator.http.openapi import Handler, Route
from sentinel.coordinator.http.routes import ROUTES
from sentinel.coordinator.runtime import Service
from sentinel.protocol import format_validation_error


def guarded(route: Route) -> Handler:
    """The route's handler behind its door: the bearer token names a principal whose role the
    route lets in, and the query parses as the route's model.

    A wrapper per route rather than an aiohttp middleware: a middleware also costs every
    request aiohttp's per-request middleware plumbing, and at fleet scale that adds up.
    """

    async def handle(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE]
        try:
            request[PRINCIPAL] = await admit(service, route, request.headers.get("Authorization"))
            if route.query is not None:
                try:
                    request[QUERY] = route.query.model_validate(dict(request.query))
                except ValidationError as e:
                    raise Refusal(400, format_validation_error(e)) from None
            return await route.handler(request)
        except Refusal as e:
            return e.response()
        except web.HTTPRequestEntityTooLarge as e:
            return too_large(service.cfg.max_body_bytes, e.text or "too large").response()
        except StoreUnavailable as e:
            return unavailable(e).response()

    return handle


def build_app(cfg: CoordinatorConfig, service: Service | None = None) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes)
    app[ROUTE_TABLE] = ROUTES

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
        handler = route.handler if route.public else guarded(route)
        app.router.add_route(route.method.upper(), route.path, handler)
    # last: only what nothing else serves, and only to a caller with a token
    anything = Route("*", "/{tail:.*}", no_route, "", ALL_ROLES)
    app.router.add_route("*", "/{tail:.*}", guarded(anything))
    return app
