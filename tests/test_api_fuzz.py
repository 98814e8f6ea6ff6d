"""Property-based fuzzing of the whole coordinator API, through every door, driven by its own
OpenAPI description.

Schemathesis turns `GET /v1/openapi.json` into request generators (hypothesis); every
operation gets a bounded number of valid and invalid requests, sent with an admin token to a
real `sentinel coordinator` process, on the API port and (for `POST /v1/events`) on the ingest
listener's port. Properties: no 5xx, an answer within the timeout (no hang), a malformed
request refused with a 4xx within 2 s, no route answering without a token, and the store
intact afterwards.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from coord_util import Coordinator, xid
from hypothesis import HealthCheck, settings

from sentinel.coordinator.core.states import STATE_TYPES, Entity
from sentinel.coordinator.http.openapi import openapi_document
from sentinel.coordinator.http.routes import ROUTES, route_for
from sentinel.protocol import EventBatch, encode

EXAMPLES = 15  # per operation: 15 operations, under a minute in all on a quiet machine
TIMEOUT_S = 10.0  # an answer slower than this is a hang
REFUSED_WITHIN_S = 2.0  # a malformed request is refused at least this fast

schema = schemathesis.openapi.from_dict(openapi_document(ROUTES))
ingest_schema = schemathesis.openapi.from_dict(openapi_document([route_for("post", "/v1/events")]))


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SENTINEL_COORDINATOR__LONG_POLL_MAX_S", "1")  # a long-poll is no hang
    c = Coordinator(tmp_path_factory.mktemp("fuzz") / "state", ingest=True)
    try:
        c.start()
        yield c
    finally:
        mp.undo()
        c.stop()


def _admin(c: Coordinator) -> str:
    return (c.state / "admin.token").read_text().strip()


def _send(case: schemathesis.Case, base_url: str, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    # Sent with requests directly: schemathesis' own transport trips on urllib3 2.8's pools.
    kwargs = case.as_transport_kwargs(base_url=base_url, headers=headers)
    try:
        response = requests.request(**kwargs, timeout=TIMEOUT_S)
    except requests.Timeout:
        pytest.fail(f"no answer in {TIMEOUT_S:g} s: {case.as_curl_command()}")
    said = f"{response.status_code} {response.text[:300]}\n{case.as_curl_command()}"
    assert response.status_code < 500, said
    if 400 <= response.status_code < 500:  # refused: at once, not after a wait
        assert response.elapsed.total_seconds() < REFUSED_WITHIN_S, said


FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@schema.parametrize()
@FUZZ
def test_no_request_breaks_the_api(case: schemathesis.Case, coordinator: Coordinator) -> None:
    _send(case, coordinator.url, _admin(coordinator))


@ingest_schema.parametrize()
@FUZZ
def test_no_request_breaks_the_ingest_listener(
    case: schemathesis.Case, coordinator: Coordinator
) -> None:
    assert coordinator.ingest_url is not None
    _send(case, coordinator.ingest_url, _admin(coordinator))


def test_a_deeply_nested_body_is_refused_at_every_door(coordinator: Coordinator) -> None:
    """JSON nested past what any decoder follows is malformed input: a 400, on every door
    that reads a JSON body, and nothing is stored."""
    deep = b"[" * 100_000 + b"]" * 100_000
    admin = {"Authorization": f"Bearer {_admin(coordinator)}", "Content-Type": "application/json"}
    for url in (
        f"{coordinator.url}/v1/events",
        f"{coordinator.ingest_url}/v1/events",
        f"{coordinator.url}/v1/actions",
        f"{coordinator.url}/v1/commands/x/ack",
    ):
        for body in (deep, b'{"v": 1, "events": ' + deep + b"}"):
            r = requests.post(url, data=body, headers=admin, timeout=TIMEOUT_S)
            assert r.status_code == 400 and "nested too deeply" in r.json()["error"], url


@pytest.mark.parametrize(
    "query",
    [
        "node=" + "n" * 129,
        "node=node-1&wait=-1",
        "node=node-1&wait=nan",
        "node=a&job=b",
        "",
        "node=a/b",
    ],
)
def test_a_malformed_command_poll_is_refused_at_once(query: str, coordinator: Coordinator) -> None:
    r = requests.get(
        f"{coordinator.url}/v1/commands?{query}",
        headers={"Authorization": f"Bearer {_admin(coordinator)}"},
        timeout=TIMEOUT_S,
    )
    assert r.status_code == 400 and r.elapsed.total_seconds() < REFUSED_WITHIN_S, r.text


@pytest.mark.parametrize("route", [r for r in ROUTES if not r.public], ids=lambda r: r.path)
@pytest.mark.parametrize("token", [None, "Bearer snt_0000beef_nope", "Basic x"])
def test_no_route_answers_without_a_valid_token(
    route: object, token: str | None, coordinator: Coordinator
) -> None:
    from sentinel.coordinator.http.openapi import Route

    assert isinstance(route, Route)
    path = route.path.replace("{id}", "1")
    headers = {"Authorization": token} if token else {}
    r = requests.request(
        route.method.upper(), coordinator.url + path, headers=headers, timeout=TIMEOUT_S
    )
    assert r.status_code == 401, f"{route.method} {path}: {r.status_code}"


def test_the_store_is_intact_after_fuzzing(coordinator: Coordinator) -> None:
    """Runs last in this module: whatever the fuzzer sent, every row holds a state its
    lifecycle knows, the database is whole, and the coordinator still ingests and answers."""
    db = sqlite3.connect(Path(coordinator.state) / "coordinator.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for entity, table, column in (
            (Entity.INCIDENT, "incidents", "state"),
            (Entity.RUN, "runs", "status"),
            (Entity.STEP, "actions", "state"),
            (Entity.NODE, "nodes", "state"),
            (Entity.JOB, "jobs", "state"),
            (Entity.EFFECT, "effects", "state"),
        ):
            known = {str(s) for s in STATE_TYPES[entity]}
            found = {r[0] for r in db.execute(f"SELECT DISTINCT {column} FROM {table}")}
            assert found <= known, f"{table}: unknown states {found - known}"
    finally:
        db.close()
    admin = _admin(coordinator)
    batch = EventBatch(events=[xid("node-fuzz")])
    answer = coordinator.call("POST", "/v1/events", admin, encode(batch).encode())
    assert answer["accepted"] == 1  # type: ignore[index]
    with urllib.request.urlopen(f"{coordinator.url}/healthz", timeout=TIMEOUT_S) as r:
        # one coordinator on its own store leads, at the one epoch there is
        assert json.loads(r.read()) == {"status": "ok", "role": "leader", "epoch": 1}
