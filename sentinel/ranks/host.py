"""`python -m sentinel.ranks.host --connect HOST:PORT --node NAME -- TRAINER_ARGV...`

A node host: one per node of the job and per hot spare, started once by the launcher (a local
process, or a Slurm step on its node). It imports the trainer's module (`-m MODULE` in
TRAINER_ARGV: torch and everything the trainer imports come with it), connects to the
supervisor's rank pool, and then forks a rank process (`sentinel.ranks.rank`) for a slot when
the pool asks, kills one when the pool asks, and reports every rank process that ends.

A fork from this process starts with the interpreter up and the trainer imported: a new rank
process costs milliseconds, not the seconds of an interpreter start and a torch import. The host
itself never runs torch work and starts no thread, so forking from it is safe; a forked rank
process dies with its host (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import os
import selectors
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sentinel.processes import fork_child
from sentinel.ranks import rank, wire

_PR_SET_PDEATHSIG = 1


def trainer_module(argv: Sequence[str]) -> tuple[str | None, str, list[str]]:
    """(interpreter or None, module, its arguments) from `[python] -m MODULE ARGS...`;
    ValueError for any other command."""
    args = list(argv)
    interpreter = args.pop(0) if args and not args[0].startswith("-") else None
    if len(args) < 2 or args[0] != "-m":
        raise ValueError(
            "warm ranks run a trainer given as `python -m MODULE ARGS...` whose MODULE.main(argv) "
            f"can be called once per generation; got {' '.join(argv)!r}"
        )
    return interpreter, args[1], args[2:]


@dataclass(frozen=True)
class HostCommand:
    """A node host's command: `python -m sentinel.ranks.host --connect ADDR --node NAME -- TRAINER`."""

    python: str
    connect: str  # the rank pool's address
    node: str
    trainer: list[str]  # `[python] -m MODULE ARGS...`

    def argv(self) -> list[str]:
        head = [self.python, "-m", "sentinel.ranks.host"]
        return [*head, "--connect", self.connect, "--node", self.node, "--", *self.trainer]


def die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def import_trainer(module: str) -> None:
    """Import the trainer's module: the cost every fork from here no longer pays."""
    importlib.import_module(module)
    # What the imports made lives as long as the process: out of the collector's sight, a
    # full collection in a rank process (after each generation) scans only what it made, and
    # the pages a fork shares stay shared (the collector no longer writes to them).
    gc.freeze()


class NodeHost:
    def __init__(
        self, address: str, secret: str, node: str, trainer: tuple[str, list[str]]
    ) -> None:
        self.address, self.secret, self.node, self.trainer = address, secret, node, trainer
        self.children: dict[int, int] = {}  # pid -> slot
        self.sock = wire.connect(address)
        self.sock.sendall(wire.encode(wire.Hello(secret=secret, node=node, pid=os.getpid())))

    def _fork(self, slot: int) -> None:
        self.children[fork_child(lambda: self._rank_process(slot))] = slot

    def _rank_process(self, slot: int) -> int:
        """In the forked child: none of the host's state but its imports, then the rank loop."""
        self.sock.close()
        signal.set_wakeup_fd(-1)
        die_with_parent()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        env = dict(os.environ)
        return rank.serve(self.address, self.secret, self.node, slot, env, self.trainer)

    def _kill(self, slot: int) -> None:
        for pid, s in self.children.items():
            if s == slot:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.children.pop(pid, None)
            if slot is not None:
                code = os.waitstatus_to_exitcode(status)
                self.sock.sendall(wire.encode(wire.Exited(slot=slot, pid=pid, code=code)))

    def _handle(self, message: wire.Spawn | wire.Kill | wire.Run | wire.Leave | wire.Exit) -> bool:
        """False once the host should end."""
        if isinstance(message, wire.Spawn):
            self._fork(message.slot)
        elif isinstance(message, wire.Kill):
            self._kill(message.slot)
        elif isinstance(message, wire.Exit):
            return False
        return True

    def serve(self) -> int:
        wake_r, wake_w = os.pipe()  # SIGCHLD wakes the selector: children are reaped at once
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, "pool")
        sel.register(wake_r, selectors.EVENT_READ, "child")
        reader, running = wire.LineReader(), True
        try:
            while running:
                for key, _ in sel.select(timeout=1.0):
                    if key.data == "child":
                        os.read(wake_r, 4096)
                        continue
                    data = self.sock.recv(65536)
                    if not data:  # the supervisor is gone
                        running = False
                        break
                    for line in reader.feed(data):
                        running = self._handle(wire.decode_from_pool(line)) and running
                self._reap()
        finally:
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._reap()
        return 0


def trainer_after_dashes(remainder: list[str]) -> tuple[str, list[str]]:
    """(module, its arguments) from a command line's `-- TRAINER_ARGV...`; ValueError for a
    trainer that is not `[python] -m MODULE ARGS...`."""
    _, module, args = trainer_module(remainder[1:] if remainder[:1] == ["--"] else remainder)
    return module, args


def run_host(connect: str, secret: str, node: str, module: str, args: list[str]) -> int:
    """Be `node`'s host until the pool is gone (the trainer imported already)."""
    try:
        host = NodeHost(connect, secret, node, (module, args))
    except OSError as e:
        print(f"error: cannot reach the rank pool at {connect}: {e}", file=sys.stderr)
        return 1
    return host.serve()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sentinel.ranks.host", description=__doc__)
    p.add_argument("--connect", required=True, metavar="HOST:PORT", help="the rank pool")
    p.add_argument("--node", required=True, help="this node's name in the job")
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="-- TRAINER_ARGV...")
    ns = p.parse_args(argv)
    secret = os.environ.pop(wire.SECRET_ENV, "")
    if not secret:
        print(f"error: {wire.SECRET_ENV} is not set", file=sys.stderr)
        return 2
    try:
        module, args = trainer_after_dashes(ns.trainer)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import_trainer(module)
    return run_host(ns.connect, secret, ns.node, module, args)


if __name__ == "__main__":
    sys.exit(main())
