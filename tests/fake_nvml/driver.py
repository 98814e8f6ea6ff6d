"""Run NvmlBackend in this process and answer one JSON line per command read from stdin.

Commands: `sweep` (readings), `fingerprint` (the node's NVML configuration fingerprint), `xids`
(drained XID events and how long draining took), `errors` (the backend's failed-read counters
and unsupported fields), `calls` (how many times the backend called each NVML function, by the
name its deadline watch gives the call), `pynvml` (the file the backend's pynvml came from). End
of input closes the backend. Started by `fake_nvml.BackendProcess` with LD_LIBRARY_PATH pointing
at the fake library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter

import pynvml

from sentinel.agent.nvml.backend import NvmlBackend, NvmlUnavailable
from sentinel.agent.nvml.deadline import CallWatch
from sentinel.logs import setup_logging

CALLS: Counter[str] = Counter()


def count_watched_calls() -> None:
    """Count every NVML call the backend makes where its deadline watch sees it begin: the
    pynvml calls and the ones made past pynvml (the field batch, the process list) alike."""
    begin = CallWatch.begin

    def counted(watch: CallWatch, name: str) -> None:
        CALLS[name] += 1
        begin(watch, name)

    CallWatch.begin = counted  # type: ignore[method-assign]


def answer(backend: NvmlBackend, command: str) -> dict[str, object]:
    if command == "sweep":
        return {"readings": [dataclasses.asdict(r) for r in backend.sweep()]}
    if command == "fingerprint":
        return {"fingerprint": backend.fingerprint()}
    if command == "xids":
        start = time.perf_counter()
        xids = backend.drain_xids()
        elapsed_ms = (time.perf_counter() - start) * 1000
        return {"xids": [dataclasses.asdict(x) for x in xids], "ms": elapsed_ms}
    if command.startswith("urgent "):
        return {"urgent": backend.urgent(float(command.split()[1]))}
    if command == "errors":
        unsupported = [sorted(backend.unsupported(i)) for i in range(backend.gpu_count())]
        return {"errors": dict(backend.errors), "unsupported": unsupported}
    if command == "calls":
        return {"calls": dict(CALLS)}
    if command == "pynvml":
        return {"pynvml": pynvml.__file__}
    return {"unknown_command": command}


def main() -> int:
    setup_logging("json", "INFO")
    count_watched_calls()
    try:
        # Every reading every sweep unless a test asks for the agent's cadence of costly ones.
        backend = NvmlBackend(slow_every_s=float(os.environ.get("FAKE_DRIVER_SLOW_EVERY_S", "0")))
    except NvmlUnavailable as exc:
        print(json.dumps({"unavailable": str(exc)}), flush=True)
        return 0
    print(json.dumps({"gpus": backend.gpu_count()}), flush=True)
    with backend:
        for line in sys.stdin:
            print(json.dumps(answer(backend, line.strip())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
