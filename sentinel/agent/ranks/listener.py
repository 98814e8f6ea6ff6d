"""The local Unix socket training ranks write JSON-line protocol events to.

The agent relays what it receives like its own events and re-exports rank metrics. A rank may
also register which GPU it owns (`registry.py`); the registration lasts while its connection
is open. A line that is not a valid event or registration for this node is counted and
dropped, never fatal, and never closes the connection: a rank's bug must not cost the node its
monitoring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from sentinel.agent.ranks.registry import (
    Peer,
    RankRegistry,
    is_registration,
    parse_registration,
)
from sentinel.beacon import fr_trigger_path, poke_fr
from sentinel.protocol import Event, ProtocolError, decode_batch, decode_event

log = logging.getLogger("sentinel.agent.ranks")

MAX_LINE_BYTES = 1 << 20


def peer_of(sock: socket.socket | None) -> Peer | None:
    """The connected process's pid and uid, from the kernel (SO_PEERCRED); None off Linux."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", raw)
    return Peer(pid, uid) if pid > 0 else None


class RankSocketServer:
    def __init__(self, path: Path, node_id: str, on_event: Callable[[Event], None]) -> None:
        self.path = path
        self.node_id = node_id
        self.on_event = on_event
        self.received = 0
        self.garbage = 0
        self.registry = RankRegistry()
        self._server: asyncio.AbstractServer | None = None
        self._logged_reasons: set[str] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket from a previous run
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_LINE_BYTES
        )
        # Ranks run as the job's user, often not the agent's: group-writable, not world.
        os.chmod(self.path, 0o660)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def handle_line(
        self, line: bytes, conn: object = None, peer: Peer | None = None
    ) -> list[Event]:
        """Validate one line — an event or a batch of them — and relay it if every event comes
        from a rank on this node; or record a registration for the connection `conn`. A line
        is accepted or dropped whole."""
        line = line.strip()
        if not line:
            return []
        if is_registration(line):
            try:
                unwatched = self.registry.register(conn, parse_registration(line), peer)
            except ProtocolError as e:
                self._drop(f"registration refused: {e}")
                return []
            if unwatched is not None:
                self._warn_once("a rank's beacon is not watched", unwatched)
            return []
        try:
            events = decode_batch(line).events if b'"events"' in line else [decode_event(line)]
            for event in events:
                if event.source.node != self.node_id:
                    raise ProtocolError(
                        f"source.node {event.source.node!r} is not this node ({self.node_id!r})"
                    )
        except ProtocolError as e:
            self._drop(str(e))
            return []
        self.received += len(events)
        for event in events:
            self.on_event(event)
        return events

    def broadcast(self, line: str) -> int:
        """Write one line (a command) to every connected rank; returns how many got it."""
        data = (line.rstrip("\n") + "\n").encode()
        sent = 0
        for writer in list(self._writers):
            if writer.is_closing():
                self._writers.discard(writer)
                continue
            writer.write(data)
            sent += 1
        return sent

    def ask_native_dumps(self) -> int:
        """Ask every watched rank's GIL-free dump helper (trainer_hooks/fr_native.py) for a
        flight-recorder dump: the one a rank holding the GIL still gives. Only at the FIFO of
        the process the kernel named for the registration, and only one that process's user
        owns. Returns how many helpers took the request."""
        return sum(
            poke_fr(fr_trigger_path(w.peer.pid, w.reg.rank), owner=w.peer.uid)
            for w in self.registry.watched()
        )

    def _drop(self, reason: str) -> None:
        self.garbage += 1
        self._warn_once("dropped a rank message", reason)

    def _warn_once(self, what: str, reason: str) -> None:
        key = reason[:80]
        if key not in self._logged_reasons and len(self._logged_reasons) < 100:
            self._logged_reasons.add(key)  # one log line per kind of garbage, not per line
            log.warning(what, extra={"reason": reason})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        peer = peer_of(writer.get_extra_info("socket"))
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than MAX_LINE_BYTES; its tail is dropped as garbage too
                    self._drop("line longer than 1 MiB")
                    continue
                if not line:
                    break
                self.handle_line(line, writer, peer)
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            self.registry.release(writer)  # the rank is gone: so is its claim on a GPU
            self._writers.discard(writer)
            writer.close()
