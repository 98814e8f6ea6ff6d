"""An operator's hand on incidents (acknowledge, approve, resolve, or run one action by hand)
and on playbooks (shadow or acting)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from sentinel.coordinator.core import operator
from sentinel.coordinator.core.playbooks import PlaybookMode
from sentinel.coordinator.http.common import Refusal, json_body, principal, service
from sentinel.coordinator.http.reads import incident_id


class RunActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    incident: int
    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    why: str = "run by hand"


def verb(act: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """`POST /v1/incidents/{id}/<verb>`: 404 for no such incident, 409 where its state forbids."""

    async def handler(request: web.Request) -> web.Response:
        svc = service(request)
        args = (svc.store, incident_id(request), str(principal(request)), svc.clock())
        try:
            doc = await svc.db(act, *args)
        except LookupError as e:
            raise Refusal(404, str(e)) from None
        except ValueError as e:
            raise Refusal(409, str(e)) from None
        svc.kick()
        return web.json_response(doc)

    return handler


async def run_action(request: web.Request) -> web.Response:
    svc = service(request)
    body = await json_body(request, RunActionBody)
    asked = (body.incident, body.action, body.params, body.why, str(principal(request)))
    try:
        doc = await svc.db(operator.run_action, svc.store, svc.cfg.dry_run, *asked, svc.clock())
    except LookupError as e:
        raise Refusal(404, str(e)) from None
    except ValueError as e:
        raise Refusal(422, str(e)) from None
    svc.kick()
    await svc.notify_commands()
    return web.json_response(doc)


class ModeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: PlaybookMode


async def get_playbooks(request: web.Request) -> web.Response:
    svc = service(request)
    doc = await svc.db(operator.playbook_modes, svc.store, svc.playbooks, svc.cfg)
    return web.json_response({"playbooks": doc})


async def set_playbook_mode(request: web.Request) -> web.Response:
    """404 for a playbook the coordinator does not run."""
    svc = service(request)
    body = await json_body(request, ModeBody)
    name = request.match_info["name"]
    asked = (svc.store, svc.playbooks, svc.cfg, name, body.mode, str(principal(request)))
    try:
        doc = await svc.db(operator.set_playbook_mode, *asked, svc.clock())
    except LookupError as e:
        raise Refusal(404, str(e)) from None
    return web.json_response(doc)
