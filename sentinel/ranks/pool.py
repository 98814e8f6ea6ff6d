"""The supervisor's side of the rank-control wire: every warm process of the job, in one place.

Node hosts and rank processes connect here (`sentinel.ranks.host`, `sentinel.ranks.rank`).
One thread owns the sockets and reads every message into the pool's state; the supervisor's
threads ask it to fork, run, leave and kill, and wait on its condition for the answers. Every
wait is bounded. A connection whose first line is not a `Hello` with the job's secret is closed.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sentinel.ranks import wire

log = logging.getLogger("sentinel.ranks")
_HELLO_WITHIN_S = 10.0  # a connection that has not said hello by then is dropped


class PoolError(RuntimeError):
    """Rank processes that could not be had: `missing` (node, slot) pairs."""

    def __init__(self, message: str, missing: list[tuple[str, int]]) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass
class _Conn:
    sock: socket.socket
    reader: wire.LineReader = field(default_factory=wire.LineReader)
    opened: float = field(default_factory=time.monotonic)
    hello: wire.Hello | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, message: wire.Spawn | wire.Kill | wire.Run | wire.Leave | wire.Exit) -> bool:
        with self.send_lock:
            try:
                self.sock.sendall(wire.encode(message))
            except OSError:
                return False
        return True


@dataclass
class RankProcess:
    """One warm rank process, as the pool sees it."""

    node: str
    slot: int
    pid: int
    conn: _Conn
    generation: int | None = None  # the generation it was last asked to run
    rank: int | None = None
    ended: wire.Ended | None = None  # how that generation's main ended, once it has
    ended_at: float | None = None
    gone_at: float | None = None  # its connection closed: the process is dead
    exit_code: int | None = None  # as its node host saw it end (-N: signal N)
    runs: int = 0  # generations it has run

    @property
    def gone(self) -> bool:
        return self.gone_at is not None

    @property
    def busy(self) -> bool:
        """Running a generation's main now."""
        return not self.gone and self.generation is not None and self.ended is None


@dataclass
class _Host:
    node: str
    pid: int
    conn: _Conn
    gone: bool = False


class RankPool:
    def __init__(self, secret: str, bind: str = "127.0.0.1", advertise: str | None = None) -> None:
        self._secret = secret
        self._listener = socket.create_server((bind, 0))
        self._listener.setblocking(False)
        port = self._listener.getsockname()[1]
        self.address = f"{advertise or bind}:{port}"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._cond = threading.Condition()
        self._hosts: dict[str, _Host] = {}
        self._procs: dict[tuple[str, int], RankProcess] = {}  # the live one per (node, slot)
        self._forking: set[tuple[str, int]] = set()  # asked of a host, no hello yet
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="sentinel-rank-pool", daemon=True)
        self._thread.start()

    # --- the socket thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=0.5):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            self._drop_silent()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            sock, _ = self._listener.accept()
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sel.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _drop_silent(self) -> None:
        now = time.monotonic()
        for key in list(self._sel.get_map().values()):
            conn = key.data
            if conn is not None and conn.hello is None and now - conn.opened > _HELLO_WITHIN_S:
                self._close(conn, "no hello")

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
            lines = conn.reader.feed(data) if data else None
        except (OSError, wire.WireError) as e:
            self._close(conn, str(e))
            return
        if lines is None:
            self._close(conn, "closed")
            return
        for line in lines:
            try:
                message = wire.decode_to_pool(line)
            except wire.WireError as e:
                self._close(conn, f"bad message: {e}")
                return
            if not self._take(conn, message):
                return

    def _take(self, conn: _Conn, message: wire.Hello | wire.Exited | wire.Ended) -> bool:
        """Apply one message; False when it closed the connection."""
        if conn.hello is None:
            if not isinstance(message, wire.Hello) or not hmac.compare_digest(
                message.secret.encode(), self._secret.encode()
            ):
                self._close(conn, "no valid hello")
                return False
            conn.hello = message
            with self._cond:
                if message.slot is None:
                    self._hosts[message.node] = _Host(message.node, message.pid, conn)
                else:
                    key = (message.node, message.slot)
                    self._procs[key] = RankProcess(message.node, message.slot, message.pid, conn)
                    self._forking.discard(key)
                self._cond.notify_all()
            return True
        hello = conn.hello
        with self._cond:
            if isinstance(message, wire.Exited) and hello.slot is None:  # from a node host
                self._forking.discard((hello.node, message.slot))  # died before its hello
                proc = self._procs.get((hello.node, message.slot))
                if proc is not None and proc.pid == message.pid:
                    proc.exit_code = message.code
            elif isinstance(message, wire.Ended) and hello.slot is not None:  # from a rank
                proc = self._procs.get((hello.node, hello.slot))
                if proc is not None and proc.pid == hello.pid:
                    proc.ended, proc.ended_at = message, time.monotonic()
            self._cond.notify_all()
        return True

    def _close(self, conn: _Conn, why: str) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        hello = conn.hello
        if hello is None:
            log.warning("rank pool: dropped a connection (%s)", why)
            return
        with self._cond:
            if hello.slot is None:
                host = self._hosts.get(hello.node)
                if host is not None and host.pid == hello.pid:
                    host.gone = True
                    self._forking -= {k for k in self._forking if k[0] == hello.node}
            else:
                proc = self._procs.get((hello.node, hello.slot))
                if proc is not None and proc.pid == hello.pid:
                    proc.gone_at = time.monotonic()
            self._cond.notify_all()

    # --- the supervisor's side ---------------------------------------------------------------

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def host_ready(self, node: str) -> bool:
        host = self._hosts.get(node)
        return host is not None and not host.gone

    def host_lost(self, node: str) -> bool:
        """The node's host connected once and is gone (the process died)."""
        host = self._hosts.get(node)
        return host is not None and host.gone

    def prefork(self, slots: list[tuple[str, int]]) -> None:
        """Ask for a rank process on each slot that has none, where its host is up; no wait."""
        for node, slot in slots:
            if self.process(node, slot) is None:
                self._fork(node, slot)

    def process(self, node: str, slot: int) -> RankProcess | None:
        """The live, idle rank process of a slot, if there is one."""
        proc = self._procs.get((node, slot))
        return proc if proc is not None and not proc.gone and not proc.busy else None

    def spawn(
        self, slots: list[tuple[str, int]], timeout_s: float
    ) -> dict[tuple[str, int], RankProcess]:
        """A live idle rank process for every (node, slot), forking where there is none."""
        need = [s for s in slots if self.process(*s) is None]
        hostless = [(n, s) for n, s in need if not self._fork(n, s)]
        if hostless:
            raise PoolError(f"no node host to fork rank processes on {hostless}", hostless)
        if not self.wait(lambda: all(self.process(*s) for s in need), timeout_s):
            missing = [(n, s) for n, s in need if self.process(n, s) is None]
            raise PoolError(f"rank processes did not start within {timeout_s:.0f}s", missing)
        return {s: p for s in slots if (p := self.process(*s)) is not None}

    def _fork(self, node: str, slot: int) -> bool:
        """Ask the node's host for a process on `slot`, once until it says hello; False when
        the node has no host."""
        host = self._hosts.get(node)
        if host is None or host.gone:
            return False
        if (node, slot) in self._forking:
            return True
        self._forking.add((node, slot))
        return host.conn.send(wire.Spawn(slot=slot))

    def run(self, proc: RankProcess, run: wire.Run) -> None:
        with self._cond:
            proc.generation, proc.rank, proc.ended, proc.ended_at = (
                run.generation,
                run.rank,
                None,
                None,
            )
            proc.runs += 1
        if not proc.conn.send(run):
            with self._cond:
                proc.gone_at = proc.gone_at or time.monotonic()

    def leave(self, proc: RankProcess, generation: int, at_once: bool = False) -> None:
        proc.conn.send(wire.Leave(generation=generation, at_once=at_once))

    def kill(self, proc: RankProcess) -> None:
        """Ask its node host to SIGKILL it (the connection's close says when it is gone)."""
        host = self._hosts.get(proc.node)
        if host is not None and not host.gone:
            host.conn.send(wire.Kill(slot=proc.slot))

    def retire(self, node: str) -> None:
        """Tell a node host, and every rank process on it, to end."""
        for proc in list(self._procs.values()):
            if proc.node == node and not proc.gone:
                proc.conn.send(wire.Exit())
        host = self._hosts.get(node)
        if host is not None and not host.gone:
            host.conn.send(wire.Exit())

    def close(self) -> None:
        for node in list(self._hosts):
            self.retire(node)
        self._closed = True
        self._thread.join(timeout=5)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()
