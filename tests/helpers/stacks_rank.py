"""A rank of a small gloo gang with trainer hooks, parked where a test wants its stack.

`HANG_RANK=R`: rank R blocks in an all_reduce the others never join (`wait_in_collective`);
every other rank sleeps in Python (`wait_elsewhere`). `IGNORE_TERM=R[,R]`: those ranks ignore
SIGTERM (a trainer that traps it); `HANDLE_TERM=R[,R]`: they install a Python handler for it,
which never runs while the main thread is inside the collective. `ESCAPEE_RANK=R`: rank R
starts a helper in a session of its own that ignores SIGTERM (out of reach of a signal to the
rank's process group) and prints `escapee PID`. Each rank prints `ready RANK PID` once its hooks
are connected to the node's agent (or at once with no agent).
"""

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from trainer_hooks import SentinelHooks


def ranks_of(name: str) -> set[int]:
    return {int(r) for r in os.environ.get(name, "").split(",") if r.strip()}


def wait_in_collective() -> None:
    dist.all_reduce(torch.ones(4))  # the others never join: blocks in gloo, GIL released


def wait_elsewhere() -> None:
    while True:
        time.sleep(0.2)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank in ranks_of("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if rank in ranks_of("HANDLE_TERM"):
        signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM handled", flush=True))
    hooks = SentinelHooks.from_env()
    deadline = time.monotonic() + 60
    while os.environ.get("SENTINEL_AGENT_SOCKET") and not hooks.transport.connected:
        if time.monotonic() > deadline:
            sys.exit("no agent socket")
        time.sleep(0.05)
    if rank == int(os.environ.get("ESCAPEE_RANK", "-1")):
        helper = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        )
        escapee = subprocess.Popen([sys.executable, "-c", helper], start_new_session=True)
        print("escapee", escapee.pid, flush=True)
    dist.barrier()  # everyone connected before anyone parks
    print("ready", rank, os.getpid(), flush=True)
    if rank == int(os.environ.get("HANG_RANK", "-1")):
        wait_in_collective()
    else:
        wait_elsewhere()


if __name__ == "__main__":
    main()
