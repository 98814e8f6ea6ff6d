"""Ask a coordinator for a job's stacks and wait (bounded) for every rank's answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from sentinel.failover import Coordinators, Unreachable, fetch


class StacksError(Exception):
    """The coordinator could not be asked; `bad_input` when it refused the request itself
    (an unknown job, a refused token)."""

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


class StacksClient:
    def __init__(
        self, urls: str | Sequence[str], token: str | None, timeout_s: float = 10.0
    ) -> None:
        self.coordinators = Coordinators(urls)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s

    def call(self, method: str, path: str) -> Any:
        try:
            reply = fetch(
                self.coordinators, path, self.headers, self.timeout_s, method, b"" if method ==
                "POST" else None
            )  # fmt: skip
        except Unreachable as e:
            raise StacksError(str(e)) from None
        if not reply.ok:
            raise StacksError(
                f"{reply.url}{path}: {reply.status} {reply.error()}",
                bad_input=reply.status in (400, 401, 403, 404),
            )
        try:
            return reply.json()
        except ValueError:
            raise StacksError(f"{reply.url}{path}: not JSON: {reply.text()[:200]}") from None

    def collect(
        self,
        job: str,
        wait_s: float,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Ask, then read the grouped answers until every rank answered or `wait_s` passed;
        the last answer, with `elapsed_s`."""
        t0 = clock()
        path = f"/v1/jobs/{quote(job, safe='')}/stacks"
        asked = self.call("POST", path)
        rid = str(asked["request"])
        while True:
            doc: dict[str, Any] = self.call("GET", f"{path}/{quote(rid, safe='')}")
            if not doc["missing_ranks"] or clock() - t0 >= wait_s:
                break
            sleep(poll_s)
        doc["elapsed_s"] = round(clock() - t0, 3)
        doc["nodes"] = asked.get("nodes", [])
        return doc
