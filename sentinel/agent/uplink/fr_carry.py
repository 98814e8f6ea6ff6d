"""Carry this node's flight-recorder dumps to the coordinator after an `fr.dump` command.

Ranks dump into a node-local directory (`agent.fr_dir`); nothing is shared between nodes. Once
the ranks this agent relayed the command to have written (no new file for `settle_s`, or
`wait_s` at most), each file newer than the command goes to
`PUT /v1/fr/{check_id}/{node}/{name}`, where the job's supervisor collects them for analysis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp

from sentinel.failover import Coordinators, Unreachable, request

log = logging.getLogger("sentinel.agent.fr")


class FrCarrier:
    def __init__(
        self, fr_dir: Path, node: str, wait_s: float = 30.0, settle_s: float = 1.5
    ) -> None:
        self.fr_dir, self.node = fr_dir, node
        self.wait_s, self.settle_s = wait_s, settle_s

    def fresh(self, since: float) -> list[Path]:
        """Dumps written since `since` (hidden names are a writer's temporary files)."""
        if not self.fr_dir.is_dir():
            return []
        return sorted(
            p
            for p in self.fr_dir.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.stat().st_mtime >= since
        )

    async def settle(self, since: float, ranks: int) -> list[Path]:
        """Wait until every relayed rank dumped (a dump and its sidecar each) and nothing new
        came for `settle_s`, or until `wait_s`."""
        deadline, last = time.monotonic() + self.wait_s, (-1, time.monotonic())
        while time.monotonic() < deadline:
            files = self.fresh(since)
            if len(files) != last[0]:
                last = (len(files), time.monotonic())
            elif files and len(files) >= ranks and time.monotonic() - last[1] >= self.settle_s:
                return files
            await asyncio.sleep(0.25)
        return self.fresh(since)

    async def carry(
        self,
        session: aiohttp.ClientSession,
        coordinators: Coordinators,
        check_id: str,
        since: float,
        ranks: int,
    ) -> int:
        sent = 0
        for path in await self.settle(since, ranks):
            url = f"/v1/fr/{check_id}/{self.node}/{path.name}"
            try:
                reply = await request(session, coordinators, "PUT", url, data=path.read_bytes())
            except (Unreachable, OSError) as e:
                log.error("cannot carry dump %s: %s", path.name, e)
                continue
            if reply.status != 200:
                log.error(
                    "coordinator refused dump %s: %s %s", path.name, reply.status, reply.error()
                )
                continue
            sent += 1
        log.info("carried %d flight-recorder file(s) for %s", sent, check_id)
        return sent
