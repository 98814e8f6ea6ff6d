"""Relay the coordinator's rank commands (dump the flight recorder, run an SDC check, checkpoint
now) to the training ranks connected to this node's socket, and carry out the node's own
(`node.validate`: the validation burn-in, `uplink/validation.py`; `node.evidence`: the node's
part of an incident's evidence bundle, `uplink/evidence.py`).

Long-polls `GET /v1/commands?node=ID` with the node's token; a command is acknowledged only
after it was written to the ranks, so one lost with the agent is delivered again (at least once;
the actions are safe to repeat). Polls and acknowledgements fail over between the coordinator
replicas the agent knows (sentinel/failover.py): any replica delivers any node's commands.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from sentinel.agent.ranks.listener import RankSocketServer
from sentinel.agent.uplink.delivery import Backoff
from sentinel.agent.uplink.evidence import EvidenceGatherer, check_id_problem
from sentinel.agent.uplink.fr_carry import FrCarrier
from sentinel.agent.uplink.validation import NodeValidator
from sentinel.failover import CONNECT_TIMEOUT_S, Coordinators, Refused, Unreachable, request
from sentinel.protocol import Command, CommandKind, ProtocolError, decode_command, encode

log = logging.getLogger("sentinel.agent.uplink.commands")


class CommandRelay:
    def __init__(
        self,
        coordinators: Coordinators,
        token: str | None,
        node_id: str,
        ranks: RankSocketServer | None,
        wait_s: float = 20,
        fr: FrCarrier | None = None,
        validator: NodeValidator | None = None,
        evidence: EvidenceGatherer | None = None,
    ) -> None:
        self.validator = validator
        self.fr = fr  # carries the ranks' flight-recorder dumps after an fr.dump
        self.evidence = evidence  # gathers and uploads the node's evidence on node.evidence
        # Uploads under way (dumps, evidence): held here so a task is not collected mid-way,
        # and run beside the poll loop, which goes on taking commands meanwhile.
        self._carrying: set[asyncio.Task[int]] = set()
        self.coordinators = coordinators  # shared with the agent's other clients
        self.token = token
        self.node_id = node_id
        self.ranks = ranks
        self.wait_s = wait_s
        self.relayed = 0
        self._backoff = Backoff()

    async def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = aiohttp.ClientTimeout(total=self.wait_s + 10, sock_connect=CONNECT_TIMEOUT_S)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            while True:
                try:
                    await self.poll_once(session)
                    self._backoff.reset()
                except (Unreachable, Refused, ValueError) as e:
                    log.warning("command poll failed", extra={"error": str(e)})
                    rest = e.retry_in_s if isinstance(e, Unreachable) else 0.0
                    await asyncio.sleep(max(self._backoff.next_delay(), rest))

    async def poll_once(self, session: aiohttp.ClientSession) -> int:
        params = {"node": self.node_id, "wait": str(self.wait_s)}
        reply = await request(session, self.coordinators, "GET", "/v1/commands", params=params)
        if not reply.ok:
            raise Refused("command poll", reply)
        body = reply.json()
        handled = 0
        for raw in body.get("commands", []):
            try:
                cmd = decode_command(raw)
            except ProtocolError as e:
                log.error("coordinator sent a malformed command", extra={"reason": str(e)})
                continue
            since = time.time() - 1.0  # mtime granularity: a dump this second still counts
            if cmd.kind == CommandKind.NODE_VALIDATE:  # the node's own: not for its ranks
                await self._ack(session, cmd, self._validate(cmd))
                handled += 1
                continue
            if cmd.kind == CommandKind.NODE_EVIDENCE:  # the node's own too
                await self._ack(session, cmd, self._gather(session, cmd))
                handled += 1
                continue
            reached = self.ranks.broadcast(encode(cmd)) if self.ranks is not None else 0
            native = 0
            if cmd.kind == CommandKind.FR_DUMP and self.ranks is not None:
                # and without the GIL: a rank wedged holding it never reads the line above
                native = self.ranks.ask_native_dumps()
            check_id = cmd.args.get("check_id")
            if cmd.kind == CommandKind.FR_DUMP and self.fr is not None and reached and check_id:
                task = asyncio.create_task(
                    self.fr.carry(session, self.coordinators, str(check_id), since, reached)
                )
                self._carrying.add(task)
                task.add_done_callback(self._carrying.discard)
            log.info(
                "relayed %s to %d rank(s)",
                cmd.kind.value,
                reached,
                extra={"id": cmd.id, "native_dumps_asked": native},
            )
            await self._ack(session, cmd, {"relayed_to_ranks": reached})
            self.relayed += 1
            handled += 1
        return handled

    def _validate(self, cmd: Command) -> dict[str, object]:
        if self.validator is None:
            return {"error": "this agent runs no validations"}
        return {"validation_started": self.validator.start(cmd)}

    def _gather(self, session: aiohttp.ClientSession, cmd: Command) -> dict[str, object]:
        """Start gathering and uploading the node's evidence; acknowledged at once, so the
        repair waiting on the ranks' part is not held by the node's (its outcome is logged,
        and the bundle tells whether the file came)."""
        if self.evidence is None:
            return {"error": "this agent gathers no evidence"}
        check_id = cmd.args.get("check_id")
        problem = check_id_problem(check_id)
        if problem is not None:
            log.error("refused %s: %s", cmd.kind.value, problem, extra={"id": cmd.id})
            return {"error": problem}
        task = asyncio.create_task(
            self.evidence.upload(session, self.coordinators, str(check_id)),
            name=f"evidence {check_id}",
        )
        self._carrying.add(task)
        task.add_done_callback(self._carrying.discard)
        return {"evidence": "gathering"}

    async def _ack(
        self, session: aiohttp.ClientSession, cmd: Command, detail: dict[str, object]
    ) -> None:
        ack = {"ok": True, "detail": detail}
        path = f"/v1/commands/{cmd.id}/ack"
        reply = await request(session, self.coordinators, "POST", path, json=ack)
        if not reply.ok:  # not acknowledged: delivered again, relayed again (safe)
            raise Refused(f"ack of {cmd.id}", reply)
