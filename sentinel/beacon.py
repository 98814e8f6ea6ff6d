"""A rank's beacon: its step counter in shared memory, read by its node's agent from outside.

The hooks' hang watchdog is a thread of the rank, so a rank stopped by the kernel (SIGSTOP, a
debugger, a frozen cgroup) or wedged in a C call that holds the GIL silences it too. The beacon
is a small file in /dev/shm that the rank writes at every step, a store into mapped memory with
no system call, and that the agent reads without the rank's cooperation
(`sentinel.agent.ranks.watch`): the last step, when it was made (CLOCK_MONOTONIC, one clock for
every process of the host), the rank's current hang timeout, whether its watchdog is paused (a
known long pause: a blocking checkpoint), and the last step whose stall the rank's own watchdog
reported. A sequence counter, odd while a write is under way, keeps a reader from taking a
torn record.

Standard library only (and `sentinel.processes`, which is too): the hooks import it into
every training process.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sentinel.processes import proc_stat

MAGIC = b"SNTB"
# magic, sequence, step, progress_at, timeout_s, reported step, paused
LAYOUT = struct.Struct("<4sIqddqI4x")
DIRECTORY = Path("/dev/shm")
NONE = -1  # no step yet / nothing reported


def beacon_path(pid: int, rank: int) -> Path:
    """Where the rank in process `pid` keeps its beacon: the agent checks a registration's
    path against the pid the kernel gives for its connection, so a rank names only its own."""
    return DIRECTORY / f"sentinel-beacon-{pid}-{rank}"


def fr_trigger_path(pid: int, rank: int) -> Path:
    """The FIFO on which the rank in process `pid` takes requests for a flight-recorder dump
    that needs no GIL (trainer_hooks/fr_native.py), beside its beacon."""
    return DIRECTORY / f"sentinel-fr-{pid}-{rank}"


FR_DUMP, FR_QUIT = b"d", b"q"  # the bytes a dump helper reads: dump now; end


def poke_fr(fifo: Path, what: bytes = FR_DUMP, owner: int | None = None) -> bool:
    """Write one byte to a rank's dump FIFO without waiting: True if a helper was there to
    read it. `owner`: the uid the FIFO must belong to (the agent passes the rank's), so a file
    someone else put at the path is never written."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # ENXIO: nobody reads it; ENOENT: no helper in that rank
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or (owner is not None and st.st_uid != owner):
            return False
        return os.write(fd, what) == 1
    except BlockingIOError:  # its buffer is full of requests not yet read: a dump is coming
        return True
    finally:
        os.close(fd)


@dataclass(frozen=True)
class BeaconState:
    step: int  # NONE before the first step
    progress_at: float  # time.monotonic() of the last progress (or of the beacon's creation)
    timeout_s: float  # the rank's hang timeout now
    reported: int  # the step whose stall the rank's own watchdog reported (NONE: none)
    paused: bool


class Beacon:
    """The rank's side: creates the file, writes every change, removes it at close."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.ftruncate(fd, LAYOUT.size)
            self._map = mmap.mmap(fd, LAYOUT.size)
        finally:
            os.close(fd)
        self._lock = threading.Lock()  # one writer at a time: the step's thread, the watchdog's
        self._seq = 0
        self._state = BeaconState(NONE, time.monotonic(), timeout_s, NONE, False)
        self._write()

    def progress(self, step: int, timeout_s: float) -> None:
        with self._lock:
            self._state = BeaconState(step, time.monotonic(), timeout_s, NONE, self._state.paused)
            self._write()

    def pause(self, paused: bool) -> None:
        """A known long pause begins (True) or ends (False: the stall clock starts again)."""
        with self._lock:
            s = self._state
            self._state = BeaconState(s.step, time.monotonic(), s.timeout_s, s.reported, paused)
            self._write()

    def reported(self, step: int | None) -> None:
        """The rank's own watchdog reported this stall: the agent need not."""
        with self._lock:
            s = self._state
            reported = NONE if step is None else step
            self._state = BeaconState(s.step, s.progress_at, s.timeout_s, reported, s.paused)
            self._write()

    def close(self) -> None:
        with self._lock:
            self._map.close()
            self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        s = self._state
        self._seq += 1  # odd: a write is under way
        struct.pack_into("<4sI", self._map, 0, MAGIC, self._seq)
        body = (s.step, s.progress_at, s.timeout_s, s.reported, int(s.paused))
        LAYOUT.pack_into(self._map, 0, MAGIC, self._seq, *body)
        self._seq += 1
        struct.pack_into("<4sI", self._map, 0, MAGIC, self._seq)


def read_beacon(path: Path, owner_uid: int | None = None) -> BeaconState | None:
    """The beacon's record; None when it is not a beacon: a missing file, a link, not a regular
    file of the beacon's size, not owned by `owner_uid` (the connecting rank's user), a bad
    magic, or a record still being written after a few tries."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != LAYOUT.size:
            return None
        if owner_uid is not None and st.st_uid != owner_uid:
            return None
        for _ in range(5):
            raw = os.pread(fd, LAYOUT.size, 0)
            if len(raw) != LAYOUT.size:
                return None
            magic, seq, step, at, timeout_s, reported, paused = LAYOUT.unpack(raw)
            if magic != MAGIC:
                return None
            if seq % 2 == 0 and struct.unpack_from("<I", os.pread(fd, 8, 0), 4)[0] == seq:
                return BeaconState(step, at, timeout_s, reported, bool(paused))
        return None
    finally:
        os.close(fd)


_LEFT = re.compile(r"^sentinel-(?:beacon|fr)-(\d+)-\d+$")


def _exited(pid: int) -> bool:
    """Process `pid` is gone, or a zombie waiting for its parent."""
    found = proc_stat(pid)
    return found is None or found[1] in ("Z", "X")


def remove_leftovers(directory: Path = DIRECTORY) -> list[Path]:
    """Remove the beacons and dump FIFOs that this user's rank processes left when they died
    without closing their hooks (SIGKILL, the OOM killer): a new rank does it as it opens its
    own beacon. Only files of the kind a rank makes, that this user owns (in a sticky /dev/shm
    only they or root may remove them: the node's agent, another user, could not), whose
    process has exited. Returns what was removed."""
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _LEFT.match(name)
        if m is None:
            continue
        path = directory / name
        try:
            st = os.lstat(path)
            made = stat.S_ISFIFO if name.startswith("sentinel-fr-") else stat.S_ISREG
            if made(st.st_mode) and st.st_uid == os.getuid() and _exited(int(m[1])):
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
