"""Events out to the node agent, commands back, without ever blocking the training loop.

Wire format on the agent's Unix socket (`SENTINEL_AGENT_SOCKET`): the rank writes one
`EventBatch` JSON object per line; the agent may write `Command` JSON objects back, one per line.
`send()` only appends to a bounded in-memory queue; a daemon thread connects, drains the queue in
batches and reads commands. When the agent is absent or slow the queue fills and the oldest
events are dropped (counted in `dropped`), so a training process never waits on its agent.

The thread does not poll. It blocks in `select` on the agent's socket (commands) and on a wake
pipe: the first event queued after the queue was empty writes one byte to the pipe, and the
thread then sends that event, and whatever joins it within `flush_interval_s`, as one batch.
A rank reporting every few steps thus wakes its thread a few times a minute, not five times a
second: on a machine whose cores the ranks already fill, each wake-up takes the GIL and a core
from a training process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel.protocol import (
    Command,
    Event,
    EventBase,
    EventBatch,
    ProtocolError,
    decode_command,
    encode,
)

log = logging.getLogger("trainer_hooks.transport")

CommandHandler = Callable[[Command], None]
# An event, or a function building it: the sender's thread only queues; the transport thread
# pays for validation and serialisation.
Outgoing = Event | Callable[[], Event]


class AgentTransport:
    """Bounded queue + background sender for one rank's events."""

    def __init__(
        self,
        socket_path: str | Path | None,
        *,
        max_queue: int = 10_000,
        max_batch: int = 256,
        flush_interval_s: float = 0.2,
        reconnect_s: float = 1.0,
        send_timeout_s: float = 1.0,
    ) -> None:
        self.socket_path = str(socket_path) if socket_path else None
        self._queue: deque[Outgoing] = deque()
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._flush_interval_s = flush_interval_s
        self._reconnect_s = reconnect_s
        self._send_timeout_s = send_timeout_s
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = -1, -1  # the wake pipe, made by start()
        self._due = 0.0  # monotonic time by which the oldest queued event is sent
        self._flush_now = False
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._first_connect = True  # no connection tried yet: a flush waits for the first
        self._rbuf = b""
        # The rank's registration line: sent first on every connection (the agent keeps it
        # only while the connection lasts), and at once when it is set on an open one.
        self._hello: bytes | None = None
        self._hello_due = False
        self._handlers: list[CommandHandler] = []
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.sent = 0
        self.commands_received = 0

    # --- the training thread's side: O(1), never blocks --------------------------------------

    def send(self, event: Outgoing) -> None:
        with self._lock:
            first = not self._queue
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(event)
            if first:
                self._due = time.monotonic() + self._flush_interval_s
        if first or (self._sock is not None and len(self._queue) == self._max_batch):
            self._wake()  # arm the flush timer, or a full batch waits: send it now

    def on_command(self, handler: CommandHandler) -> None:
        """`handler` runs on the transport thread: it must be quick and thread-safe."""
        self._handlers.append(handler)

    def pending(self) -> int:
        return len(self._queue)

    @property
    def connected(self) -> bool:
        """Whether the agent's socket is open now (commands reach this rank only then)."""
        return self._sock is not None

    def pending_events(self) -> list[Event]:
        """What is queued, built (for inspection and tests)."""
        with self._lock:
            items = list(self._queue)
        return [e for e in map(self._build, items) if e is not None]

    def _build(self, item: Outgoing) -> Event | None:
        if isinstance(item, EventBase):
            return item
        try:
            return item()
        except Exception:
            self.dropped += 1
            log.exception("could not build an event; dropped")
            return None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self.socket_path is None:
            return
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="sentinel-transport", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Try to deliver what is queued for up to `flush_timeout_s`, then stop the thread."""
        if self._thread is None:
            return
        self.flush(flush_timeout_s)
        self._stop.set()
        self._wake()
        self._thread.join(timeout=flush_timeout_s)
        self._thread = None
        self._close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def flush(self, timeout_s: float = 1.0) -> None:
        """Wait up to `timeout_s` for the queue to reach the agent (e.g. before exit): while
        connected, or while the first connection is still being made (events queued right
        after start would otherwise be lost on a busy machine); not while the agent is away."""
        deadline = time.monotonic() + timeout_s
        while (
            self._queue
            and self._thread is not None  # started, with a socket to deliver to
            and (self._sock is not None or self._first_connect)
            and time.monotonic() < deadline
        ):
            self._flush_now = True
            self._wake()
            time.sleep(0.01)

    def register(self, line: str) -> None:
        """Announce this rank to the agent (a `sentinel.protocol.encode_registration` line)."""
        self._hello = (line + "\n").encode()
        self._hello_due = True
        self._wake()

    def _wake(self) -> None:
        """One byte down the wake pipe (never blocks: a full pipe already wakes the thread)."""
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    # --- the background thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._sock is None and not self._connect():
                    self._sleep(None, self._reconnect_s)
                    continue
                if self._hello_due and self._hello is not None:
                    assert self._sock is not None
                    self._hello_due = False
                    self._sock.sendall(self._hello)
                if self._queue and (
                    self._flush_now
                    or len(self._queue) >= self._max_batch
                    or time.monotonic() >= self._due
                ):
                    self._flush_now = False
                    self._flush()
                timeout = max(0.0, self._due - time.monotonic()) if self._queue else None
                if self._sleep(self._sock, timeout):
                    self._read_commands()
            except (OSError, ValueError) as e:
                log.debug("agent socket error: %s", e)
                self._close()
                self._sleep(None, self._flush_interval_s)  # then reconnect

    def _sleep(self, sock: socket.socket | None, timeout: float | None) -> bool:
        """Block until the wake pipe, `sock` (if any) or `timeout`; True if `sock` is readable."""
        watched: list[Any] = [self._wake_r] + ([sock] if sock is not None else [])
        readable, _, _ = select.select(watched, [], [], timeout)
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        return sock is not None and sock in readable

    def _connect(self) -> bool:
        assert self.socket_path is not None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._send_timeout_s)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            self._first_connect = False
            return False
        self._sock, self._first_connect = sock, False
        self._hello_due = self._hello is not None
        return True

    def _close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._rbuf = b""

    def _take_batch(self) -> list[Event]:
        with self._lock:
            n = min(len(self._queue), self._max_batch)
            items = [self._queue.popleft() for _ in range(n)]
        return [e for e in map(self._build, items) if e is not None]

    def _requeue(self, batch: list[Event]) -> None:  # built events go back as they are
        with self._lock:
            self._queue.extendleft(reversed(batch))
            while len(self._queue) > self._max_queue:
                self._queue.popleft()
                self.dropped += 1

    def _flush(self) -> None:
        while self._queue and self._sock is not None:
            batch = self._take_batch()
            line = (encode(EventBatch(events=batch)) + "\n").encode()
            try:
                self._sock.sendall(line)
            except OSError:
                self._requeue(batch)
                raise
            self.sent += len(batch)

    def _read_commands(self) -> None:
        """The socket is readable: take what is there (one read; select says if more waits)."""
        assert self._sock is not None
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("agent closed the socket")
        self._rbuf += chunk
        *lines, self._rbuf = self._rbuf.split(b"\n")
        for raw in lines:
            if raw.strip():
                self._dispatch(raw)

    def _dispatch(self, raw: bytes) -> None:
        try:
            cmd = decode_command(raw)
        except ProtocolError as e:
            log.warning("ignoring a malformed command from the agent: %s", e)
            return
        self.commands_received += 1
        for handler in self._handlers:
            try:
                handler(cmd)
            except Exception:
                log.exception("command handler failed for %s", cmd.kind)
