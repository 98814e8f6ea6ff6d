"""A route as the API serves it and describes it (`Route`), and the OpenAPI description served
at /v1/openapi.json, made from the route table (`routes.py`): every route it serves is
described, with its parameters, query and body schemas from the same pydantic models the
router and the handlers validate with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from sentinel.coordinator.core.auth import Role
from sentinel.protocol import Command

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_REASONS = {
    200: "ok",
    400: "malformed",
    401: "no or bad token",
    403: "wrong role or scope",
    404: "no such thing",
    409: "not allowed in this state",
    413: "body too large",
    422: "unknown version or invalid message",
}
_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Param:
    """A path parameter."""

    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Route:
    """One route: what the app serves and what the OpenAPI description says, from one entry."""

    method: str
    path: str
    handler: Handler
    summary: str
    roles: frozenset[Role]  # the roles let in (the router enforces them); none: no token
    scope: str = ""  # how a node or job token is held to its own (the handler checks)
    params: tuple[Param, ...] = ()
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    responses: tuple[int, ...] = (200, 400, 401, 403)
    raw_body: str | None = None  # a body of bytes, not JSON: what it holds

    @property
    def public(self) -> bool:
        """Served without a token (liveness only)."""
        return not self.roles

    def who(self) -> str:
        roles = ", ".join(sorted(self.roles)) or "none (no token)"
        return f"Roles: {roles}" + (f"; {self.scope}" if self.scope else "") + "."


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {}
    for route in routes:
        op: dict[str, Any] = {
            "summary": route.summary,
            "description": route.who(),
            "responses": {str(code): {"description": _REASONS[code]} for code in route.responses},
        }
        params = [_param(p.name, "path", True, p.schema, p.description) for p in route.params]
        params += _query_params(route.query) if route.query else []
        if params:
            op["parameters"] = params
        if route.body is not None:
            name = _add_schema(schemas, route.body)
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": _REF.format(model=name)}}},
            }
        elif route.raw_body:
            op["requestBody"] = {
                "required": True,
                "description": route.raw_body,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        if route.public:
            op["security"] = []
        paths.setdefault(route.path, {})[route.method] = op
    _add_schema(schemas, Command)
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


def _query_params(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The query model's fields, each a query parameter with its own schema."""
    schema = model.model_json_schema(ref_template=_REF)
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema["properties"].items():
        prop = _inline(prop, defs)
        out.append(_param(name, "query", name in required, prop, prop.pop("description", "")))
    return out


def _param(name: str, where: str, required: bool, schema: Any, about: str) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema, "description": about}


def _inline(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property with its `$ref`s (an enum's) replaced by what they name."""
    if "$ref" in prop:
        return dict(defs[prop["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in prop:
        return {**prop, "anyOf": [_inline(p, defs) for p in prop["anyOf"]]}
    return dict(prop)


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> str:
    schema = model.model_json_schema(ref_template=_REF)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return model.__name__
