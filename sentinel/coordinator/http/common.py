"""What every door of the API shares: who is asking (bearer token), whether the route lets that
role in, and how an error reads. The API's aiohttp routes and the ingest listener both admit a
request through `admit`, against the same route table entry."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from sentinel.coordinator.core.auth import Principal, Role
from sentinel.coordinator.core.fr_dumps import BadName, check_name
from sentinel.coordinator.http.metrics import Metrics
from sentinel.coordinator.runtime import Service
from sentinel.protocol import format_validation_error

if TYPE_CHECKING:
    from sentinel.coordinator.http.openapi import Route

SERVICE = web.AppKey("service", Service)
METRICS = web.AppKey("metrics", Metrics)
PRINCIPAL = web.RequestKey("principal", Principal)
QUERY = web.RequestKey("query", BaseModel)
ROUTE_TABLE: web.AppKey[tuple[Route, ...]] = web.AppKey("routes")  # what OpenAPI describes
UNAUTHENTICATED = "missing or invalid bearer token"
CHALLENGE = 'Bearer realm="sentinel"'
RETRY_AFTER_S = "2"  # seconds a client waits before retrying while the store is away
M = TypeVar("M", bound=BaseModel)


class Refusal(Exception):
    """A request answered with an error before (or instead of) its handler's work."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def body(self) -> bytes:
        return error_body(self.message)

    def response(self) -> web.Response:
        return web.Response(
            body=self.body(),
            status=self.status,
            content_type="application/json",
            headers=self.headers,
        )


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def error(status: int, message: str) -> web.Response:
    return Refusal(status, message).response()


def unavailable(e: Exception) -> Refusal:
    return Refusal(
        503,
        f"the coordinator's store is unavailable ({e}); nothing was stored, retry",
        {"Retry-After": RETRY_AFTER_S},
    )


def too_large(limit: int, detail: str) -> Refusal:
    return Refusal(413, f"request body over the {limit} byte limit ({detail})")


async def admit(service: Service, route: Route, header: str | None) -> Principal:
    """The principal the bearer token names, if the route lets its role in; `Refusal` (401,
    403) otherwise. Cached tokens cost no trip to the store thread."""
    principal = service.tokens.cached(header)
    if principal is None:
        principal = await service.db(service.tokens.authenticate, header)
    if principal is None:
        raise Refusal(401, UNAUTHENTICATED, {"WWW-Authenticate": CHALLENGE})
    if principal.role not in route.roles:
        allowed = ", ".join(sorted(route.roles))
        raise Refusal(
            403,
            f"role {principal.role} may not {route.method.upper()} {route.path} ({allowed} may)",
        )
    return principal


def principal(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def service(request: web.Request) -> Service:
    return request.app[SERVICE]


def query(request: web.Request, model: type[M]) -> M:
    found = request[QUERY]
    assert isinstance(found, model)
    return found


def path_name(request: web.Request, key: str, what: str) -> str:
    """A path segment that names a check, node, job, file or request (400 otherwise)."""
    try:
        return check_name(request.match_info[key], what)
    except BadName as e:
        raise Refusal(400, str(e)) from None


def validated(model: type[M], raw: object) -> M:
    """`raw` as `model`, or a 422 with the model's own account of what is wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise Refusal(422, format_validation_error(e)) from None


async def json_body(request: web.Request, model: type[M]) -> M:
    try:
        body = await request.read()
        raw = json.loads(body) if body else {}
    except RecursionError:  # nested past what the decoder follows
        raise Refusal(400, "not valid JSON: nested too deeply") from None
    except ValueError as e:  # not JSON, or not UTF-8 at all
        raise Refusal(400, f"not valid JSON: {e}") from None
    return validated(model, raw)


ALL_ROLES = frozenset(Role)
