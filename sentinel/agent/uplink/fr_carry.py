"""Carry this node's flight-recorder dumps to the coordinator after an `fr.dump` command.

Ranks dump into a node-local directory (`agent.fr_dir`); nothing is shared between nodes. Each
file newer than the command is read as soon as it is whole, so a later dump under its name (a
teardown's, as the repair ends the rank) cannot replace it. Once the ranks this agent relayed
the command to have written (no new file for `settle_s`, or `wait_s` at most), the files go to
`PUT /v1/fr/{check_id}/{node}/{name}`, where the job's supervisor collects them for analysis
and the incident's evidence bundle keeps them.
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

    async def settle(self, since: float, ranks: int) -> dict[str, bytes]:
        """Each file's bytes as first seen whole (its size and time unchanged over one poll),
        until every relayed rank dumped (a dump and its sidecar each) and nothing new came for
        `settle_s`, or until `wait_s`. A later dump under a name already kept (a teardown's
        dump before exit) never replaces the one this command asked for."""
        deadline, changed = time.monotonic() + self.wait_s, time.monotonic()
        seen: dict[str, tuple[int, float]] = {}  # each file's (size, mtime) at the last poll
        kept: dict[str, bytes] = {}
        while time.monotonic() < deadline:
            for path in self.fresh(since):
                if path.name in kept:
                    continue
                try:
                    stat = path.stat()
                    if seen.get(path.name) == (stat.st_size, stat.st_mtime):
                        kept[path.name], changed = path.read_bytes(), time.monotonic()
                    else:
                        seen[path.name] = (stat.st_size, stat.st_mtime)
                except OSError:  # removed or replaced between the listing and the read
                    continue
            if len(kept) >= max(ranks, 1) and time.monotonic() - changed >= self.settle_s:
                return kept
            await asyncio.sleep(0.25)
        for path in self.fresh(since):  # past the wait: what is there now
            if path.name not in kept:
                try:
                    kept[path.name] = path.read_bytes()
                except OSError:
                    continue
        return kept

    async def carry(
        self,
        session: aiohttp.ClientSession,
        coordinators: Coordinators,
        check_id: str,
        since: float,
        ranks: int,
    ) -> int:
        sent = 0
        for name, data in sorted((await self.settle(since, ranks)).items()):
            url = f"/v1/fr/{check_id}/{self.node}/{name}"
            try:
                reply = await request(session, coordinators, "PUT", url, data=data)
            except (Unreachable, OSError) as e:
                log.error("cannot carry dump %s: %s", name, e)
                continue
            if reply.status != 200:
                log.error("coordinator refused dump %s: %s %s", name, reply.status, reply.error())
                continue
            sent += 1
        log.info("carried %d flight-recorder file(s) for %s", sent, check_id)
        return sent
