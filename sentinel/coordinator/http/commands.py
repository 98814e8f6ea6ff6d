"""Commands for nodes and jobs: the long-poll that delivers them and the acknowledgement that
settles them (a target sees only its own, an operator any)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sentinel.coordinator.core import operator
from sentinel.coordinator.http.common import Refusal, json_body, principal, query, service
from sentinel.protocol import Identifier


class CommandPoll(BaseModel):
    """`?node=NAME` or `?job=ID` (exactly one), and `?wait=SECONDS` to hold the answer until a
    command comes (at most the coordinator's `long_poll_max_s`)."""

    model_config = ConfigDict(extra="forbid")
    node: Identifier | None = None
    job: Identifier | None = None
    wait: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_target(self) -> CommandPoll:
        if (self.node is None) == (self.job is None):
            raise ValueError("name exactly one of ?node=NAME or ?job=ID")
        return self


class AckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool = True
    detail: dict[str, Any] = Field(default_factory=dict)


async def get_commands(request: web.Request) -> web.Response:
    svc, who, q = service(request), principal(request), query(request, CommandPoll)
    kind, target = ("node", q.node) if q.node is not None else ("job", q.job)
    assert target is not None
    if not who.may_target(kind, target):
        raise Refusal(403, f"{who} may not fetch commands for {kind} {target!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(q.wait, svc.cfg.long_poll_max_s)
    while True:
        commands = await svc.db(operator.take_commands, svc.store, kind, target, svc.clock())
        left = deadline - loop.time()
        if commands or left <= 0:
            return web.json_response({"commands": commands})
        async with svc.commands_changed:
            with contextlib.suppress(TimeoutError):  # asyncio.timeout keeps a cancel (see runtime)
                async with asyncio.timeout(left):
                    await svc.commands_changed.wait()


async def ack_command(request: web.Request) -> web.Response:
    svc, who = service(request), principal(request)
    body = await json_body(request, AckBody)
    cid = request.match_info["id"]
    cmd = await svc.db(svc.store.command, cid)
    if cmd is None:
        raise Refusal(404, f"no command {cid!r}")
    if not who.may_target(cmd.target_kind, cmd.target):
        raise Refusal(403, f"{who} may not acknowledge command {cid!r}")
    await svc.db(operator.ack_command, svc.store, cid, body.ok, body.detail, str(who), svc.clock())
    svc.kick()
    return web.json_response({"acked": cid})
