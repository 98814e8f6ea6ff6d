"""The HTTP API in process: auth rules, precise errors, no partial writes. Each test runs on
aiohttp's test server (every request through aiohttp) and behind the ingest fast path, as
`sentinel coordinator` serves it (event batches answered past aiohttp), and each of those on
both store backends (SQLite, and a real PostgreSQL server)."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from coord_util import cfg, one, query, serve_front, xid
from prometheus_client import generate_latest

from sentinel.coordinator.core.auth import Role
from sentinel.coordinator.http.app import build_app
from sentinel.coordinator.http.common import SERVICE
from sentinel.coordinator.http.metrics import Metrics
from sentinel.protocol import (
    EventBatch,
    EventKind,
    RankCheckpointPayload,
    Source,
    encode,
    make_event,
)


@pytest.fixture(params=["aiohttp", "fast path"])
async def client(
    request: pytest.FixtureRequest, tmp_path: Path, store_url: str | None
) -> AsyncIterator[TestClient]:
    """Every request path on each store backend: the same answers, the same codes."""
    app = build_app(cfg(tmp_path, max_body_bytes=64 * 1024, store=store_url))
    if request.param == "aiohttp":
        async with TestClient(TestServer(app)) as c:
            yield c
    else:
        async with serve_front(app) as (_site, front):
            yield front  # type: ignore[misc]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def make_token(
    client: TestClient, role: Role, node: str | None = None, job: str | None = None
) -> str:
    service = client.app[SERVICE]
    return (await service.db(service.tokens.create, role, node, job))[1]


async def test_admin_token_file_and_unauthenticated_requests(
    client: TestClient, tmp_path: Path
) -> None:
    path = tmp_path / "state" / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    admin = path.read_text().strip()
    assert (await client.get("/healthz")).status == 200
    for method, url in (
        ("GET", "/v1/incidents"),
        ("POST", "/v1/events"),
        ("GET", "/metrics"),
        ("GET", "/v1/commands?job=j"),
        ("GET", "/v1/no-such-route"),  # an anonymous probe learns nothing about the routes
        ("DELETE", "/v1/events"),
    ):
        assert (await client.request(method, url)).status == 401
        assert (await client.request(method, url, headers=bearer("snt_x_y"))).status == 401
    assert (await client.get("/v1/incidents", headers=bearer(admin))).status == 200
    missing = await client.get("/v1/no-such-route", headers=bearer(admin))
    assert missing.status == 404 and "no such route: /v1/no-such-route" in await missing.text()
    wrong = await client.delete("/v1/events", headers=bearer(admin))
    assert wrong.status == 405 and wrong.headers["Allow"] == "POST"
    service = client.app[SERVICE]
    stored = await service.db(query, service.store, "SELECT hash FROM tokens")
    assert admin not in json.dumps(stored)  # only the hash is kept


async def test_scopes(client: TestClient) -> None:
    node1 = await make_token(client, Role.NODE, node="node-1")
    job = await make_token(client, Role.JOB, job="job1")
    op = await make_token(client, Role.OPERATOR)
    own, other = (
        encode(EventBatch(events=[xid("node-1")])),
        encode(EventBatch(events=[xid("node-2")])),
    )
    r = await client.post("/v1/events", data=other, headers=bearer(node1))
    assert r.status == 403 and "cannot report as node 'node-2'" in (await r.json())["error"]
    assert (await client.post("/v1/events", data=own, headers=bearer(node1))).status == 200
    assert (await client.post("/v1/events", data=own, headers=bearer(job))).status == 403
    assert (await client.post("/v1/events", data=own, headers=bearer(op))).status == 403
    assert (await client.get("/v1/commands?node=node-2", headers=bearer(node1))).status == 403
    assert (await client.get("/v1/commands?node=node-1", headers=bearer(node1))).status == 200
    assert (await client.get("/v1/commands?job=job2", headers=bearer(job))).status == 403
    assert (await client.get("/v1/commands?job=job1", headers=bearer(job))).status == 200
    assert (await client.get("/v1/incidents", headers=bearer(node1))).status == 403
    assert (await client.get("/v1/incidents", headers=bearer(op))).status == 200
    assert (await client.post("/v1/incidents/1/acknowledge", headers=bearer(job))).status == 403
    r = await client.post("/v1/incidents/1/acknowledge", headers=bearer(op))
    assert r.status == 200 and (await r.json())["acknowledged_by"].startswith("operator:")
    service = client.app[SERVICE]
    token_id = node1.split("_")[1]
    assert await service.db(service.tokens.revoke, token_id)
    assert (await client.post("/v1/events", data=own, headers=bearer(node1))).status == 401


async def test_bad_requests_are_refused_whole(client: TestClient) -> None:
    admin = await make_token(client, Role.ADMIN)
    h = bearer(admin)
    r = await client.post("/v1/events", data=b"{nope", headers=h)
    assert r.status == 400 and "not valid JSON" in (await r.json())["error"]
    r = await client.post("/v1/events", data=json.dumps({"v": 9, "events": []}), headers=h)
    assert r.status == 422 and "unsupported protocol version 9" in (await r.json())["error"]
    good = json.loads(encode(xid("node-1")))
    bad = {**json.loads(encode(xid("node-1"))), "payload": {"action": "none"}}
    r = await client.post("/v1/events", data=json.dumps({"v": 1, "events": [good, bad]}), headers=h)
    assert r.status == 422
    assert (
        "events.1.payload.verdict: Field required (a node.health event)"
        in (await r.json())["error"]
    )
    r = await client.post("/v1/events", data=b"x" * (65 * 1024), headers=h)
    assert r.status == 413
    events = await client.get("/v1/incidents", headers=h)
    assert await events.json() == []  # nothing of the refused batches was written
    service = client.app[SERVICE]
    assert (await service.db(one, service.store, "SELECT COUNT(*) n FROM events"))["n"] == 0


async def test_batches_decoded_in_one_group_fail_alone(client: TestClient) -> None:
    """Batches that arrive together are decoded together before their shared commit: a
    malformed or forbidden one is refused with its own reason and the others are stored."""
    node1 = bearer(await make_token(client, Role.NODE, node="node-1"))
    mine = [encode(EventBatch(events=[xid("node-1", gpu=g)])) for g in range(3)]
    other = encode(EventBatch(events=[xid("node-2")]))
    sent = [mine[0], b"{nope", other, mine[1], b'{"v": 1, "events": 3}', mine[2]]
    replies = await asyncio.gather(
        *(client.post("/v1/events", data=d, headers=node1) for d in sent)
    )
    assert [r.status for r in replies] == [200, 400, 403, 200, 422, 200]
    assert "cannot report as node 'node-2'" in (await replies[2].json())["error"]
    assert "events: Input should be a valid array" in (await replies[4].json())["error"]
    service = client.app[SERVICE]
    rows = await service.db(query, service.store, "SELECT node FROM events")
    assert [r["node"] for r in rows] == ["node-1"] * 3


async def test_a_relayed_rank_checkpoint_is_stored_and_a_bad_one_refused(
    client: TestClient,
) -> None:
    """A node's agent forwards its ranks' `rank.checkpoint` events like every rank event."""
    node1 = bearer(await make_token(client, Role.NODE, node="node-1"))
    source = Source(node="node-1", rank=0, job="job1")
    good = make_event(
        EventKind.RANK_CHECKPOINT, source, RankCheckpointPayload(step=40, blocked_s=0.2)
    )
    r = await client.post("/v1/events", data=encode(EventBatch(events=[good])), headers=node1)
    assert r.status == 200, await r.text()
    bad = {**json.loads(encode(good)), "payload": {"step": -1}}
    r = await client.post("/v1/events", data=json.dumps({"v": 1, "events": [bad]}), headers=node1)
    assert r.status == 422
    assert (
        "payload.step: Input should be greater than or equal to 0 (a rank.checkpoint event)"
        in (await r.json())["error"]
    )
    service = client.app[SERVICE]
    rows = await service.db(query, service.store, "SELECT kind, rank, payload FROM events")
    assert [(r["kind"], r["rank"], r["payload"]["step"]) for r in rows] == [
        ("rank.checkpoint", 0, 40)
    ]


async def test_batches_inside_the_commit_window_share_one_commit(tmp_path: Path) -> None:
    """A batch waits up to `commit_window_s` for others: two batches 0.1 s apart inside a
    1 s window are committed together, and the first is acknowledged once the window ends."""
    async with TestClient(TestServer(build_app(cfg(tmp_path, commit_window_s=1.0)))) as client:
        service = client.app[SERVICE]
        groups: list[int] = []
        commit = service._commit_group

        def counted(batches: list) -> list:
            groups.append(len(batches))
            return commit(batches)

        service._commit_group = counted  # type: ignore[method-assign]
        h = bearer(await make_token(client, Role.ADMIN))
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def post(node: str) -> tuple[int, float]:
            r = await client.post(
                "/v1/events", data=encode(EventBatch(events=[xid(node)])), headers=h
            )
            return r.status, loop.time() - t0

        first = asyncio.create_task(post("node-1"))
        await asyncio.sleep(0.1)
        second = await post("node-2")
        first_status, first_acked = await first
        assert (first_status, second[0]) == (200, 200)
        assert groups == [2]
        assert 1.0 <= first_acked < 5.0


def test_gc_pauses_are_exported_by_generation() -> None:
    metrics = Metrics()
    try:
        gc.collect()
        text = generate_latest(metrics.registry).decode()
        full = re.search(
            r'sentinel_coordinator_gc_pause_seconds_count\{generation="2"\} (\S+)', text
        )
        assert full is not None and float(full[1]) >= 1.0
        assert 'sentinel_coordinator_gc_pause_seconds_bucket{generation="0",le="+Inf"}' in text
    finally:
        metrics.close()
    assert metrics.gc_pauses._on_gc not in gc.callbacks


async def test_openapi_metrics_and_operator_flow(client: TestClient) -> None:
    h = bearer(await make_token(client, Role.ADMIN))
    doc = await (await client.get("/v1/openapi.json", headers=h)).json()
    assert "/v1/events" in doc["paths"] and "EventBatch" in doc["components"]["schemas"]
    batch = encode(EventBatch(events=[xid("node-1", gpu=g) for g in range(8)]))
    r = await client.post("/v1/events", data=batch, headers=h)
    assert (await r.json())["accepted"] == 8 and len((await r.json())["incidents_opened"]) == 1
    again = await (await client.post("/v1/events", data=batch, headers=h)).json()
    assert again == {"accepted": 0, "duplicates": 8, "incidents_opened": []}
    text = await (await client.get("/metrics", headers=h)).text()
    assert 'sentinel_coordinator_events_total{result="accepted"} 8.0' in text
    assert 'sentinel_coordinator_events_total{result="duplicate"} 8.0' in text
    assert "sentinel_coordinator_eviction_budget_remaining" in text
    # The store's files, as on disk: SQLite's WAL holds the commits no checkpoint copied back
    # yet; a PostgreSQL server keeps its own WAL, and its database's size is what is shown.
    sizes = dict(re.findall(r'sentinel_coordinator_store_bytes\{file="(\w+)"\} (\S+)', text))
    files = {"database"} if client.app[SERVICE].cfg.store else {"database", "wal"}
    assert sizes.keys() == files and float(sizes["database"]) > 0
    # One incident opened, by kind; detected (first event to opening) but not yet recovered.
    assert re.search(r'sentinel_coordinator_incidents_opened_total\{kind="[a-z_]+"\} 1\.0', text)
    assert "sentinel_coordinator_incident_detect_seconds_count 1.0" in text
    assert "sentinel_coordinator_incident_recover_seconds_count 0.0" in text
    r = await client.post(
        "/v1/actions",
        json={"incident": 1, "action": "notify", "params": {"message": "look"}},
        headers=h,
    )
    assert r.status == 200
    r = await client.post("/v1/actions", json={"incident": 1, "action": "fly"}, headers=h)
    assert r.status == 422 and "unknown action 'fly'" in (await r.json())["error"]
    r = await client.post("/v1/incidents/1/resolve", headers=h)
    assert r.status == 200
    text = await (await client.get("/metrics", headers=h)).text()
    assert "sentinel_coordinator_incident_recover_seconds_count 1.0" in text
    assert 'sentinel_coordinator_incident_recover_seconds_bucket{le="+Inf"} 1.0' in text
    r = await client.post("/v1/incidents/1/resolve", headers=h)
    assert r.status == 409 and "resolved -> resolved" in (await r.json())["error"]
    audit = await (await client.get("/v1/audit", headers=h)).json()
    assert {"incident.open", "manual.notify", "incident.resolve"} <= {a["what"] for a in audit}


async def test_bad_input_the_fuzzer_found_gets_a_precise_4xx(client: TestClient) -> None:
    """Each of these once hung or answered 500 (found by the API fuzzer, tests/test_api_fuzz.py)."""
    h = bearer(await make_token(client, Role.ADMIN))
    # a version that is no integer: the batch's flush task died, and the client waited for ever
    r = await asyncio.wait_for(
        client.post("/v1/events", json={"events": [], "v": {}}, headers=h), 10
    )
    assert r.status == 422 and "unsupported protocol version" in (await r.json())["error"]
    # a job.status with no payload: its required fields are missing (was a KeyError, 500)
    doc = {"events": [{"kind": "job.status", "source": {"job": "0"}}], "v": 1}
    r = await client.post("/v1/events", json=doc, headers=h)
    assert r.status == 422 and "events.0.payload: Field required" in (await r.json())["error"]
    # incident ids past 64 bits name no incident (the store overflowed: 500)
    huge = "999999999999999999999999999999"
    assert (await client.get(f"/v1/incidents/{huge}", headers=h)).status == 404
    for verb in ("acknowledge", "approve", "resolve"):
        assert (await client.post(f"/v1/incidents/{huge}/{verb}", headers=h)).status == 404
    r = await client.post(
        "/v1/actions", json={"incident": int(huge), "action": "notify"}, headers=h
    )
    assert r.status == 404


async def test_the_openapi_description_is_the_route_table(client: TestClient) -> None:
    from sentinel.coordinator.http.routes import ROUTES

    h = bearer(await make_token(client, Role.ADMIN))
    doc = await (await client.get("/v1/openapi.json", headers=h)).json()
    served = {(r.method, r.path) for r in ROUTES}
    described = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == described
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"\{(\w+)\}", path))
        for op in ops.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == names, f"{path}: path parameters {names}, declared {declared}"
    # every resource the app routes (the catch-all aside) is a route of the table
    routed = {
        (route.method.lower(), route.resource.canonical)
        for route in client.app.router.routes()
        if route.resource is not None and route.method != "*" and route.method != "HEAD"
    }
    assert routed == served
