"""The OpenAPI description served at /v1/openapi.json, made from the app's route table
(`app.ROUTES`): every route it serves is described, with its parameters and body schemas from
the same pydantic models the handlers validate with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sentinel.protocol import Command

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sentinel.coordinator.app import Route

_REASONS = {
    200: "ok",
    400: "malformed",
    401: "no or bad token",
    403: "wrong scope",
    404: "no such thing",
    409: "not allowed in this state",
    413: "body too large",
    422: "unknown version or invalid message",
}
_REF = "#/components/schemas/{model}"


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {}
    for route in routes:
        op: dict[str, Any] = {
            "summary": route.summary,
            "description": f"Roles: {route.roles}.",
            "responses": {str(code): {"description": _REASONS[code]} for code in route.responses},
        }
        if route.params:
            op["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "schema": p.schema,
                    "description": p.description,
                }
                for p in route.params
            ]
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


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> str:
    schema = model.model_json_schema(ref_template=_REF)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return model.__name__
