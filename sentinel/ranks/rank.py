"""A warm rank process: one GPU slot's process, alive across gang generations.

Forked by its node host with the trainer's modules already imported, it connects to the pool,
says hello with its node and slot, and then, for every `Run`, becomes that generation's rank:
the environment the supervisor sent (RANK, WORLD_SIZE, MASTER_ADDR, ... and the job's own), its
output in the generation's log, and the trainer module's `main(argv)` called in process. When
`main` returns it reports `Ended` and waits for the next generation. A `Leave` for the running
generation is handed to the trainer through `sentinel.ranks.current`; an `Exit` ends the
process, as does the loss of the pool (the supervisor is gone).

Whether a process that ended with an error is used again is the supervisor's decision: it sees
every rank of the generation, and only it can tell an error of this rank's own from one caused
by a peer that died (a collective failing with "connection closed"). A process it does not
trust again is killed by its node host and replaced with a new fork.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel.processes import redirect_output
from sentinel.ranks import current, wire

Main = Callable[[list[str]], Any]


def cut_connections(keep: socket.socket) -> int:
    """Shut down every connected TCP socket of this process but `keep` (the pool's); return
    how many. These are the generation's: the collectives' links to its peers and its
    rendezvous store's clients. A peer blocked in a collective on this rank then reads the end
    of the stream and fails at once, and so does this rank if it is blocked on a peer.

    Why by hand: a gloo process group's `abort()` does not close its links, and destroying it
    waits for work still pending on them; only a socket's end reaches a waiting peer (as when a
    process dies). NCCL's abort does end its work; its bootstrap links are TCP and cut here too.
    Listening sockets and Unix sockets (the node agent's) are left alone."""
    cut = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == keep.fileno():
            continue
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                sock.getpeername()  # connected, not listening
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:
                continue
    return cut


# How a collective reports that the other end of one of its links is gone: gloo's TCP pairs
# ("Connection closed by peer", a reset, a peer's read timeout), NCCL after its communicator was
# aborted, and the rendezvous store's client. Matched anywhere in the exception's chain (the
# pipeline schedule wraps a stage's error in its own).
_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "gloo/transport/tcp",
    "NCCL communicator was aborted",
    "Broken pipe",
)


def peer_lost(error: BaseException) -> bool:
    """The error ended a generation because a link to a peer ended, not through a fault of
    this rank's own (a bug, a bad batch, an injected crash)."""
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in ("DistNetworkError", "DistBackendError") or any(
            marker in str(exc) for marker in _PEER_LOST
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# A rank waits for rank 0's rendezvous store to listen before it starts its own rendezvous,
# trying this often, for at most this long (then the trainer's rendezvous, with its own
# timeout, is left to wait).
STORE_PROBE_EVERY_S = 0.01
STORE_PROBE_WITHIN_S = 60.0


def wait_for_store(env: dict[str, str]) -> None:
    """Until rank 0's TCP store (MASTER_ADDR:MASTER_PORT) accepts a connection, or the
    generation is asked to leave. PyTorch's store client tries a refused connection again only
    after a backoff of about half a second, and the ranks of a warm generation start within
    milliseconds of each other in no set order: measured, rank 0 starting 0.1 s after its peers
    made every rank's rendezvous take 0.75 s instead of 0.12. A probe every 10 ms starts the
    rendezvous as the store opens. Rank 0 makes the store; a trainer that meets its peers
    another way has no MASTER_ADDR and MASTER_PORT."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if env.get("RANK", "0") == "0" or not addr or not port.isdigit():
        return
    deadline = time.monotonic() + STORE_PROBE_WITHIN_S
    while time.monotonic() < deadline and not current.leave_requested():
        try:
            socket.create_connection((addr, int(port)), timeout=1.0).close()
            return
        except OSError:
            time.sleep(STORE_PROBE_EVERY_S)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    return value if isinstance(value, int) else 1


def run_generation(run: wire.Run, base_env: dict[str, str], pool: socket.socket) -> wire.Ended:
    """Run the trainer's main for one generation, in process; never raises. A generation that
    ended in an error has its connections cut (`cut_connections`): every peer still waiting on
    this rank learns at once, and the failure spreads through the gang in milliseconds."""
    os.environ.clear()
    os.environ.update({**base_env, **run.env})
    if run.log is not None:
        redirect_output(Path(run.log))
    current.begin(run.generation)
    wait_for_store(run.env)
    if current.leave_requested():  # asked to leave before it began: nothing of it to run
        current.end()
        return wire.Ended(generation=run.generation, code=0, left=True)
    error, lost = None, False
    try:
        main: Main = importlib.import_module(run.module).main
        code = _exit_code(main(list(run.argv)))
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # the rank's own failure, or a peer's: the pool decides
        traceback.print_exc()
        code, error, lost = 1, f"{type(e).__name__}: {e}"[:2000], peer_lost(e)
        cut_connections(pool)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    left = current.leave_requested()
    current.end()
    return wire.Ended(generation=run.generation, code=code, left=left, error=error, peer_lost=lost)


# After an at-once leave: how often the generation's connections are cut again while it still
# runs, and when its stacks go to its log if it has not ended (the supervisor kills a rank that
# has not left within `supervisor.leave_grace_s`, 2 s by default).
RECUT_EVERY_S = 0.2
STACKS_AFTER_S = 1.0


def hold_cut(keep: socket.socket, generation: int) -> None:
    """Until `generation` ends, cut the connections it opens after an at-once leave: a rank
    that was connecting (its rendezvous store, a new process group's links) when the first
    cut came would otherwise wait on a dead peer until a timeout of minutes. A generation
    still running after STACKS_AFTER_S writes every thread's stack to its log, so a rank the
    supervisor has to kill leaves the evidence of where it was."""
    began = time.monotonic()
    dumped = False
    while current.generation() == generation:
        time.sleep(RECUT_EVERY_S)
        if current.generation() != generation:
            return
        cut_connections(keep)
        if not dumped and time.monotonic() - began >= STACKS_AFTER_S:
            dumped = True
            said = (
                f"generation {generation} still running {STACKS_AFTER_S:g} s after an at-once leave"
            )
            print(f"rank process: {said}; its stacks:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


class _Inbox:
    """The pool's messages, read on a thread of their own so that a `Leave` reaches the
    trainer while `main` runs on the main thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.runs: queue.Queue[wire.Run | None] = queue.Queue()  # None: end the process
        threading.Thread(target=self._read, name="sentinel-rank-inbox", daemon=True).start()

    def _read(self) -> None:
        reader = wire.LineReader()
        try:
            while (lines := wire.read_lines(self.sock, reader)) is not None:
                for line in lines:
                    message = wire.decode_from_pool(line)
                    if isinstance(message, wire.Run):
                        self.runs.put(message)
                    elif isinstance(message, wire.Leave):
                        current.request_leave(message.generation)
                        if message.at_once and current.generation() == message.generation:
                            cut_connections(self.sock)
                            threading.Thread(
                                target=hold_cut,
                                args=(self.sock, message.generation),
                                name="sentinel-rank-cut",
                                daemon=True,
                            ).start()
                    elif isinstance(message, wire.Exit):
                        self.runs.put(None)
                        return
        except (OSError, wire.WireError) as e:
            print(f"rank process: the pool's connection failed: {e}", file=sys.stderr)
        self.runs.put(None)  # the supervisor is gone: nothing will ask this process again
        # A generation still running would never be told to leave: end the process with it.
        os._exit(0 if current.generation() is None else 1)


def prepare(module: str, args: list[str]) -> None:
    """Let the trainer build ahead what it can before it knows its rank (`MODULE.prepare(argv)`,
    if it has one: the reference trainer builds its model), so that a spare joining later finds
    it ready (`sentinel.ranks.current.take_prepared`). A failure costs only the head start."""
    ready = getattr(importlib.import_module(module), "prepare", None)
    if ready is None:
        return
    try:
        current.set_prepared(ready(list(args)))
    except Exception as e:  # the generation builds it itself
        print(f"rank process: {module}.prepare failed: {e!r}", file=sys.stderr)


def serve(
    address: str,
    secret: str,
    node: str,
    slot: int,
    base_env: dict[str, str],
    trainer: tuple[str, list[str]] | None = None,
) -> int:
    """The rank process's life: hello, then one generation per `Run` until `Exit`. `trainer`
    (module, arguments): what it will run, to prepare while it waits for its first rank."""
    sock = wire.connect(address)
    sock.sendall(wire.encode(wire.Hello(secret=secret, node=node, pid=os.getpid(), slot=slot)))
    inbox = _Inbox(sock)
    if trainer is not None:
        prepare(*trainer)
    while (run := inbox.runs.get()) is not None:
        ended = run_generation(run, base_env, sock)
        sock.sendall(wire.encode(ended))
        # The generation's model, optimizer and process groups, before the next; after the
        # report, so that a rank leaving a broken generation is not held up by a collection.
        gc.collect()
    return 0
