"""Flight-recorder dumps carried from the nodes, kept for the job that asked for them.

`PUT /v1/fr/{check}/{node}/{name}`: a node's agent uploads one dump file of the `fr.dump` whose
check id is `check`; a node token may upload only as its own node. `GET /v1/fr/{check}`: the
job's supervisor (or an operator) reads every file of that check, base64 in JSON, and runs the
analysis on them. Files live in the store (`fr_dumps`), so every coordinator sharing it serves
every upload; they go with the events' retention.
"""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING

from aiohttp import web

from sentinel.coordinator.auth import Principal, Role

if TYPE_CHECKING:
    from sentinel.coordinator.service import Service

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$"  # a check id, node or file name
_NAME = re.compile(NAME_PATTERN)


def check_name(part: str, what: str) -> str:
    if not _NAME.fullmatch(part) or ".." in part:
        raise web.HTTPBadRequest(text=f'{{"error": "bad {what} {part[:40]!r}"}}',
                                 content_type="application/json")  # fmt: skip
    return part


def _forbidden(message: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=f'{{"error": "{message}"}}', content_type="application/json")


async def put_dump(request: web.Request, principal: Principal, service: Service) -> web.Response:
    check = check_name(request.match_info["check"], "check id")
    node = check_name(request.match_info["node"], "node")
    name = check_name(request.match_info["name"], "file name")
    if principal.role != Role.ADMIN and not (
        principal.role == Role.NODE and principal.node == node
    ):
        raise _forbidden(f"{principal} may not upload dumps for node {node}")
    data = await request.read()
    await service.db(service.store.put_fr_dump, check, node, name, data, service.clock())
    return web.json_response({"stored": f"{check}/{node}/{name}", "bytes": len(data)})


async def get_dumps(request: web.Request, principal: Principal, service: Service) -> web.Response:
    check = check_name(request.match_info["check"], "check id")
    if principal.role == Role.NODE:
        raise _forbidden("a node token may not read other nodes' dumps")
    files = [
        {"node": node, "name": name, "data": base64.b64encode(data).decode()}
        for node, name, data in await service.db(service.store.fr_dumps, check)
    ]
    return web.json_response({"check": check, "files": files})
