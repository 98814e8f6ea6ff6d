"""Ask a coordinator for a job's stacks and wait (bounded) for every rank's answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sentinel.status import Client

# An unknown job (404), a malformed one (400) or a refused token: the request itself is wrong.
BAD_INPUT = (400, 401, 403, 404)


def collect(
    client: Client,
    job: str,
    wait_s: float,
    poll_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Ask, then read the grouped answers until every rank answered or `wait_s` passed; the
    last answer, with `elapsed_s` and the nodes asked. Raises `sentinel.status.StatusError`."""
    t0 = clock()
    path = f"/v1/jobs/{quote(job, safe='')}/stacks"
    asked = client.call("POST", path, BAD_INPUT)
    rid = str(asked["request"])
    while True:
        doc: dict[str, Any] = client.call("GET", f"{path}/{quote(rid, safe='')}", BAD_INPUT)
        if not doc["missing_ranks"] or clock() - t0 >= wait_s:
            break
        sleep(poll_s)
    doc["elapsed_s"] = round(clock() - t0, 3)
    doc["nodes"] = asked.get("nodes", [])
    return doc
