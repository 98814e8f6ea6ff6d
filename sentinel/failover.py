"""Which coordinator a client talks to, and when it moves on to the next.

Agents, the job supervisor and `sentinel status` may be given several coordinator URLs:
replicas sharing one PostgreSQL store, any of which ingests, serves and delivers commands. A
client sticks to one until it cannot answer (connection refused or reset, a timeout, or a 503:
a replica that lost its database) and then moves to the next at once, within the same call. A
503's `Retry-After` keeps that replica out of the rotation for as long as it asks. Every other
answer, 4xx included, is the coordinator's answer and goes back to the caller: a request bad at
one replica is bad at all of them, and trying it everywhere would only hide the fault.

Re-sending a request the dead replica may have committed is safe: event ingest is idempotent by
event id and command acknowledgements by command id. One URL (a load balancer in front of the
replicas, or a single coordinator) behaves as it always did.

The rotation is `Coordinators`; `request` (aiohttp, the daemons) and `fetch` (urllib, the CLI)
are its two transports.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from sentinel.config import parse_urls

log = logging.getLogger("sentinel.failover")

FAILOVER_STATUS = 503  # a replica that cannot serve now (its database is gone): ask another
RETRY_AFTER_MAX_S = 300.0  # a longer ask is capped: a replica back early must not sit idle
# A host that is gone answers nothing; its replica's turn should end well before a request's
# own timeout (loopback and a data-centre network connect in milliseconds).
CONNECT_TIMEOUT_S = 3.0
_CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date), capped at
    RETRY_AFTER_MAX_S; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


class Unreachable(Exception):
    """No coordinator answered this call. `retry_in_s`: when one may be asked again (a 503's
    Retry-After still running on all of them), 0 when now."""

    def __init__(self, failures: Sequence[tuple[str, str]], retry_in_s: float) -> None:
        self.failures, self.retry_in_s = list(failures), retry_in_s
        if len(self.failures) == 1:
            url, why = self.failures[0]
            text = f"cannot reach the coordinator at {url}: {why}"
        elif self.failures:
            text = "no coordinator answered: " + "; ".join(f"{u}: {w}" for u, w in self.failures)
        else:
            text = f"every coordinator asked to be left alone for {retry_in_s:.1f}s more (503)"
        super().__init__(text)


class Coordinators:
    """The coordinator URLs a client knows, the one it talks to now, and those resting after
    a 503 with Retry-After. One per process, shared by its clients: one that sees a replica die
    moves the others too. Methods never block and take no lock: one event loop (or one thread)
    uses an instance."""

    def __init__(
        self, urls: str | Sequence[str], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.urls = parse_urls(urls)
        self._clock = clock
        self._current = 0
        self._resting: dict[str, float] = {}  # url -> clock time it may be asked again
        self.failovers = 0  # moves from one URL to the next (a metric for operators)

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def round(self) -> list[str]:
        """The URLs to try now, in order: the current one first, then the rest in turn, each
        one resting after a 503 left out."""
        now = self._clock()
        n = len(self.urls)
        order = [self.urls[(self._current + i) % n] for i in range(n)]
        return [u for u in order if self._resting.get(u, 0.0) <= now]

    def retry_in_s(self) -> float:
        """0 when some URL may be asked now, else the time until the first one may."""
        if self.round():
            return 0.0
        return max(0.0, min(self._resting.values()) - self._clock())

    def failed(self, url: str, why: str, rest_s: float | None = None) -> None:
        """`url` did not answer (`why`, for the log); `rest_s`: leave it alone that long. The
        current URL failing moves the client to the next."""
        if rest_s:
            self._resting[url] = self._clock() + rest_s
        if url != self.current or len(self.urls) == 1:
            return
        self._current = (self._current + 1) % len(self.urls)
        self.failovers += 1
        log.warning(
            "coordinator %s did not answer (%s); failing over to %s", url, why, self.current
        )

    def answered(self, url: str) -> None:
        """`url` gave an answer: it is the one to talk to from now on."""
        self._resting.pop(url, None)
        index = self.urls.index(url)
        if index != self._current:
            self._current = index
            log.info("now talking to coordinator %s", url)


@dataclass(frozen=True)
class Reply:
    """A coordinator's answer (never a 503: that fails over), and which coordinator gave it."""

    url: str
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The coordinator's own words for a refusal (its JSON `error`), else the body."""
        try:
            doc = self.json()
        except ValueError:
            return self.text()[:200]
        return str(doc.get("error", doc)) if isinstance(doc, dict) else self.text()[:200]


class Refused(Exception):
    """A coordinator answered a request with a status the caller cannot go on from."""

    def __init__(self, what: str, reply: Reply) -> None:
        self.reply = reply
        super().__init__(f"{what}: {reply.url} answered {reply.status} {reply.error()}")


class _Attempt:
    """One call's pass over the rotation: the URLs to try and why each one failed."""

    def __init__(self, coordinators: Coordinators) -> None:
        self.coordinators = coordinators
        self.failures: list[tuple[str, str]] = []

    def urls(self) -> list[str]:
        return self.coordinators.round()

    def failed(self, url: str, why: str, rest_s: float | None = None) -> None:
        self.coordinators.failed(url, why, rest_s)
        self.failures.append((url, why))

    def unavailable(self, url: str, header: str | None) -> None:
        """A 503: the replica is up but cannot serve; its Retry-After says for how long."""
        rest = retry_after_s(header)
        why = f"{FAILOVER_STATUS} unavailable" + (f", retry after {rest:g}s" if rest else "")
        self.failed(url, why, rest)

    def unreachable(self) -> Unreachable:
        return Unreachable(self.failures, self.coordinators.retry_in_s())


async def request(
    session: aiohttp.ClientSession,
    coordinators: Coordinators,
    method: str,
    path: str,
    **kwargs: Any,
) -> Reply:
    """`method path` at the current coordinator, then at each next one that cannot answer;
    `kwargs` go to aiohttp (params, data, json, headers). Raises Unreachable when none did."""
    attempt = _Attempt(coordinators)
    for base in attempt.urls():
        try:
            async with session.request(method, base + path, **kwargs) as resp:
                body = await resp.read()
                status, header = resp.status, resp.headers.get("Retry-After")
        except _CONNECTION_ERRORS as e:
            attempt.failed(base, str(e) or type(e).__name__)
            continue
        if status == FAILOVER_STATUS:
            attempt.unavailable(base, header)
            continue
        coordinators.answered(base)
        return Reply(base, status, body)
    raise attempt.unreachable()


def fetch(
    coordinators: Coordinators,
    path: str,
    headers: Mapping[str, str],
    timeout_s: float,
    method: str = "GET",
    data: bytes | None = None,
) -> Reply:
    """`method path` (GET by default) the way `request` does it, for a synchronous command
    line (urllib)."""
    attempt = _Attempt(coordinators)
    for base in attempt.urls():
        req = urllib.request.Request(base + path, data=data, headers=dict(headers), method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                reply = Reply(base, resp.status, resp.read())
        except urllib.error.HTTPError as e:
            if e.code == FAILOVER_STATUS:
                attempt.unavailable(base, e.headers.get("Retry-After"))
                continue
            reply = Reply(base, e.code, e.read())
        except (urllib.error.URLError, OSError) as e:
            attempt.failed(base, str(getattr(e, "reason", e)))
            continue
        coordinators.answered(base)
        return reply
    raise attempt.unreachable()
