"""Spool, delivery, rank socket and sd_notify: the agent's plumbing, each on its real path."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from loopback import serve

from sentinel.agent.ranks.listener import RankSocketServer
from sentinel.agent.systemd import Notifier
from sentinel.agent.uplink.delivery import Deliverer, Outcome
from sentinel.agent.uplink.spool import Spool
from sentinel.failover import Coordinators
from sentinel.protocol import (
    AgentHeartbeatPayload,
    Command,
    CommandKind,
    Event,
    EventBatch,
    EventKind,
    Source,
    Verdict,
    decode_batch,
    decode_command,
    encode,
    make_event,
)


def heartbeat(node: str = "node-0", rank: int | None = None) -> Event:
    payload = AgentHeartbeatPayload(gpus=8, verdict=Verdict.HEALTHY, agent_version="t")
    return make_event(EventKind.AGENT_HEARTBEAT, Source(node=node, rank=rank), payload)


# --- spool -----------------------------------------------------------------------------------


def test_spool_survives_reopen_and_acks_in_order(tmp_path: Path) -> None:
    events = [heartbeat() for _ in range(5)]
    spool = Spool(tmp_path, max_events=100)
    spool.append(events)
    spool.close()
    spool = Spool(tmp_path, max_events=100)  # a restarted agent
    upto, got = spool.peek(3)
    assert [e.id for e in got] == [e.id for e in events[:3]]
    spool.ack(upto)
    assert [e.id for e in spool.peek(10)[1]] == [e.id for e in events[3:]]


def test_spool_drops_oldest_only_past_its_bound_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_events=4)
    events = [heartbeat() for _ in range(6)]
    assert spool.append(events[:4]) == 0
    assert spool.append(events[4:]) == 2
    assert len(spool) == 4 and spool.dropped == 2
    assert [e.id for e in spool.peek(10)[1]] == [e.id for e in events[2:]]


# --- delivery --------------------------------------------------------------------------------


class FakeCoordinator:
    """The few lines of the coordinator's ingest API the agent uses: POST /v1/events."""

    def __init__(self) -> None:
        self.received: list[Event] = []
        self.statuses: list[int] = []  # scripted replies, then 200
        self.auth: list[str | None] = []

    async def ingest(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.received.extend(decode_batch(await request.read()).events)
        return web.Response(status=status, text="scripted")


@pytest.fixture
async def fake_coordinator() -> tuple[FakeCoordinator, str]:  # type: ignore[misc]
    fake = FakeCoordinator()
    app = web.Application()
    app.router.add_post("/v1/events", fake.ingest)
    async with serve(app) as url:
        yield fake, url


async def test_delivery_retries_then_delivers_everything_once(
    tmp_path: Path, fake_coordinator: tuple[FakeCoordinator, str]
) -> None:
    fake, url = fake_coordinator
    spool = Spool(tmp_path, 100)
    events = [heartbeat() for _ in range(7)]
    spool.append(events)
    fake.statuses = [503, 401]
    d = Deliverer(spool, Coordinators(url), token="s3cret", batch_max=3)
    async with aiohttp.ClientSession() as session:
        assert await d.deliver_once(session) is Outcome.BACK_OFF
        assert await d.deliver_once(session) is Outcome.BACK_OFF
        assert len(spool) == 7  # nothing acknowledged, nothing lost
        while (await d.deliver_once(session)) is Outcome.SENT:
            pass
    assert [e.id for e in fake.received] == [e.id for e in events]
    assert len(spool) == 0 and d.stats.delivered == 7 and d.stats.failures == 2


async def test_delivery_sends_the_bearer_token_from_the_service(
    tmp_path: Path, fake_coordinator: tuple[FakeCoordinator, str]
) -> None:
    fake, url = fake_coordinator
    spool = Spool(tmp_path, 100)
    spool.append([heartbeat()])
    d = Deliverer(spool, Coordinators(url), token="s3cret", idle_s=0.01)
    task = asyncio.create_task(d.run())
    for _ in range(200):
        if fake.received:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert fake.auth[0] == "Bearer s3cret"
    assert len(fake.received) == 1


async def test_unreachable_coordinator_keeps_events(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 100)
    spool.append([heartbeat()])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Deliverer(spool, Coordinators(f"http://127.0.0.1:{port}"), token=None)
    async with aiohttp.ClientSession() as session:
        assert await d.deliver_once(session) is Outcome.BACK_OFF
    assert len(spool) == 1


async def test_malformed_batch_is_dropped_not_retried_forever(
    tmp_path: Path, fake_coordinator: tuple[FakeCoordinator, str]
) -> None:
    fake, url = fake_coordinator
    spool = Spool(tmp_path, 100)
    spool.append([heartbeat(), heartbeat()])
    fake.statuses = [413, 422]
    d = Deliverer(spool, Coordinators(url), token=None, batch_max=2)
    async with aiohttp.ClientSession() as session:
        assert await d.deliver_once(session) is Outcome.SENT  # 413: halve and go again
        assert d.batch_max == 1
        assert await d.deliver_once(session) is Outcome.SENT  # 422: dropped, counted
        assert await d.deliver_once(session) is Outcome.SENT
    assert d.stats.rejected == 1 and len(fake.received) == 1 and len(spool) == 0


# --- rank socket -----------------------------------------------------------------------------


async def test_rank_socket_relays_valid_lines_and_counts_garbage(tmp_path: Path) -> None:
    got: list[Event] = []
    path = tmp_path / "agent.sock"
    server = RankSocketServer(path, "node-0", got.append)
    await server.start()
    assert oct(os.stat(path).st_mode & 0o777) == "0o660"
    good = heartbeat(rank=3)
    other_node = heartbeat(node="node-9", rank=1)
    _reader, writer = await asyncio.open_unix_connection(str(path))
    lines = [
        encode(good),
        "this is not json",
        json.dumps({"v": 99}),
        encode(other_node),
        "",
        "x" * (2 << 20),
        encode(heartbeat(rank=4)),
    ]
    writer.write(("\n".join(lines) + "\n").encode())
    await writer.drain()
    writer.close()
    for _ in range(200):
        if len(got) == 2:
            break
        await asyncio.sleep(0.01)
    await server.stop()
    assert next(e.id for e in got) == good.id
    assert [e.source.rank for e in got] == [3, 4]
    assert server.garbage >= 4  # bad JSON, bad version, foreign node, the oversized line
    assert not path.exists()


async def test_rank_socket_takes_event_batches_whole_and_relays_commands(tmp_path: Path) -> None:
    """The hooks send one EventBatch per line; a batch with one foreign event is dropped whole.
    Commands written by the agent reach every connected rank."""
    got: list[Event] = []
    path = tmp_path / "agent.sock"
    server = RankSocketServer(path, "node-0", got.append)
    await server.start()
    good = EventBatch(events=[heartbeat(rank=1), heartbeat(rank=2)])
    mixed = EventBatch(events=[heartbeat(rank=3), heartbeat(node="node-9", rank=4)])
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"{encode(good)}\n{encode(mixed)}\n".encode())
    await writer.drain()
    for _ in range(200):
        if len(got) == 2 and server.garbage == 1:
            break
        await asyncio.sleep(0.01)
    assert [e.source.rank for e in got] == [1, 2] and server.garbage == 1
    command = Command(kind=CommandKind.FR_DUMP, target=Source(node="node-0"))
    assert server.broadcast(encode(command)) == 1
    line = await asyncio.wait_for(reader.readline(), 5)
    assert decode_command(line) == command
    writer.close()
    await server.stop()


# --- sd_notify -------------------------------------------------------------------------------


def test_notify_protocol_over_a_real_datagram_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
        n.ready("watching 8 GPUs")
        assert sock.recv(4096) == b"READY=1\nSTATUS=watching 8 GPUs"
        assert n.watchdog(now=100.0)
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert not n.watchdog(now=100.5)  # within half the interval: no ping
        assert n.watchdog(now=101.1)
        assert sock.recv(4096) == b"WATCHDOG=1"
        n.stopping()
        assert sock.recv(4096) == b"STOPPING=1"


def test_notify_is_a_no_op_outside_systemd() -> None:
    n = Notifier({})
    assert not n.enabled and not n.watchdog(now=1.0)
    n.ready()  # must not raise


def test_watchdog_pid_for_another_process_is_ignored() -> None:
    n = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval_s is None


async def test_command_relay_delivers_to_ranks_then_acknowledges(tmp_path: Path) -> None:
    """Against a stand-in for the coordinator's two command endpoints (its real format: see
    sentinel/coordinator/queries.py take_commands); the real coordinator is used in the demo."""
    from sentinel.agent.uplink.commands import CommandRelay

    command = Command(kind=CommandKind.SDC_CHECK, target=Source(node="node-0"))
    acks: list[tuple[str, dict[str, object]]] = []
    polls: list[dict[str, str]] = []

    async def commands(request: web.Request) -> web.Response:
        polls.append(dict(request.query))
        return web.json_response({"commands": [json.loads(encode(command))] if not acks else []})

    async def ack(request: web.Request) -> web.Response:
        acks.append((request.match_info["id"], await request.json()))
        return web.json_response({"acked": request.match_info["id"]})

    app = web.Application()
    app.router.add_get("/v1/commands", commands)
    app.router.add_post("/v1/commands/{id}/ack", ack)
    ranks = RankSocketServer(tmp_path / "agent.sock", "node-0", lambda e: None)
    await ranks.start()
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "agent.sock"))
    await asyncio.sleep(0.05)  # the server registers the connection
    async with serve(app) as url, aiohttp.ClientSession() as session:
        relay = CommandRelay(Coordinators(url), "tok", "node-0", ranks, wait_s=1)
        assert await relay.poll_once(session) == 1
    assert decode_command(await asyncio.wait_for(reader.readline(), 5)) == command
    assert polls[0] == {"node": "node-0", "wait": "1"}
    assert acks == [(command.id, {"ok": True, "detail": {"relayed_to_ranks": 1}})]
    writer.close()
    await ranks.stop()
