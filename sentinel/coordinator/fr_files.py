"""Flight-recorder dumps carried from the nodes, kept for the job that asked for them.

`PUT /v1/fr/{check}/{node}/{name}`: a node's agent uploads one dump file of the `fr.dump` whose
check id is `check`; a node token may upload only as its own node. `GET /v1/fr/{check}`: the
job's supervisor (or an operator) reads every file of that check, base64 in JSON, and runs the
analysis on them. Files live under `<state_dir>/fr/<check>/<node>/<name>`, written atomically.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from aiohttp import web

from sentinel.coordinator.auth import Principal, Role

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")


def _check(part: str, what: str) -> str:
    if not _NAME.fullmatch(part) or ".." in part:
        raise web.HTTPBadRequest(text=f'{{"error": "bad {what} {part[:40]!r}"}}',
                                 content_type="application/json")  # fmt: skip
    return part


def _forbidden(message: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=f'{{"error": "{message}"}}', content_type="application/json")


def fr_root(state_dir: Path) -> Path:
    return state_dir / "fr"


async def put_dump(request: web.Request, principal: Principal, state_dir: Path) -> web.Response:
    check = _check(request.match_info["check"], "check id")
    node = _check(request.match_info["node"], "node")
    name = _check(request.match_info["name"], "file name")
    if principal.role != Role.ADMIN and not (
        principal.role == Role.NODE and principal.node == node
    ):
        raise _forbidden(f"{principal} may not upload dumps for node {node}")
    data = await request.read()
    target = fr_root(state_dir) / check / node / name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return web.json_response({"stored": f"{check}/{node}/{name}", "bytes": len(data)})


async def get_dumps(request: web.Request, principal: Principal, state_dir: Path) -> web.Response:
    check = _check(request.match_info["check"], "check id")
    if principal.role == Role.NODE:
        raise _forbidden("a node token may not read other nodes' dumps")
    base = fr_root(state_dir) / check
    files = []
    for path in sorted(base.glob("*/*")) if base.is_dir() else []:
        if path.is_file() and not path.name.startswith("."):
            files.append({"node": path.parent.name, "name": path.name,
                          "data": base64.b64encode(path.read_bytes()).decode()})  # fmt: skip
    return web.json_response({"check": check, "files": files})
