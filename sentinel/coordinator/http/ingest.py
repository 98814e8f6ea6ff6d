"""`POST /v1/events`: one answer, whichever port the batch came in on (the API's aiohttp route or
the ingest listener, `listener.py`)."""

from __future__ import annotations

import time

from aiohttp import web

from sentinel.coordinator.core.auth import Principal
from sentinel.coordinator.core.store import StoreUnavailable
from sentinel.coordinator.http.common import (
    METRICS,
    RETRY_AFTER_S,
    error_body,
    principal,
    service,
    unavailable,
)
from sentinel.coordinator.http.metrics import Metrics
from sentinel.coordinator.runtime import Refused, Service
from sentinel.protocol import ProtocolError


async def answer_batch(
    service: Service, metrics: Metrics, principal: Principal, body: bytes
) -> tuple[int, bytes]:
    """(status, JSON body) for a batch posted by `principal`, once it is durable (or refused)."""
    t0 = time.perf_counter()
    try:
        result = await service.ingest(body, principal.may_report_all)
    except ProtocolError as e:
        msg = str(e)
        status = 400 if msg.startswith(("not valid JSON", "expected a JSON object")) else 422
        metrics.rejected.labels(code=str(status)).inc()
        return status, error_body(msg)
    except Refused as e:
        metrics.rejected.labels(code="403").inc()
        return 403, error_body(str(e))
    except StoreUnavailable as e:  # nothing of the batch was committed: the sender retries
        metrics.rejected.labels(code="503").inc()
        return 503, unavailable(e).body()
    metrics.observe_batch(result, time.perf_counter() - t0)
    opened = ",".join(map(str, result.opened))
    return 200, (
        f'{{"accepted":{result.accepted},"duplicates":{result.duplicates},'
        f'"incidents_opened":[{opened}]}}'.encode()
    )


def retry_after(status: int) -> dict[str, str] | None:
    return {"Retry-After": RETRY_AFTER_S} if status == 503 else None


async def post_events(request: web.Request) -> web.Response:
    body = await request.read()
    status, answer = await answer_batch(
        service(request), request.app[METRICS], principal(request), body
    )
    return web.Response(
        body=answer, status=status, content_type="application/json", headers=retry_after(status)
    )
