"""PyTorch's flight recorder: turned on, dumped in PyTorch's own format, plus a sidecar.

The recorder keeps the last N collectives of every process group in a ring buffer
(`TORCH_FR_BUFFER_SIZE=N`, read when a process group is created, so it must be set before
`init_process_group`: call `enable_flight_recorder()` first or export it in the launcher).
`FlightRecorder.dump()` writes `torch._C._distributed_c10d._dump_fr_trace(...)`'s pickle,
one file per rank named `<prefix><rank>` — the layout `python -m
torch.distributed.flight_recorder.fr_trace DIR` reads — and next to it a JSON sidecar
`sentinel_fr_meta.<rank>.json` with what the dump lacks: gloo dumps carry an empty `pg_config`,
so the sidecar lists the global ranks of every process group this rank belongs to, plus job,
node, step and why the dump was taken.

The recorder's ring buffer is process-wide and outlives process groups. In a warm rank process,
which runs one gang generation after another (`sentinel.ranks`), it also holds the entries of
earlier generations, whose process groups had the same names and sequence numbers: a dump leaves
them out, keeping only what the current generation recorded.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel.protocol import WITH_STACKS_SUFFIX
from sentinel.ranks.current import began_ns
from trainer_hooks.fr_native import NativeDumper, library

log = logging.getLogger("trainer_hooks.flight")

DEFAULT_BUFFER = 2000
DEFAULT_PREFIX = "fr_trace_rank_"
SIDECAR_FMT = "sentinel_fr_meta.{rank}.json"
FATAL_SIGNALS = (signal.SIGTERM,)


def enable_flight_recorder(buffer_size: int = DEFAULT_BUFFER) -> None:
    """Turn the recorder on for process groups created from now on (keeps an explicit setting)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(buffer_size))


def recorder_enabled() -> bool:
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    return size is not None and size.strip().isdigit() and int(size) > 0


def process_groups() -> dict[str, dict[str, Any]]:
    """{pg name: {"desc", "ranks": [global ranks]}} for the groups this rank belongs to."""
    from torch.distributed import distributed_c10d as c10d

    out: dict[str, dict[str, Any]] = {}
    world = c10d._world
    for pg, name in world.pg_names.items():
        ranks = world.pg_group_ranks.get(pg, {})
        desc = getattr(pg, "group_desc", "") or ""
        out[str(name)] = {"desc": desc, "ranks": sorted(int(r) for r in ranks)}
    return out


class FlightRecorder:
    def __init__(
        self,
        dump_dir: str | Path,
        rank: int,
        *,
        prefix: str = DEFAULT_PREFIX,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.dump_dir = Path(dump_dir)
        self.rank = rank
        self.prefix = prefix
        self.meta = dict(meta or {})
        self._lock = threading.Lock()
        self.dumps = 0
        self._native: NativeDumper | None = None

    @property
    def path(self) -> Path:
        return self.dump_dir / f"{self.prefix}{self.rank}"

    @property
    def stacks_path(self) -> Path:
        """The dump with stack traces, beside the plain one (`sentinel fr analyze` reads the
        plain one; a person reads where each collective was issued from here)."""
        return self.path.with_name(self.path.name + WITH_STACKS_SUFFIX)

    def dump(
        self, reason: str, step: int | None = None, with_stacks: bool = False
    ) -> tuple[Path, int]:
        """Write this rank's buffer and sidecar; returns (dump path, number of entries).
        `with_stacks`: each entry with the stack it was issued from, into `stacks_path` and no
        sidecar (the plain dump's describes the rank). Symbolizing those stacks needs the GIL
        and may take long: a caller that must not wait runs it on a thread of its own."""
        import pickle

        import torch

        raw = torch._C._distributed_c10d._dump_fr_trace(  # type: ignore[attr-defined]
            includeCollectives=True, includeStackTraces=with_stacks, onlyActive=False
        )
        trace = pickle.loads(raw)  # our own bytes, just produced
        since = began_ns()
        if since is not None:  # a warm rank process: this generation's entries only
            trace["entries"] = [
                e for e in trace.get("entries", []) if e.get("time_created_ns", 0) >= since
            ]
            raw = pickle.dumps(trace)
        entries = len(trace.get("entries", []))
        with self._lock:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            if with_stacks:
                _atomic_write(self.stacks_path, raw)
                return self.stacks_path, entries
            _atomic_write(self.path, raw)
            _atomic_write(self.sidecar_path, self._sidecar(reason, step, time.time()).encode())
            self.dumps += 1
        return self.path, entries

    @property
    def sidecar_path(self) -> Path:
        return self.dump_dir / SIDECAR_FMT.format(rank=self.rank)

    def _sidecar(self, reason: str, step: int | None, at: float | None) -> str:
        # `since_ns`: a warm rank process's recorder still holds earlier generations' entries;
        # a reader keeps those created since (the Python dump has left them out already, the
        # native one cannot).
        return json.dumps(
            {
                "format": "sentinel-fr-sidecar/1",
                "rank": self.rank,
                "dump_file": self.path.name,
                "reason": reason,
                "step": step,
                "time": at,
                "since_ns": began_ns(),
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "process_groups": process_groups(),
                **self.meta,
            }
        )

    def arm_native(self, fifo: Path) -> bool:
        """Start the dump that needs no GIL (trainer_hooks/fr_native.py), taking requests on
        `fifo`; False where this rank goes without it (said once, or here)."""
        if library() is None:
            return False
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        # Written as prepared now, once the helper's dump has landed: the process groups the
        # rank belongs to do not change within a generation; the step and the time of a dump
        # the rank's Python cannot see are left unsaid.
        sidecar = self._sidecar("fr.dump without the GIL (native)", None, None)
        try:
            self._native = NativeDumper(fifo, self.path, self.sidecar_path, sidecar)
        except OSError as e:
            log.warning("no GIL-free flight-recorder dump in this rank: %s", e)
            return False
        return True

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class SignalDumper:
    """Dump the recorder when the process gets SIGTERM, even if the main thread is stuck in C++.

    Python runs signal handlers on the main thread between bytecodes, which never happens while
    it waits inside a collective. So the C-level handler's wakeup byte (`signal.set_wakeup_fd`)
    is read by a small thread that dumps at once; then the process ends as SIGTERM would have
    ended it (the previous handler runs if there was one). Installed only from the main thread
    and only if no one else uses the wakeup fd (asyncio does).
    """

    def __init__(self, dump: Callable[[str], None], grace_s: float = 2.0) -> None:
        self._dump = dump
        self._grace_s = grace_s
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        self.installed = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if old != -1:
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return False
        for sig in FATAL_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous[sig] = signal.signal(sig, self._on_main_thread)
        threading.Thread(
            target=self._watch, args=(r,), name="sentinel-signals", daemon=True
        ).start()
        self.installed = True
        return True

    def _dump_once(self, signum: int) -> None:
        # The watcher thread and the main thread's handler can both get here. The second waits
        # for the first's dump to be written: ending the process mid-dump would lose it.
        if not self._lock.acquire(timeout=30):
            return
        try:
            if not self._done.is_set():
                self._dump(f"signal:{signal.Signals(signum).name}")
        except Exception:
            log.exception("flight recorder dump on signal failed")
        finally:
            self._done.set()
            self._lock.release()

    def _watch(self, fd: int) -> None:
        while True:
            data = os.read(fd, 64)
            for signum in data:
                if signum in self._previous:
                    self._dump_once(signum)
                    time.sleep(self._grace_s)  # let the main thread's handler end the process
                    if not callable(self._previous[signum]):
                        os._exit(128 + signum)

    def _on_main_thread(self, signum: int, frame: Any) -> None:
        self._dump_once(signum)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
