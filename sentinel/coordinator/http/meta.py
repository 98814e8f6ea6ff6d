"""The API about itself: liveness and this replica's part, Prometheus metrics, the OpenAPI
description, and what answers a path no route serves."""

from __future__ import annotations

from aiohttp import web

from sentinel.coordinator.http.common import METRICS, ROUTE_TABLE, error, service
from sentinel.coordinator.http.openapi import openapi_document


async def healthz(request: web.Request) -> web.Response:
    """Liveness, and this replica's part: the leader runs the engine, followers serve."""
    epoch = service(request).leadership.epoch
    role = "leader" if epoch is not None else "follower"
    return web.json_response({"status": "ok", "role": role, "epoch": epoch})


async def metrics(request: web.Request) -> web.Response:
    svc, found = service(request), request.app[METRICS]
    body = await svc.db(found.render, svc)
    return web.Response(body=body, headers={"Content-Type": found.content_type})


async def openapi(request: web.Request) -> web.Response:
    routes = request.app[ROUTE_TABLE]
    return web.json_response(openapi_document(routes))


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
    return error(404, f"no such route: {request.path}")
