"""The kernel log watcher: host faults NVML does not report, read from /dev/kmsg.

/dev/kmsg gives one record per read, `PRI,SEQ,USEC,FLAGS;message` (continuation lines start with
a space). Tests point the watcher at a regular file or a FIFO holding the same records. Reading
is non-blocking and bounded per poll, from the log's end at start (records from before the agent
started are history, not news).

What it finds:
- `NVRM: Xid (PCI:0000:18:00): 79, ...` -> an XID for the GPU on that bus, deduplicated against
  the NVML event API by `XidPairing` (each source's report pairs with one of the other's);
- a read-only remount (ext4, btrfs) or shutdown (xfs) of the root or a checkpoint filesystem;
- machine-check errors, fatal PCIe AER errors, hung-task warnings.
A line that is not a kmsg record, or an NVRM Xid line that cannot be read, is counted as
garbage and reported `unknown_signal`; it never stops the watcher.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sentinel.agent.health.node_rules import Report

log = logging.getLogger("sentinel.agent.health.kmsg")

MAX_RECORDS_PER_POLL = 4096
# The last records read, kept for an incident's node evidence (agent/uplink/evidence.py): a
# reboot or a reset is about to lose the kernel's ring, and its lines around a fault are what a
# person reads first. Bounded in lines and in bytes per line (a kmsg record is 1 KiB at most).
TAIL_LINES = 200
TAIL_LINE_BYTES = 1024
_RECORD = re.compile(rb"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+)\b")
_READ_ONLY = (
    re.compile(r"EXT4-fs \(([^)]+)\): Remounting filesystem read-only"),
    re.compile(r"BTRFS[^(]*\(device ([^)]+)\).*forced readonly"),
    re.compile(r"XFS \(([^)]+)\):.*(?:[Ss]hutting down filesystem|Filesystem has been shut down)"),
)
_HOST = (
    ("machine_check", re.compile(r"\[Hardware Error\]|Machine check events logged")),
    ("pcie_aer_fatal", re.compile(r"AER: .*Uncorrect(?:ed|able) \(Fatal\)")),
    ("hung_task", re.compile(r"INFO: task \S+:\d+ blocked for more than \d+ seconds")),
)

# What only the kernel log tells: its rules, and the kernel's own Xid lines beside NVML's.
RULES = ("fs_read_only", *(rule for rule, _ in _HOST))


@dataclass(frozen=True, slots=True)
class KernelXid:
    pci_bus_id: str  # "0000:18:00", the domain cut to four digits as the kernel prints it
    xid: int
    line: str


def normal_bus_id(bus_id: str) -> str:
    """ "00000000:18:00.0" (NVML) and "0000:18:00" (NVRM) name the same device."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest.split('.')[0]}"


def watched_devices(mounts_file: Path, dirs: Iterable[Path]) -> dict[str, str]:
    """Kernel device name -> the watched directory whose filesystem it holds."""
    try:
        mounts = [line.split()[:2] for line in mounts_file.read_text().splitlines()]
    except OSError as e:
        log.warning("cannot read %s (%s): read-only remounts are not watched", mounts_file, e)
        return {}
    out: dict[str, str] = {}
    for d in dirs:
        target = str(d.resolve()) if d.exists() else str(d)
        best = max(
            (m for m in mounts if len(m) == 2 and _under(target, m[1])),
            key=lambda m: len(m[1]),
            default=None,
        )
        if best is None:
            continue
        source = best[0]
        for name in {Path(source).name, Path(os.path.realpath(source)).name}:
            out[name] = str(d)
    return out


def _under(path: str, mountpoint: str) -> bool:
    return path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")


class KernelLog:
    def __init__(
        self, path: Path, watched: dict[str, str] | None = None, from_start: bool = False
    ) -> None:
        self.path = path
        self.watched = watched or {}
        self.records = 0
        self.garbage: Counter[str] = Counter()  # why lines could not be read
        # why the last poll could not read the log, None when it could: the agent's source
        # state (health/sources.py) logs and exports it, once a change
        self.problem: str | None = None
        self._fd: int | None = None
        self._tail = b""  # a record not yet ended by its newline
        self._from_start = from_start
        self.recent: deque[str] = deque(maxlen=TAIL_LINES)  # records read, as they came

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                self.problem = f"cannot open {self.path}: {e.strerror or e}"
                return None
            if not self._from_start:
                with contextlib.suppress(OSError):  # a FIFO: nothing to skip
                    os.lseek(self._fd, 0, os.SEEK_END)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read_chunks(self) -> list[bytes]:
        self.problem = None
        fd = self._open()
        chunks: list[bytes] = []
        while fd is not None and len(chunks) < MAX_RECORDS_PER_POLL:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # /dev/kmsg: records overwritten before we read
                    self.garbage["overrun"] += 1
                    continue
                self.problem = f"cannot read {self.path}: {e.strerror or e}"
                self.close()  # opened again at the next poll
                break
            if not data:
                break
            chunks.append(data)
        return chunks

    def poll(self) -> tuple[list[KernelXid], list[Report]]:
        """What the log said since the last poll."""
        data = self._tail + b"".join(self._read_chunks())
        *lines, self._tail = data.split(b"\n")
        xids: list[KernelXid] = []
        reports: list[Report] = []
        for raw in lines:
            self._line(raw, xids, reports)
        return xids, reports

    def _line(self, raw: bytes, xids: list[KernelXid], reports: list[Report]) -> None:
        if not raw.strip() or raw.startswith(b" "):  # blank, or a record's KEY=value line
            return
        self.recent.append(raw[:TAIL_LINE_BYTES].decode("utf-8", "replace"))
        m = _RECORD.match(raw)
        if m is None:
            self._garbage("not a kmsg record", raw, reports)
            return
        self.records += 1
        text = m.group(4).decode("utf-8", "replace")
        if "NVRM: Xid" in text:
            x = _XID.search(text)
            if x is None:
                self._garbage("unreadable NVRM Xid line", raw, reports)
            else:
                xids.append(KernelXid(normal_bus_id(x.group(1)), int(x.group(2)), text))
            return
        for pattern in _READ_ONLY:
            ro = pattern.search(text)
            if ro and ro.group(1) in self.watched:
                where = self.watched[ro.group(1)]
                reports.append(Report("fs_read_only", f"{where} ({ro.group(1)}): {text}"))
                return
        for rule, pattern in _HOST:
            if pattern.search(text):
                reports.append(Report(rule, text[:200]))
                return

    def _garbage(self, why: str, raw: bytes, reports: list[Report]) -> None:
        self.garbage[why] += 1
        shown = raw[:80].decode("utf-8", "replace")
        reports.append(Report("unknown_signal", f"kernel log: {why}: {shown!r}"))


class XidPairing:
    """One XID reported by both NVML and the kernel log counts once.

    Each report from one source pairs with an unpaired report of the same (gpu, xid) from the
    other source within `window_s`; only unpaired reports are new. Repeats stay repeats: three
    XID 13 from NVML and three from the kernel log are three XIDs, not one or six.
    """

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._unpaired: dict[tuple[str, int, int], deque[float]] = {}
        self.paired = 0

    def admit(self, source: str, gpu: int, xid: int, now: float) -> bool:
        other = "kmsg" if source == "nvml" else "nvml"
        waiting = self._recent((other, gpu, xid), now)
        if waiting:
            waiting.popleft()
            self.paired += 1
            return False
        self._recent((source, gpu, xid), now).append(now)
        return True

    def _recent(self, key: tuple[str, int, int], now: float) -> deque[float]:
        """The key's unpaired reports within the window (older ones can no longer pair)."""
        waiting = self._unpaired.setdefault(key, deque())
        while waiting and waiting[0] < now - self.window_s:
            waiting.popleft()
        return waiting
