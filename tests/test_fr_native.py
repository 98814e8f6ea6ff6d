"""The flight-recorder dump that needs no GIL (trainer_hooks/fr_native.py).

A real rank process: a gloo process group with PyTorch's recorder on, a few collectives, the
helper armed on its FIFO; then its main thread enters a C call that holds the GIL
(`sum(range(2**62))`), which silences every Python thread of the process, the hooks' own dump
with them. A byte on the FIFO, as the node's agent writes for an `fr.dump`, still gets the
rank's dump and its sidecar, and the dump reads as the collectives the rank made.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sentinel.beacon import FR_DUMP, poke_fr
from sentinel.fr.dumps import load_dir

RANK = textwrap.dedent(
    """
    import os, sys, threading, time
    from pathlib import Path
    import torch, torch.distributed as dist
    from trainer_hooks.flight import FlightRecorder, enable_flight_recorder

    out, fifo, beat = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    enable_flight_recorder()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    fr = FlightRecorder(out, 0)
    assert fr.arm_native(fifo), "the helper did not start"

    def heartbeat():  # a Python thread: it stops while the main thread holds the GIL
        while True:
            beat.write_text(str(time.monotonic()))
            time.sleep(0.05)

    threading.Thread(target=heartbeat, daemon=True).start()
    time.sleep(0.3)
    print("holding", flush=True)
    sum(range(2**62))
    """
)


def test_a_rank_holding_the_gil_still_dumps_its_flight_recorder(tmp_path: Path) -> None:
    out, fifo, beat = tmp_path / "fr", tmp_path / "fr.fifo", tmp_path / "beat"
    env = {**os.environ, "SENTINEL_CACHE_DIR": str(tmp_path / "cache")}  # built here, afresh
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(out), str(fifo), str(beat)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert rank.stdout is not None
        assert rank.stdout.readline().strip() == "holding", rank.stderr and rank.stderr.read()
        time.sleep(0.5)
        held = beat.read_text()
        time.sleep(0.5)
        assert beat.read_text() == held, "the heartbeat thread still runs: the GIL is free"
        assert poke_fr(fifo, FR_DUMP, owner=os.getuid())
        sidecar = out / "sentinel_fr_meta.0.json"
        deadline = time.monotonic() + 10
        while not sidecar.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sidecar.exists(), "no dump within 10 s"
        assert rank.poll() is None and beat.read_text() == held  # still wedged, GIL held
        dumps = load_dir(out)
        assert dumps.sidecars[0]["reason"] == "fr.dump without the GIL (native)"
        summary = dumps.summaries[0]
        assert summary.entries >= 5 and not dumps.unreadable
    finally:
        rank.kill()
        rank.wait()


def test_no_helper_no_fifo_and_a_foreign_file_is_never_written(tmp_path: Path) -> None:
    """The agent's side: no reader, or not a FIFO the rank's user owns, and nothing is sent."""
    assert not poke_fr(tmp_path / "absent")
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert not poke_fr(plain) and plain.read_bytes() == b""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not poke_fr(fifo)  # nobody reads it
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert not poke_fr(fifo, owner=os.getuid() + 1)  # someone else's
        assert poke_fr(fifo, owner=os.getuid())
        assert os.read(reader, 8) == FR_DUMP
    finally:
        os.close(reader)
