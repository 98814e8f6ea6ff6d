"""The evidence nodes and ranks carry to the coordinator: flight-recorder dump files
(`core/fr_dumps.py`), every rank's stacks (`core/stacks.py`), and an incident's sealed bundle
(`core/bundle.py`)."""

from __future__ import annotations

import base64

from aiohttp import web

from sentinel.coordinator.core import fr_dumps, stacks
from sentinel.coordinator.http.common import Refusal, path_name, principal, service
from sentinel.coordinator.http.reads import incident_id


async def put_dump(request: web.Request) -> web.Response:
    check = path_name(request, "check", "check id")
    node = path_name(request, "node", "node")
    name = path_name(request, "name", "file name")
    svc, data = service(request), await request.read()
    try:
        await svc.db(
            fr_dumps.upload, svc.store, principal(request), check, node, name, data, svc.clock()
        )
    except fr_dumps.Refused as e:
        raise Refusal(403, str(e)) from None
    return web.json_response({"stored": f"{check}/{node}/{name}", "bytes": len(data)})


async def get_dumps(request: web.Request) -> web.Response:
    check, svc = path_name(request, "check", "check id"), service(request)
    try:
        found = await svc.db(fr_dumps.dumps, svc.store, principal(request), check)
    except fr_dumps.Refused as e:
        raise Refusal(403, str(e)) from None
    files = [
        {"node": node, "name": name, "data": base64.b64encode(data).decode()}
        for node, name, data in found
    ]
    return web.json_response({"check": check, "files": files})


async def ask_stacks(request: web.Request) -> web.Response:
    job, svc = path_name(request, "job", "job id"), service(request)
    try:
        doc = await svc.db(stacks.request, svc.store, job, str(principal(request)), svc.clock())
    except LookupError as e:
        raise Refusal(404, str(e)) from None
    await svc.notify_commands()
    return web.json_response(doc)


async def get_stacks(request: web.Request) -> web.Response:
    job, svc = path_name(request, "job", "job id"), service(request)
    rid = path_name(request, "request", "request id")
    try:
        grouped = await svc.db(stacks.answers, svc.store, job, rid)
    except LookupError as e:
        raise Refusal(404, str(e)) from None
    return web.json_response({"job": job, "request": rid, **grouped.as_json()})


async def get_bundle(request: web.Request) -> web.Response:
    number, svc = incident_id(request), service(request)
    found = await svc.db(svc.store.bundle, number)
    if found is None:
        known = await svc.db(svc.store.incident, number)
        if known is None:
            raise Refusal(404, "no such incident")
        raise Refusal(
            404,
            f"incident {number} has no evidence bundle: none of its repairs captured evidence,"
            " or its bundle is still being gathered (sealed within a minute of the capture)",
        )
    name = f"incident-{number}-{found.sha256[:12]}.tar.gz"
    headers = {
        "X-Sentinel-Bundle-Sha256": found.sha256,
        "Content-Disposition": f'attachment; filename="{name}"',
    }
    return web.Response(body=found.data, content_type="application/gzip", headers=headers)
