"""The ingest listener: a port of its own that serves `POST /v1/events` and nothing else.

At fleet scale nearly every request the coordinator answers is an agent's `POST /v1/events`,
and aiohttp's per-request machinery costs nearly as much CPU as everything Sentinel does with
the batch. Measured on one core under a paced 2,048-node load, a fixed answer costs 0.20 ms of CPU
per request from aiohttp on uvloop and 0.08 ms from an asyncio protocol on httptools (llhttp,
the parser uvicorn uses); Sentinel's own work on a 9-event batch is ~0.26 ms.

So a coordinator configured with `ingest_listen` (`--ingest-listen HOST:PORT`) opens a second
port, served by this protocol: it parses requests with httptools and answers them through the
very code the API's aiohttp route uses (`ingest.answer_batch`), so the answers are the same on
both ports, and admits a request through the same route table entry (`routes.route_for`): one door
for the path, whichever port. The API port keeps serving `POST /v1/events` through aiohttp too; a fleet posts to the
ingest port. Any other request on the ingest port is answered 404 and the connection closed:
nothing is handed between servers, and aiohttp is used only through its public API.

Served: HTTP/1.1 keep-alive, chunked bodies, `Expect: 100-continue`, pipelining. A pipelined
request for another route closes the connection once the requests before it are answered (a
pipelining client retries what was not answered, RFC 9112, 9.3.2).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from email.utils import formatdate
from typing import cast

import httptools
from aiohttp import web

from sentinel.coordinator.core.store import StoreUnavailable
from sentinel.coordinator.http.common import (
    METRICS,
    SERVICE,
    Refusal,
    admit,
    error_body,
    too_large,
    unavailable,
)
from sentinel.coordinator.http.ingest import answer_batch, retry_after
from sentinel.coordinator.http.metrics import Metrics
from sentinel.coordinator.http.routes import route_for
from sentinel.coordinator.runtime import Service

INGEST = route_for("post", "/v1/events")  # the one door: its roles, its answer

log = logging.getLogger("sentinel.coordinator")

INGEST_LINE = b"POST /v1/events HTTP/1."
INGEST_PATH = b"/v1/events"
IDLE_CLOSE_S = 75.0  # aiohttp's keep-alive timeout: both paths close idle connections alike
SWEEPS_PER_IDLE_CLOSE = 15  # how often idle connections are looked for, within that timeout
MAX_QUEUED = 16  # pipelined requests a connection may have waiting before reading pauses
STOP_GRACE_S = 10.0  # at shutdown, how long requests being answered get to finish
LINGER_S = 2.0  # after a refusal, how long the rest of its body is read and dropped
_REASONS = {
    200: b"OK",
    404: b"Not Found",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    413: b"Request Entity Too Large",
    422: b"Unprocessable Entity",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass(slots=True)
class _Request:
    """A request read whole (or refused before it was): what answering it needs."""

    authorization: str | None
    body: bytes
    keep_alive: bool
    too_large: str | None = None  # why the body was refused, after the caller is authenticated
    malformed: str | None = None  # answered 400 whoever sent it, as aiohttp does
    not_found: bool = False  # a request for another route: answered 404, whoever sent it


class _Stop(Exception):
    """Raised in a parser callback: read no further on this connection."""


ONLY_INGEST = "this port serves only POST /v1/events; the rest of the API is on the API port"


class IngestFront:
    """What every ingest connection shares: the service and the open connections (closed when
    idle or at shutdown)."""

    def __init__(self, service: Service, metrics: Metrics, idle_close_s: float) -> None:
        self.service = service
        self.metrics = metrics
        self.limit = service.cfg.max_body_bytes
        self.idle_close_s = idle_close_s
        self.connections: set[IngestConnection] = set()
        self.stopping = False  # shutting down: no new request is read
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="sentinel-front-sweep")

    async def close(self) -> None:
        """Let requests being answered finish (bounded), then close every connection."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        busy = [c.serving for c in self.connections if c.serving is not None]
        if busy:
            await asyncio.wait(busy, timeout=STOP_GRACE_S)
        for conn in list(self.connections):
            conn.close()

    async def answer(self, req: _Request) -> tuple[int, bytes, bytes]:
        """(status, body, extra header lines) for one request, never raising."""
        if req.malformed is not None:
            return 400, error_body(req.malformed), b""
        if req.not_found:
            return 404, error_body(ONLY_INGEST), b""
        try:
            principal = await admit(self.service, INGEST, req.authorization)
            if req.too_large is not None:
                raise too_large(self.limit, req.too_large)
            status, body = await answer_batch(self.service, self.metrics, principal, req.body)
            return status, body, _header_lines(retry_after(status))
        except Refusal as e:
            return e.status, e.body(), _header_lines(e.headers)
        except StoreUnavailable as e:  # authenticating a token not cached needs the store
            refusal = unavailable(e)
            return 503, refusal.body(), _header_lines(refusal.headers)
        except Exception:
            log.exception("answering an event batch failed")
            return 500, error_body("internal error; the batch was not acknowledged"), b""

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.idle_close_s / SWEEPS_PER_IDLE_CLOSE)
            cutoff = time.monotonic() - self.idle_close_s
            for conn in [c for c in self.connections if c.idle_since(cutoff)]:
                conn.close()


class IngestConnection(asyncio.Protocol):
    """One client connection to the ingest port."""

    def __init__(self, front: IngestFront) -> None:
        self.front = front
        self.serving: asyncio.Task[None] | None = None  # answering the queue, in order
        self.last_active = time.monotonic()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._queue: deque[_Request] = deque()
        self._between = True  # the next byte read starts a request
        self._head = b""  # a request's first bytes, while too few to tell its route
        self._closing = False  # read nothing more; close once the queue is answered
        self._paused = False
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._auth: bytes | None = None
        self._expect_continue = False
        self._body: list[bytes] = []
        self._size = 0

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self.front.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        # What was read whole is still answered (and stored): like aiohttp, a client leaving
        # does not cancel a batch already on its way to the store.
        self._transport = None
        self.front.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._closing:
            return
        if self.front.stopping:
            self._closing = True  # what is being answered still is; nothing new is read
            return
        if self._between and not self._queue and self.serving is None:
            data, self._head = self._head + data, b""
            if not data.startswith(INGEST_LINE):
                if INGEST_LINE.startswith(data):
                    self._head = data  # too short to tell yet
                else:
                    self._refuse(_Request(None, b"", False, not_found=True))
                    self._serve()
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            if not isinstance(e.__context__, _Stop):
                log.error("ingest connection: parser callback failed", exc_info=e.__context__)
            self._closing = True  # read no more; what was queued is answered
        except httptools.HttpParserError as e:
            self._refuse(_Request(None, b"", False, malformed=f"malformed HTTP request: {e}"))
        self._serve()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def idle_since(self, cutoff: float) -> bool:
        return self.serving is None and not self._queue and self.last_active < cutoff

    # --- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._closing:
            raise _Stop
        self._between = False
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url  # llhttp hands a URL split across reads over in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"authorization":
            if self._auth is None:  # the first, as aiohttp's `headers.get` takes
                self._auth = value
        elif name == b"expect":
            self._expect_continue = value.lower() == b"100-continue"
        elif name == b"content-length" and value.isdigit() and int(value) > self.front.limit:
            self._refuse(self._request(too_large=f"Content-Length {int(value)}"))
            raise _Stop

    def on_headers_complete(self) -> None:
        if self._url != INGEST_PATH or self._parser.get_method() != b"POST":
            # A pipelined request for another route: answer what came before it, then close.
            self._closing = True
            raise _Stop
        if self._expect_continue and not self._queue and self.serving is None:
            assert self._transport is not None
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.front.limit:
            self._refuse(self._request(too_large=f"{self._size} bytes and more"))
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._queue.append(self._request())
        self._between = True
        if not self._queue[-1].keep_alive:
            self._closing = True
        if len(self._queue) >= MAX_QUEUED and self._transport is not None:
            self._transport.pause_reading()  # a client pipelining faster than batches commit
            self._paused = True

    # --- answering -------------------------------------------------------------------------------

    def _request(self, too_large: str | None = None) -> _Request:
        auth = self._auth.decode("latin-1") if self._auth is not None else None
        body = b"".join(self._body) if too_large is None else b""
        return _Request(auth, body, self._parser.should_keep_alive(), too_large=too_large)

    def _refuse(self, req: _Request) -> None:
        """Queue a refusal and read no more: what is left of its body is never read."""
        req.keep_alive = False
        self._queue.append(req)
        self._closing = True

    def _serve(self) -> None:
        if self._queue and self.serving is None:
            self.serving = asyncio.get_running_loop().create_task(self._answer_queue())

    async def _answer_queue(self) -> None:
        while self._queue:
            req = self._queue.popleft()
            status, body, extra = await self.front.answer(req)
            transport = self._transport
            if transport is None:
                continue  # the client left; what it sent whole is still stored
            close = not req.keep_alive or (self._closing and not self._queue)
            transport.write(_response(status, body, extra, close))
            if close:
                _lingering_close(transport)
                break
        self.serving = None
        if self._paused and self._transport is not None and not self._closing:
            self._paused = False
            self._transport.resume_reading()


def _header_lines(headers: dict[str, str] | None) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode() for k, v in (headers or {}).items())


def _lingering_close(transport: asyncio.Transport) -> None:
    """Close after the answer, without losing it: closing a socket with unread input (the rest
    of a refused body) sends a reset that can destroy the answer before the client reads it.
    So send FIN now, drop what still arrives, and close when the client does or `LINGER_S`
    has passed, as aiohttp lingers."""
    transport.write_eof()
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


_date_cache: tuple[int, bytes] = (0, b"")


def _http_date() -> bytes:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode())
    return _date_cache[1]


def _response(status: int, body: bytes, extra: bytes, close: bool) -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"Content-Type: application/json; charset=utf-8\r\n",
            b"Content-Length: %d\r\n" % len(body),
            b"Date: %s\r\nServer: sentinel\r\n" % _http_date(),
            extra,
            b"Connection: close\r\n\r\n" if close else b"\r\n",
            body,
        )
    )


class IngestListener:
    """The ingest port: started after the app's startup (it needs the app's service)."""

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        backlog: int = 1024,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.backlog = backlog
        self.idle_close_s = idle_close_s
        self.front: IngestFront | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        front = IngestFront(self.app[SERVICE], self.app[METRICS], self.idle_close_s)
        self.front = front
        # A fleet reconnects at once after a coordinator restart: a deep accept queue keeps
        # its connections from waiting out SYN retransmits.
        self._server = await asyncio.get_running_loop().create_server(
            lambda: IngestConnection(front), self.host, self.port, backlog=self.backlog
        )
        self.port = self._server.sockets[0].getsockname()[1]
        front.start()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections
        if self.front is not None:
            await self.front.close()
