"""Simulated GPUs: realistic readings with seeded noise, and faults injected through a file.

An injector appends JSON lines to the faults file (`inject`); the simulator reads what is new at
the start of each `read`, `sweep` and `drain_xids`, so a fault shows up on the next collection the
way a real one would. Each fault changes exactly the readings the real fault changes:

    {"kind": "ecc_dbe", "gpu": 0}            DBE counters +1, a row remapped after an
                                             uncorrectable error and a remap pending (pages
                                             retired on pre-Ampere models), and XID 48
    {"kind": "xid", "gpu": 1, "xid": 79}     an XID event; 79 also loses the GPU for good,
                                             48 also counts a double-bit error as above
    {"kind": "thermal", "gpu": 1, "temp_c": 96}  GPU temperature, hardware + software thermal
                                             slowdown reasons, SM clock halved
    {"kind": "sdc", "gpu": 0}                silent data corruption: no reading changes (what
                                             the validation burn-in's recompute finds)
    {"kind": "slow", "gpu": 0, "slowdown": 1.5}  arithmetic that slowly: no reading changes
                                             (what the validation burn-in's GEMM finds)
    {"kind": "clear", "gpu": 1}              the GPU is repaired: its thermal, SDC and slow
                                             faults are over (and a `warm` excursion, a
                                             link down)

What healthy fleets see every day, for the rules' precision corpus (`sentinel rules score`):

    {"kind": "sbe", "gpu": 0, "count": 40}   corrected (single-bit) ECC errors: the volatile
                                             and aggregate counters rise by `count`
    {"kind": "pcie_replay", "gpu": 0, "count": 5}  PCIe link replays: the counter rises
    {"kind": "nvlink_crc", "gpu": 0, "count": 3}   NVLink CRC errors: the counter rises
    {"kind": "warm", "gpu": 0, "temp_c": 78} the GPU runs warmer, with no throttling, until a
                                             `clear`
    {"kind": "nvlink_down", "gpu": 0, "link": 3}  one NVLink link is down until a `clear`
    {"kind": "loopback", "factor": 0.4}      the node's own network stack carries only that
                                             share of its bandwidth: no GPU reading changes
                                             (what the validation's loopback finds); the
                                             latest such line holds, 1.0 is repaired

The validation burn-in of a simulated node (`sentinel burnin --validate --sim-faults FILE`)
reads the same file to make its arithmetic really slow or corrupt, and its loopback really slow
(`sentinel.burnin.faults`).

A malformed line is logged and skipped; it never stops the simulator.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from sentinel.agent.health.judge import (
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
)
from sentinel.agent.nvml.readings import GpuBackend, GpuProcess, GpuReading, XidEvent
from sentinel.exitcodes import InputError
from sentinel.protocol import format_validation_error

log = logging.getLogger(__name__)

MIB = 1 << 20
XID_DBE = 48
XID_FALLEN_OFF_BUS = 79
THERMAL_THROTTLE = THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL


@dataclass(frozen=True, slots=True)
class GpuModel:
    power_limit_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    fb_total_mib: int
    nvlink_links: int
    row_remapping: bool  # Ampere and later remap rows; older GPUs retire pages instead
    gpm: bool  # GPM metrics (tensor-pipe activity) exist from Hopper on


MODELS: dict[str, GpuModel] = {
    "NVIDIA H100 80GB HBM3": GpuModel(700.0, 1980, 2619, 81559, 18, True, True),
    "NVIDIA A100-SXM4-80GB": GpuModel(400.0, 1410, 1593, 81920, 12, True, False),
    "Tesla V100-SXM2-32GB": GpuModel(300.0, 1530, 877, 32768, 6, False, False),
}

# PCI buses of the eight GPUs of an HGX H100 board, in NVML order.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


# --- the fault vocabulary of the faults file ------------------------------------------------


class _Fault(BaseModel):
    # Other keys (a scenario's `node`, `at_step`) are the injector's business and are ignored.
    model_config = ConfigDict(extra="ignore", frozen=True)
    gpu: int = Field(ge=0)


class EccDbe(_Fault):
    kind: Literal["ecc_dbe"]


class Xid(_Fault):
    kind: Literal["xid"]
    xid: int = Field(ge=1)


class Thermal(_Fault):
    kind: Literal["thermal"]
    temp_c: float = Field(gt=0, le=150)


class Sdc(_Fault):
    kind: Literal["sdc"]


class Slow(_Fault):
    kind: Literal["slow"]
    slowdown: float = Field(gt=1, le=100)


class Clear(_Fault):
    kind: Literal["clear"]


class Sbe(_Fault):
    kind: Literal["sbe"]
    count: int = Field(default=1, ge=1, le=1_000_000)


class PcieReplay(_Fault):
    kind: Literal["pcie_replay"]
    count: int = Field(default=1, ge=1, le=1_000_000)


class NvlinkCrc(_Fault):
    kind: Literal["nvlink_crc"]
    count: int = Field(default=1, ge=1, le=1_000_000)


class Warm(_Fault):
    kind: Literal["warm"]
    temp_c: float = Field(gt=0, le=150)


class NvlinkDown(_Fault):
    kind: Literal["nvlink_down"]
    link: int = Field(ge=0, le=17)


GpuFault = (
    EccDbe | Xid | Thermal | Sdc | Slow | Clear | Sbe | PcieReplay | NvlinkCrc | Warm | NvlinkDown
)


class Loopback(BaseModel):
    """The node's, not a GPU's."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    kind: Literal["loopback"]
    factor: float = Field(gt=0, le=1)


SimFault = Annotated[GpuFault | Loopback, Field(discriminator="kind")]
# Every `kind` a faults-file line may have.
FAULT_KINDS = frozenset(
    get_args(cls.model_fields["kind"].annotation)[0] for cls in (*get_args(GpuFault), Loopback)
)
_FAULT: TypeAdapter[SimFault] = TypeAdapter(SimFault)


def parse_fault(doc: object) -> SimFault:
    """Validate one fault; raises InputError with the precise reason."""
    try:
        return _FAULT.validate_python(doc)
    except ValidationError as e:
        raise InputError(f"not a valid fault: {format_validation_error(e)}") from None


def inject(faults_file: Path, fault: dict[str, Any]) -> None:
    """Append one fault as one line, in a single O_APPEND write so concurrent injectors and a
    reading simulator never see half a line."""
    line = json.dumps(parse_fault(fault).model_dump(mode="json"), separators=(",", ":")) + "\n"
    fd = os.open(faults_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# --- one simulated GPU ----------------------------------------------------------------------


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    rng: random.Random
    base_temp_c: float
    base_power_w: float
    fb_used_mib: int
    energy_mj: float
    last_ts: float
    lost: bool = False
    thermal_c: float | None = None
    warm_c: float | None = None
    sbe: int = 0
    pcie_replays: int = 0
    nvlink_crc: int = 0
    links_down: tuple[int, ...] = ()
    dbe_volatile: int = 0
    dbe_aggregate: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    rows_uncorrectable: int = 0
    rows_pending: bool = False
    pid: int = 0


class SimulatedGpus(GpuBackend):
    """`gpus` GPUs of `model`, deterministic for a given seed (and node id) and clock."""

    def __init__(
        self,
        gpus: int,
        model: str = "NVIDIA H100 80GB HBM3",
        seed: int = 0,
        faults_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        node_id: str = "",
    ) -> None:
        if gpus < 1:
            raise InputError(f"simulated GPUs: need at least 1 GPU, got {gpus}")
        if model not in MODELS:
            raise InputError(f"simulated GPUs: unknown model {model!r}; known: {sorted(MODELS)}")
        self.model = model
        self._spec = MODELS[model]
        self._clock = clock
        self._faults_file = faults_file
        self._urgent_seen: dict[int, tuple[int, bool, bool]] = {}  # (dbe, lost, hot) per GPU
        self._offset = 0  # bytes of the faults file already applied
        self._line_no = 0
        self._xids: list[XidEvent] = []
        now = clock()
        self._gpus = [self._make_gpu(i, f"{seed}:{node_id}:{i}", now) for i in range(gpus)]
        # Faults already in the file struck before this process started (an agent restart): the
        # GPUs keep their marks (counters, lost, hot), but NVML does not replay past XID events.
        self._poll_faults()
        self._xids.clear()

    def _make_gpu(self, index: int, seed: str, now: float) -> _Gpu:
        rng = random.Random(seed)
        spec = self._spec
        domain, bus = divmod(index, len(_HGX_BUSES))  # past eight GPUs: another PCI domain
        return _Gpu(
            index=index,
            uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            pci_bus_id=f"{domain:08X}:{_HGX_BUSES[bus]:02X}:00.0",
            rng=rng,
            base_temp_c=rng.uniform(40.0, 48.0),
            base_power_w=spec.power_limit_w * rng.uniform(0.6, 0.8),
            fb_used_mib=int(spec.fb_total_mib * rng.uniform(0.75, 0.9)),
            energy_mj=rng.uniform(1e9, 5e10),  # since driver load, days ago
            last_ts=now,
            pid=rng.randrange(10_000, 99_999),
        )

    # --- GpuBackend -------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return len(self._gpus)

    def read(self, index: int) -> GpuReading:
        self._poll_faults()
        return self._read(index)

    def sweep(self) -> list[GpuReading]:
        self._poll_faults()
        return [self._read(i) for i in range(len(self._gpus))]

    def drain_xids(self) -> list[XidEvent]:
        self._poll_faults()
        drained, self._xids = self._xids, []
        return drained

    def urgent(self, critical_c: float) -> str | None:
        self._poll_faults()
        if self._xids:
            return f"xid {self._xids[-1].xid} on gpu {self._xids[-1].gpu}"
        # Every GPU's baseline moves before answering, so a signal on one GPU does not leave
        # another's unrecorded (it would wake a second, redundant sweep).
        found: str | None = None
        for g in self._gpus:
            seen = self._urgent_seen.get(g.index, (0, False, False))
            hot = g.thermal_c is not None and g.thermal_c >= critical_c
            now = (g.dbe_volatile, g.lost, hot)
            self._urgent_seen[g.index] = now
            if found is None and (
                now[0] > seen[0] or (now[1] and not seen[1]) or (now[2] and not seen[2])
            ):
                found = f"gpu {g.index}: dbe {g.dbe_volatile}, lost {g.lost}, hot {hot}"
        return found

    # --- readings ---------------------------------------------------------------------------

    def _read(self, index: int) -> GpuReading:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"GPU {index} does not exist (this node has {len(self._gpus)})")
        g, spec = self._gpus[index], self._spec
        ident = GpuReading(index, uuid=g.uuid, name=self.model, pci_bus_id=g.pci_bus_id)
        if g.lost:
            return replace(ident, lost=True)
        # Every noise value is drawn on every read, so a fault never shifts the noise sequence.
        rng = g.rng
        temp = min(55.0, max(35.0, g.base_temp_c + rng.gauss(0.0, 1.0)))
        temp_mem = min(65.0, max(38.0, g.base_temp_c + 6.0 + rng.gauss(0.0, 1.0)))
        low, high = 0.43 * spec.power_limit_w, 0.93 * spec.power_limit_w
        power = round(min(high, max(low, g.base_power_w + rng.gauss(0.0, 20.0))), 2)
        util, util_mem = rng.randint(94, 100), rng.randint(35, 60)
        fb_used = (g.fb_used_mib + rng.randint(-64, 64)) * MIB
        tensor = rng.uniform(0.35, 0.55)
        now = self._clock()
        g.energy_mj += power * max(0.0, now - g.last_ts) * 1000.0
        g.last_ts = now
        thermal = g.thermal_c is not None
        remap, fb_total = spec.row_remapping, spec.fb_total_mib * MIB
        links = spec.nvlink_links > 0
        return replace(
            ident,
            temp_gpu_c=g.thermal_c or g.warm_c or round(temp, 1),
            temp_mem_c=round(temp_mem, 1),
            power_w=power,
            power_limit_w=spec.power_limit_w,
            energy_mj=int(g.energy_mj),
            sm_clock_mhz=spec.sm_clock_mhz // 2 if thermal else spec.sm_clock_mhz,
            mem_clock_mhz=spec.mem_clock_mhz,
            util_gpu_pct=util,
            util_mem_pct=util_mem,
            fb_used_bytes=fb_used,
            fb_free_bytes=fb_total - fb_used,
            fb_total_bytes=fb_total,
            ecc_sbe_volatile=g.sbe,
            ecc_dbe_volatile=g.dbe_volatile,
            ecc_sbe_aggregate=g.sbe,
            ecc_dbe_aggregate=g.dbe_aggregate,
            retired_pages_sbe=None if remap else 0,
            retired_pages_dbe=None if remap else g.retired_dbe,
            retired_pages_pending=None if remap else g.retired_pending,
            remapped_rows_correctable=0 if remap else None,
            remapped_rows_uncorrectable=g.rows_uncorrectable if remap else None,
            remapped_rows_pending=g.rows_pending if remap else None,
            remapped_rows_failure=False if remap else None,
            throttle_reasons=THERMAL_THROTTLE if thermal else 0,
            pcie_replay_count=g.pcie_replays,
            nvlink_crc_errors=g.nvlink_crc if links else None,
            nvlink_replay_errors=0 if links else None,
            nvlink_recovery_errors=0 if links else None,
            nvlink_links_down=g.links_down if links else None,
            tensor_active=round(tensor, 3) if spec.gpm else None,
            processes=(GpuProcess(pid=g.pid, used_memory_bytes=fb_used),),
        )

    # --- faults -----------------------------------------------------------------------------

    def _poll_faults(self) -> None:
        if self._faults_file is None:
            return
        try:
            with open(self._faults_file, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < self._offset:
                    log.warning("faults file %s shrank; reading it from the start", f.name)
                    self._offset, self._line_no = 0, 0
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return  # no fault injected yet
        except OSError as e:
            log.warning("cannot read faults file %s: %s", self._faults_file, e.strerror)
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits
        self._offset += len(complete)
        for raw in complete.splitlines():
            self._line_no += 1
            self._apply_line(raw)

    def _apply_line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        where = f"faults file {self._faults_file} line {self._line_no}"
        try:
            fault = parse_fault(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            log.warning("%s: skipped, not valid JSON: %s", where, e)
            return
        except InputError as e:
            log.warning("%s: skipped, %s", where, e)
            return
        if not isinstance(fault, Loopback) and fault.gpu >= len(self._gpus):
            log.warning("%s: skipped, no GPU %d on this node", where, fault.gpu)
            return
        log.info("%s: injecting %s", where, fault.model_dump(mode="json"))
        if not isinstance(fault, Loopback):  # the host's network: no GPU reading changes
            self._apply(fault)

    def _apply(self, fault: GpuFault) -> None:
        g = self._gpus[fault.gpu]
        match fault:
            case EccDbe():
                self._double_bit_error(g)
                self._emit(g, XID_DBE)
            case Xid(xid=code):
                if code == XID_DBE:
                    self._double_bit_error(g)
                if code == XID_FALLEN_OFF_BUS:
                    g.lost = True
                self._emit(g, code)
            case Thermal(temp_c=temp):
                g.thermal_c = temp
            case Clear():
                g.thermal_c = g.warm_c = None
                g.links_down = ()
            case NvlinkDown(link=link):
                g.links_down = tuple(sorted({*g.links_down, link}))
            case Warm(temp_c=temp):
                g.warm_c = temp
            case Sbe(count=n):
                g.sbe += n
            case PcieReplay(count=n):
                g.pcie_replays += n
            case NvlinkCrc(count=n):
                g.nvlink_crc += n
            case Sdc() | Slow():
                pass  # silent in every reading: only the arithmetic shows it

    def _double_bit_error(self, g: _Gpu) -> None:
        g.dbe_volatile += 1
        g.dbe_aggregate += 1
        if self._spec.row_remapping:
            g.rows_uncorrectable += 1
            g.rows_pending = True
        else:
            g.retired_dbe += 1
            g.retired_pending = True

    def _emit(self, g: _Gpu, code: int) -> None:
        self._xids.append(XidEvent(gpu=g.index, xid=code, uuid=g.uuid, ts=self._clock()))
