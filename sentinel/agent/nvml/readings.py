"""What one collection sweep reads from a GPU, and the backend seam every GPU source implements.

A field is `None` when the GPU (or driver) does not support it: one unsupported field is one
missing field, never a failed sweep. A GPU that has fallen off the bus reads as `lost=True`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentinel.agent.nvml.deadline import Stall


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False  # the GPU stopped answering (NVML_ERROR_GPU_IS_LOST): fallen off the bus

    temp_gpu_c: float | None = None
    temp_mem_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = None  # total energy since driver load, millijoules
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    util_gpu_pct: int | None = None
    util_mem_pct: int | None = None
    fb_used_bytes: int | None = None
    fb_free_bytes: int | None = None
    fb_total_bytes: int | None = None

    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    throttle_reasons: int | None = None  # NVML clocks-event-reasons bitmask
    pcie_replay_count: int | None = None
    nvlink_crc_errors: int | None = None  # summed over links: flit + data CRC
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    tensor_active: float | None = None  # GPM tensor-pipe activity, 0..1 (Hopper and later)
    nvlink_links_down: tuple[int, ...] | None = None  # links active at start, inactive now
    recovery_action: int | None = None  # nvmlDeviceGpuRecoveryAction_t the driver requests
    reset_required: bool | None = None  # a call answered RESET_REQUIRED, or the action says so

    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu: int
    xid: int
    uuid: str | None = None
    ts: float = 0.0


@dataclass(slots=True)
class Sweep:
    """One pass over every GPU: the readings and the XIDs that arrived since the last pass."""

    readings: list[GpuReading]
    xids: list[XidEvent] = field(default_factory=list)
    duration_s: float = 0.0


class GpuBackend(abc.ABC):
    """A source of GPU readings: real NVML through pynvml, or simulated GPUs."""

    @abc.abstractmethod
    def gpu_count(self) -> int: ...

    @abc.abstractmethod
    def read(self, index: int) -> GpuReading:
        """Read every field of one GPU. Never raises for one unsupported field or a lost GPU."""

    @abc.abstractmethod
    def drain_xids(self) -> list[XidEvent]:
        """XID events since the last call, without blocking."""

    def field_errors(self) -> Mapping[str, int]:
        """Reads that failed (not unsupported: those are absent fields), by field, since start."""
        return {}

    def stalled(self, deadline_s: float) -> Stall | None:
        """The backend call in flight for longer than `deadline_s`, if any (see deadline.py)."""
        return None

    def sweep(self) -> list[GpuReading]:
        return [self.read(i) for i in range(self.gpu_count())]

    def fingerprint(self) -> dict[str, str]:
        """The node's configuration as the GPU source tells it, for its fingerprint
        (sentinel/fingerprint.py): driver and CUDA versions, each GPU's name, VBIOS, InfoROM,
        persistence and ECC modes. A field it cannot tell is left out, never an error. Read at
        the agent's start and every `agent.fingerprint_every_s`, not every sweep."""
        return {}

    def urgent(self, critical_c: float) -> str | None:
        """Between sweeps, a few cheap reads of the signals that cannot wait for the next one:
        an XID event pending (kept for `drain_xids`), a new double-bit ECC error, a GPU at or
        past `critical_c`. What was found (for the log), or None. Backends without a cheap way
        to tell answer None and are judged at their sweeps."""
        return None

    def close(self) -> None:  # noqa: B027  (optional hook; most backends hold nothing)
        """Release the library or files the backend holds."""
