"""The ingest fast path over raw sockets: what HTTP clients send that aiohttp's own client
never does (split reads, pipelining, chunked bodies, 100-continue, malformed requests), the
hand-over of a connection to aiohttp, idle connections, and shutdown with a batch in flight."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from coord_util import cfg, one, serve_front, xid

from sentinel.coordinator.core.auth import Role
from sentinel.coordinator.http.app import build_app
from sentinel.coordinator.http.common import SERVICE
from sentinel.coordinator.http.listener import IDLE_CLOSE_S, IngestListener
from sentinel.protocol import EventBatch, encode

LIMIT = 64 * 1024


class Conn:
    """One raw HTTP/1.1 connection to the coordinator."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(length), 10)
        return int(lines[0].split()[1]), headers, body

    async def closed(self) -> bool:
        """Whether the server closes the connection (EOF) without sending more."""
        return await asyncio.wait_for(self.reader.read(), 10) == b""


def post(token: str | None, body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /v1/events HTTP/{version}\r\nHost: c\r\n{auth}{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def batch(node: str, gpu: int = 0) -> bytes:
    return encode(EventBatch(events=[xid(node, gpu=gpu)])).encode()


def chunked_head(token: str, extra: str = "") -> bytes:
    return (
        f"POST /v1/events HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"
        f"Transfer-Encoding: chunked\r\n{extra}\r\n"
    ).encode()


def chunk(part: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(part), part)


@asynccontextmanager
async def serving(
    tmp_path: Path, idle_close_s: float = IDLE_CLOSE_S
) -> AsyncIterator[tuple[IngestListener, str, str]]:
    """(the site, a node token for node-1, an admin token)."""
    app = build_app(cfg(tmp_path, max_body_bytes=LIMIT, commit_window_s=0.0))
    async with serve_front(app, idle_close_s) as (site, _client):
        service = app[SERVICE]
        node = (await service.db(service.tokens.create, Role.NODE, "node-1"))[1]
        admin = (await service.db(service.tokens.create, Role.ADMIN))[1]
        yield site, node, admin


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[IngestListener, str, str]]:
    async with serving(tmp_path) as s:
        yield s


async def connect(site: IngestListener) -> Conn:
    return Conn(*await asyncio.open_connection("127.0.0.1", site.port))


async def stored(site: IngestListener) -> int:
    assert site.front is not None
    service = site.front.service
    return (await service.db(one, service.store, "SELECT COUNT(*) AS n FROM events"))["n"]


async def test_keep_alive_batches_and_nothing_else(
    served: tuple[IngestListener, str, str],
) -> None:
    site, node, admin = served
    assert site.front is not None
    c = await connect(site)
    for gpu in range(2):
        await c.send(post(node, batch("node-1", gpu)))
        status, headers, body = await c.response()
        assert status == 200 and json.loads(body)["accepted"] == 1
        assert headers["content-type"] == "application/json; charset=utf-8"
    assert len(site.front.connections) == 1  # both answered on one connection
    # Another route on the ingest port: refused whoever asks, and the connection closed.
    await c.send(
        f"GET /v1/nodes HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer {admin}\r\n\r\n".encode()
    )
    status, headers, body = await c.response()
    assert status == 404 and "only POST /v1/events" in json.loads(body)["error"]
    assert headers["connection"] == "close" and await c.closed()
    assert await stored(site) == 2


async def test_split_reads_chunked_body_and_100_continue(
    served: tuple[IngestListener, str, str],
) -> None:
    site, node, _ = served
    c = await connect(site)
    for byte in post(node, batch("node-1")):  # one byte a write: the route told from pieces
        await c.send(bytes([byte]))
    assert (await c.response())[0] == 200
    body = batch("node-1", 1)
    await c.send(chunked_head(node, "Expect: 100-continue\r\n"))
    assert await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 10) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    half = len(body) // 2
    for part in (body[:half], body[half:]):
        await c.send(chunk(part))
    await c.send(b"0\r\n\r\n")
    status, _, answer = await c.response()
    assert status == 200 and json.loads(answer)["accepted"] == 1
    assert await stored(site) == 2


async def test_pipelined_requests_answered_in_order_until_another_route(
    served: tuple[IngestListener, str, str],
) -> None:
    site, node, admin = served
    c = await connect(site)
    other = f"GET /v1/nodes HTTP/1.1\r\nAuthorization: Bearer {admin}\r\n\r\n".encode()
    await c.send(post(node, batch("node-1", 0)) + post(node, b"{nope") + other)
    first, second = await c.response(), await c.response()
    assert first[0] == 200 and "connection" not in first[1]
    assert second[0] == 400 and "not valid JSON" in json.loads(second[2])["error"]
    assert second[1]["connection"] == "close"  # the GET is left for the client to retry
    assert await c.closed()
    assert await stored(site) == 1


async def test_refusals_match_the_aiohttp_route(served: tuple[IngestListener, str, str]) -> None:
    site, node, _ = served
    c = await connect(site)
    await c.send(post(None, batch("node-1")))
    status, headers, body = await c.response()
    assert status == 401 and headers["www-authenticate"] == 'Bearer realm="sentinel"'
    assert json.loads(body) == {"error": "missing or invalid bearer token"}
    await c.send(post(node, batch("node-2")))  # a node speaks only for itself
    status, _, body = await c.response()
    assert status == 403 and "cannot report as node 'node-2'" in json.loads(body)["error"]
    # Over the limit by Content-Length: refused unread, then the connection closes.
    await c.send(post(node, b"x" * (LIMIT + 1)))
    status, headers, body = await c.response()
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"] == (
        f"request body over the {LIMIT} byte limit (Content-Length {LIMIT + 1})"
    )
    assert await c.closed()
    # Without a token the caller learns nothing more than 401, whatever it sends.
    c = await connect(site)
    await c.send(post(None, b"x" * (LIMIT + 1)))
    assert (await c.response())[0] == 401
    # Over the limit in chunks, which announce no length.
    c = await connect(site)
    await c.send(chunked_head(node))
    for _ in range(5):
        await c.send(chunk(b"x" * 16384))
    assert (await c.response())[0] == 413
    # Not HTTP at all past the request line.
    c = await connect(site)
    await c.send(b"POST /v1/events HTTP/1.1\r\nContent-Length: many\r\n\r\n")
    status, headers, body = await c.response()
    assert status == 400 and json.loads(body)["error"].startswith("malformed HTTP request")
    assert await c.closed()
    # HTTP/1.0 without keep-alive: answered, then closed.
    c = await connect(site)
    await c.send(post(node, batch("node-1"), version="1.0"))
    status, headers, _ = await c.response()
    assert status == 200 and headers["connection"] == "close"
    assert await c.closed()
    assert await stored(site) == 1  # only the last batch; nothing of the refused ones


async def test_idle_connections_are_closed(tmp_path: Path) -> None:
    async with serving(tmp_path, idle_close_s=0.3) as (site, node, _):
        busy, idle = await connect(site), await connect(site)
        await idle.send(b"POST /v1/ev")  # a request begun and never finished is idle too
        for _ in range(6):
            await busy.send(post(node, batch("node-1")))
            assert (await busy.response())[0] == 200
            await asyncio.sleep(0.1)
        assert await idle.closed()
        assert not busy.reader.at_eof()


async def test_shutdown_answers_a_batch_in_flight(tmp_path: Path) -> None:
    app = build_app(cfg(tmp_path, commit_window_s=0.5))  # the batch waits in the commit window
    async with serve_front(app) as (site, _client):
        service = app[SERVICE]
        node = (await service.db(service.tokens.create, Role.NODE, "node-1"))[1]
        c = await connect(site)
        await c.send(post(node, batch("node-1")))
        await asyncio.sleep(0.1)
        await site.stop()  # what `runner.cleanup()` does first when the coordinator stops
        status, _, body = await c.response()
        assert status == 200 and json.loads(body)["accepted"] == 1
        assert await c.closed()
    db = sqlite3.connect(tmp_path / "state" / "coordinator.db")
    assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
