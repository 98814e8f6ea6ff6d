"""Deliver spooled events to the coordinator in batches, retrying with capped exponential backoff.

The spool is the source of truth: a batch is removed from it only after a coordinator has
acknowledged it (2xx, which the coordinator sends once the batch is durable). With several
coordinator URLs a batch no replica could take is sent to the next one (sentinel/failover.py);
it stays in the spool until one of them acknowledges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from enum import Enum

import aiohttp

from sentinel.agent.uplink.spool import Spool
from sentinel.failover import CONNECT_TIMEOUT_S, Coordinators, Unreachable, request
from sentinel.protocol import EventBatch, encode

log = logging.getLogger("sentinel.agent.uplink.delivery")


class Outcome(Enum):
    SENT = "sent"  # a batch was handled (or the batch size shrank): go again at once
    EMPTY = "empty"  # nothing to send: wait for new events
    BACK_OFF = "back_off"  # the coordinator did not take it: wait, then retry the same batch


@dataclass
class DeliveryStats:
    delivered: int = 0
    rejected: int = 0  # refused by the coordinator as malformed: dropped, never retried
    failures: int = 0  # attempts that failed and will be retried


class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0) -> None:
        self.base_s, self.cap_s, self.attempt = base_s, cap_s, 0

    def next_delay(self) -> float:
        self.attempt += 1
        return random.uniform(0, min(self.cap_s, self.base_s * 2**self.attempt))

    def reset(self) -> None:
        self.attempt = 0


class Deliverer:
    def __init__(
        self,
        spool: Spool,
        coordinators: Coordinators,
        token: str | None,
        batch_max: int = 500,
        idle_s: float = 0.2,
    ) -> None:
        self.spool = spool
        self.coordinators = coordinators  # shared with the agent's other clients
        self.token = token
        self.batch_max = batch_max
        self.idle_s = idle_s
        self.stats = DeliveryStats()
        self._backoff = Backoff()
        self._retry_in_s = 0.0  # every coordinator asked for a rest this long (503 Retry-After)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """New events are in the spool: send now rather than after the idle wait."""
        self._wake.set()

    async def run(self) -> None:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        timeout = aiohttp.ClientTimeout(total=10, sock_connect=CONNECT_TIMEOUT_S)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            while True:
                outcome = await self.deliver_once(session)
                if outcome is Outcome.BACK_OFF:
                    await asyncio.sleep(max(self._backoff.next_delay(), self._retry_in_s))
                elif outcome is Outcome.EMPTY:
                    self._wake.clear()
                    # asyncio.timeout: 3.11's wait_for can swallow a cancel racing the wake.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.idle_s):
                            await self._wake.wait()

    async def deliver_once(self, session: aiohttp.ClientSession) -> Outcome:
        """Send the oldest spooled batch once."""
        upto, events = self.spool.peek(self.batch_max)
        if not events:
            return Outcome.EMPTY
        body = encode(EventBatch(events=events))
        try:
            reply = await request(session, self.coordinators, "POST", "/v1/events", data=body)
        except Unreachable as e:
            self.stats.failures += 1
            self._retry_in_s = e.retry_in_s
            log.warning("coordinator unreachable, events stay spooled", extra={"error": str(e)})
            return Outcome.BACK_OFF
        self._retry_in_s = 0.0
        text, status = reply.text(), reply.status
        if 200 <= status < 300:
            self.spool.ack(upto)
            self.stats.delivered += len(events)
            self._backoff.reset()
            return Outcome.SENT
        if status == 413 and self.batch_max > 1:
            self.batch_max = max(1, self.batch_max // 2)
            log.warning("batch too large, halving", extra={"batch_max": self.batch_max})
            return Outcome.SENT
        if status in (400, 422):
            # The coordinator can never accept these; retrying would block every later event.
            self.spool.ack(upto)
            self.stats.rejected += len(events)
            log.error("coordinator rejected a batch", extra={"status": status, "reason": text})
            return Outcome.SENT
        # 401/403 (a token to fix), 429 and 5xx: keep the events and try again later, at the
        # same coordinator (another replica would give the same answer).
        self.stats.failures += 1
        log.warning("delivery failed, will retry", extra={"status": status, "reason": text[:200]})
        return Outcome.BACK_OFF
