"""The real GPU backend: NVML through pynvml (package nvidia-ml-py).

A field the GPU or driver cannot give is `None` in the reading, logged once per (GPU, field),
and — when the answer is "not supported" — never asked again, so an old GPU costs nothing per
sweep for what it lacks. A GPU that has fallen off the bus reads as `lost=True`; nothing in
`read()` raises for one GPU's trouble. XIDs come from an NVML event set polled with a zero
timeout, so collection never blocks on them.

Every pynvml function goes through `deadline.TracedLibrary`, so the agent can see a call that
has not returned and name it (a driver wedged under an error storm), without touching the call.
The driver's requested recovery action, the NVLink link states and every per-GPU counter NVML
also serves as a field id (ECC, retired pages, remapped rows, energy, PCIe replay: see
scalars.py) ride in the field-value batch, one call per GPU instead of one per counter.

Cost matters (the target is a full 8-GPU sweep in a few milliseconds): handles, identity, the
active NVLink links and GPM sample buffers are set up once in `__init__`; NVLink counters for
all links come from one `nvmlDeviceGetFieldValues` call per GPU where the driver supports the
per-link DL fields, falling back to `nvmlDeviceGetNvLinkErrorCounter` per link otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from sentinel.agent.nvml import compat
from sentinel.agent.nvml.deadline import CallWatch, Stall, TracedLibrary, trace
from sentinel.agent.nvml.fields import FieldBatch
from sentinel.agent.nvml.processes import ProcessReader
from sentinel.agent.nvml.readings import GpuBackend, GpuProcess, GpuReading, XidEvent
from sentinel.agent.nvml.scalars import Convert, Scalar, scalars

log = logging.getLogger(__name__)

T = TypeVar("T")

# One NVML per process, so one watch: what call is in flight, read by the agent's event loop.
WATCH = CallWatch()
nvml: Any = TracedLibrary(pynvml, WATCH)

# Answers that mean "this GPU or driver cannot give this field": stop asking for it.
UNSUPPORTED_CODES = frozenset(
    {
        nvml.NVML_ERROR_NOT_SUPPORTED,
        nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        nvml.NVML_ERROR_NO_PERMISSION,
        nvml.NVML_ERROR_INVALID_ARGUMENT,
    }
)
GPU_IS_LOST = nvml.NVML_ERROR_GPU_IS_LOST
FABRIC_COMPLETED = compat.GPU_FABRIC_STATE_COMPLETED
RESET_REQUIRED = nvml.NVML_ERROR_RESET_REQUIRED

_NVLINK_DL_FIELDS = (  # (reading field, NVML field id), per link through scopeId
    ("nvlink_replay_errors", nvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY),
    ("nvlink_recovery_errors", nvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY),
    ("nvlink_crc_errors", nvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC),
)
_NVLINK_COUNTERS = (  # the fallback: per-link error counters; CRC is flit + data
    ("nvlink_replay_errors", (nvml.NVML_NVLINK_ERROR_DL_REPLAY,)),
    ("nvlink_recovery_errors", (nvml.NVML_NVLINK_ERROR_DL_RECOVERY,)),
    ("nvlink_crc_errors", (nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA)),
)
_NVLINK_KEYS = tuple(key for key, _ in _NVLINK_DL_FIELDS)
_LINK_STATE = "nvlink_state"
# Sleeping (low power) links are up; inactive ones and links with traffic disabled are not.
_LINK_DOWN_STATES = (
    compat.NVLINK_STATE_INACTIVE,
    compat.NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED,
)
_MAX_XIDS_PER_DRAIN = 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; the message says why and what to do."""


class _GpuLost(Exception):
    """Raised inside `read()` when NVML says the GPU fell off the bus; never escapes it."""


@dataclass(slots=True)
class _Gpm:
    """Two GPM sample buffers per GPU: each sweep takes one sample and diffs it with the last."""

    previous: Any
    current: Any
    request: Any  # c_nvmlGpmMetricsGet_t, reused every sweep (it is ~19 KB)
    primed: bool = False


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any = None
    address: int | None = None  # the handle's pointer value, to map XID events back to a GPU
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    nvlink_domain: str | None = None  # `<fabric cluster uuid>/<clique>`: None, on no fabric
    lost: bool = False
    skip: set[str] = field(default_factory=set)  # unsupported: never asked again
    logged: set[str] = field(default_factory=set)  # failures already logged once
    links: list[int] = field(default_factory=list)  # NVLink links active at start
    nvlink_by_fields: bool = True  # False: the driver lacks the DL fields, use per-link calls
    fields: FieldBatch | None = None  # per-GPU scalars + NVLink DL counters, one call
    scalar_outputs: list[tuple[str, int, Convert]] = field(default_factory=list)  # in the batch
    scalars: list[Scalar] = field(default_factory=list)  # those in the batch, first, in order
    # The costly scalars (nvml/scalars.py): their own batch, read every `slow_every_s`; the
    # readings carry the last values in between.
    slow_fields: FieldBatch | None = None
    slow_scalars: list[Scalar] = field(default_factory=list)
    slow_outputs: list[tuple[str, int, Convert]] = field(default_factory=list)
    slow_values: dict[str, Any] = field(default_factory=dict)
    slow_read_at: float = -math.inf  # time.monotonic() of the last read of them
    by_call: set[str] = field(default_factory=set)  # scalars the batch lacks: read per call
    nvlink_entries: int = 0  # the batch's last entries: per link, its DL counters and state
    reset_required: bool = False  # a call of this sweep answered NVML_ERROR_RESET_REQUIRED
    dbe_events: bool = False  # double-bit ECC errors arrive as events: not polled in `urgent`
    gpm: _Gpm | None = None


def _domain(info: Any) -> str | None:
    """`<cluster uuid>/<clique>` of a fabric answer, once registered (state COMPLETED)."""
    if int(info.state) != FABRIC_COMPLETED or int(info.status) != nvml.NVML_SUCCESS:
        return None
    return f"{uuid.UUID(bytes=bytes(info.clusterUuid))}/{int(info.cliqueId)}"


def _text(value: str | bytes) -> str:
    """pynvml decodes char arrays in its structures in some versions and not in others."""
    return value.decode() if isinstance(value, bytes) else value


def _mode(state: int) -> str:
    """An nvmlEnableState_t as a fingerprint value."""
    return "on" if state == nvml.NVML_FEATURE_ENABLED else "off"


def _init_failure(exc: Exception) -> NvmlUnavailable:
    code = getattr(exc, "value", None)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        why = "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed?"
    elif code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        why = "the NVIDIA kernel driver is not loaded (check `nvidia-smi`, `dmesg`)"
    elif code == nvml.NVML_ERROR_NO_PERMISSION:
        why = "no permission to open the GPU devices (/dev/nvidia*)"
    else:
        why = f"NVML error: {exc}"
    return NvmlUnavailable(f"cannot use NVML: {why}. To run without GPUs, use --sim.")


class NvmlBackend(GpuBackend):
    """Reads every GPU through NVML. Construct to initialise; `close()` shuts NVML down."""

    def __init__(self, slow_every_s: float = 10.0) -> None:
        """`slow_every_s`: how often the readings costly to the driver are read (0: every
        sweep); see nvml/scalars.py."""
        self._slow_every_s = slow_every_s
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise _init_failure(exc) from exc
        self._closed = False
        # Reads that failed (not "unsupported": see unsupported()), by field or source.
        self.errors: Counter[str] = Counter()
        # System-wide fields (the fingerprint's driver versions): as a GPU's skip and logged.
        self._system_skip: set[str] = set()
        self._system_logged: set[str] = set()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            raise _init_failure(exc) from exc
        self._reasons_fn = nvml.nvmlDeviceGetCurrentClocksEventReasons
        self._processes = self._process_reader()
        self._scalars = scalars(nvml)
        self._gpus = [_Gpu(index=i) for i in range(count)]
        for gpu in self._gpus:
            try:
                self._attach(gpu)
            except _GpuLost:
                self._lost_reading(gpu)
        self._events = self._create_event_set()
        self._pending_xids: list[XidEvent] = []  # seen between sweeps, for the next drain
        self._dbe_signalled: set[int] = set()  # GPUs with a double-bit ECC event since a sweep
        self._urgent_seen: dict[int, tuple[int, bool]] = {}  # (volatile DBE, hot) per GPU
        self.watch = WATCH
        log.info("NVML ready", extra={"gpus": count, "driver": self._driver_version()})

    # ---- lifecycle ------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return len(self._gpus)

    def field_errors(self) -> Mapping[str, int]:
        return self.errors

    def stalled(self, deadline_s: float) -> Stall | None:
        return self.watch.stalled(deadline_s)

    def unsupported(self, index: int) -> frozenset[str]:
        """The fields this GPU or its driver cannot give, found so far; never asked again."""
        return frozenset(self._gpus[index].skip)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for gpu in self._gpus:
            if gpu.gpm is not None:
                nvml.nvmlGpmSampleFree(gpu.gpm.previous)
                nvml.nvmlGpmSampleFree(gpu.gpm.current)
                gpu.gpm = None
        if self._events is not None:
            nvml.nvmlEventSetFree(self._events)
            self._events = None
        nvml.nvmlShutdown()

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _driver_version(self) -> str | None:
        try:
            return str(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            return None

    def _attach(self, gpu: _Gpu) -> bool:
        """Get the handle and what never changes while it lives: identity, links, GPM buffers.

        False when no handle could be had; raises _GpuLost when the GPU is off the bus.
        """
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except nvml.NVMLError as exc:
            self._note_failure(gpu, "handle", exc.value)
            return False
        gpu.uuid = self._call(gpu, "uuid", nvml.nvmlDeviceGetUUID, handle)
        gpu.name = self._call(gpu, "name", nvml.nvmlDeviceGetName, handle)
        pci = self._call(gpu, "pci_bus_id", nvml.nvmlDeviceGetPciInfo, handle)
        gpu.pci_bus_id = None if pci is None else _text(pci.busId)
        gpu.nvlink_domain = self._nvlink_domain(gpu, handle)
        self._find_links(gpu, handle)
        self._setup_gpm(gpu, handle)
        gpu.handle = handle
        gpu.address = ctypes.cast(handle, ctypes.c_void_p).value
        return True

    def _nvlink_domain(self, gpu: _Gpu, handle: Any) -> str | None:
        """The GPU's NVLink domain (an NVL72 rack's, say): its fabric's cluster UUID and its
        clique there, once the fabric manager has registered it. None on a GPU with no NVLink
        fabric (NVML answers NOT_SUPPORTED: the usual node, not a missing reading) or not
        registered yet. The versioned call where this pynvml and driver have it, else the
        first (R525 on)."""
        for call, kind in (
            ("nvmlDeviceGetGpuFabricInfoV", getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)),
            ("nvmlDeviceGetGpuFabricInfo", compat.GpuFabricInfo),
        ):
            fn = getattr(nvml, call, None)
            if fn is None or kind is None:
                continue
            info = kind()
            try:
                fn(handle, ctypes.byref(info))  # pynvml passes the pointer on as given
            except nvml.NVMLError as exc:
                if exc.value == GPU_IS_LOST:
                    raise _GpuLost from exc
                if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                    return None
                continue  # a driver older than this call or its version: the next one says
            return _domain(info)
        return None

    def _find_links(self, gpu: _Gpu, handle: Any) -> None:
        gpu.links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:  # past the last link, or no NVLink at all
                if exc.value == GPU_IS_LOST:
                    raise _GpuLost from exc
                break
            if state == compat.NVLINK_STATE_ACTIVE:
                gpu.links.append(link)
        self._build_fields(gpu)
        if not gpu.links:
            log.info(
                "gpu %d: no active NVLink links; NVLink counters reported as missing", gpu.index
            )

    def _setup_gpm(self, gpu: _Gpu, handle: Any) -> None:
        if gpu.gpm is not None:  # attached again after being lost: keep the buffers
            gpu.gpm.primed = False
            return
        support = self._call(gpu, "tensor_active", nvml.nvmlGpmQueryDeviceSupport, handle)
        if support is None:
            return
        if not support.isSupportedDevice:
            self._note_failure(gpu, "tensor_active", nvml.NVML_ERROR_NOT_SUPPORTED)
            return
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        gpu.gpm = _Gpm(nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc(), request)

    # ---- error handling -------------------------------------------------------------------

    def _call(self, gpu: _Gpu, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """One NVML call for one field: its value, or None (unsupported or failed)."""
        if key in gpu.skip:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            self._note_failure(gpu, key, exc.value)
            return None

    def _note_failure(self, gpu: _Gpu, key: str, code: int) -> None:
        if code == GPU_IS_LOST:
            raise _GpuLost
        if code == RESET_REQUIRED:  # the driver refuses until the GPU is reset: a finding
            gpu.reset_required = True
        unsupported = code in UNSUPPORTED_CODES
        if unsupported:
            gpu.skip.add(key)
        else:
            self.errors[key] += 1
        if key in gpu.logged:
            return
        gpu.logged.add(key)
        reason = str(nvml.NVMLError(code))
        if unsupported:
            log.info("gpu %d: %s unavailable (%s); reported as missing", gpu.index, key, reason)
        else:
            log.warning("gpu %d: reading %s failed (%s)", gpu.index, key, reason)

    def _system_call(self, key: str, fn: Callable[[], T]) -> T | None:
        """One system-wide NVML call for one field, treated as `_call` treats a GPU's."""
        if key in self._system_skip:
            return None
        try:
            return fn()
        except nvml.NVMLError as exc:
            code = exc.value
        unsupported = code in UNSUPPORTED_CODES
        if unsupported:
            self._system_skip.add(key)
        else:
            self.errors[key] += 1
        if key not in self._system_logged:
            self._system_logged.add(key)
            reason = str(nvml.NVMLError(code))
            if unsupported:
                log.info("%s unavailable (%s); left out of the fingerprint", key, reason)
            else:
                log.warning("reading %s failed (%s)", key, reason)
        return None

    # ---- configuration fingerprint --------------------------------------------------------

    def fingerprint(self) -> dict[str, str]:
        """`driver`, `cuda_driver` and, per GPU i, `gpu.i.name`, `gpu.i.vbios`,
        `gpu.i.inforom`, `gpu.i.persistence` and `gpu.i.ecc` ("on"/"off"), with
        `gpu.i.ecc_pending` while a change of ECC mode waits for a reset. A field NVML does not
        answer is left out, logged once like a reading's; a GPU without a handle or lost gives
        only its name (the sweep reports its trouble)."""
        fields: dict[str, str] = {}
        driver = self._system_call("driver", nvml.nvmlSystemGetDriverVersion)
        if driver is not None:
            fields["driver"] = _text(driver)
        cuda = self._system_call("cuda_driver", nvml.nvmlSystemGetCudaDriverVersion_v2)
        if cuda is not None:  # 1000 * major + 10 * minor: 12080 is 12.8
            fields["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        for gpu in self._gpus:
            self.watch.gpu = gpu.index
            try:
                fields |= self._gpu_fingerprint(gpu)
            finally:
                self.watch.gpu = None
        domains = sorted({g.nvlink_domain for g in self._gpus if g.nvlink_domain})
        if domains:  # the node's NVLink domain: its identity, never judged as drift
            fields["nvlink_domain"] = ",".join(domains)
        return fields

    def _gpu_fingerprint(self, gpu: _Gpu) -> dict[str, str]:
        at = f"gpu.{gpu.index}."
        named = {at + "name": gpu.name} if gpu.name is not None else {}
        if gpu.handle is None or gpu.lost:
            return named
        h, call = gpu.handle, self._call
        try:
            found = {
                "vbios": call(gpu, "vbios", nvml.nvmlDeviceGetVbiosVersion, h),
                "inforom": call(gpu, "inforom", nvml.nvmlDeviceGetInforomImageVersion, h),
                "persistence": call(gpu, "persistence", nvml.nvmlDeviceGetPersistenceMode, h),
            }
            ecc = call(gpu, "ecc_mode", nvml.nvmlDeviceGetEccMode, h)
        except _GpuLost:
            return named
        if found["persistence"] is not None:
            found["persistence"] = _mode(found["persistence"])
        if ecc is not None:
            current, pending = _mode(ecc[0]), _mode(ecc[1])
            found["ecc"] = current
            if pending != current:
                found["ecc_pending"] = pending
        return named | {at + key: _text(v) for key, v in found.items() if v is not None}

    # ---- one GPU --------------------------------------------------------------------------

    def read(self, index: int) -> GpuReading:
        gpu = self._gpus[index]
        out: dict[str, Any] = {}
        self.watch.gpu = index
        gpu.reset_required = False
        try:
            if gpu.handle is None and not self._attach(gpu):
                return GpuReading(index=index)
            self._read_thermal_power(gpu, out)
            self._read_clocks_memory(gpu, out)
            self._read_fields(gpu, out)
            self._read_tensor_active(gpu, out)
            procs = self._call(gpu, "processes", self._processes, gpu.handle)
        except _GpuLost:
            return self._lost_reading(gpu)
        finally:
            self.watch.gpu = None
        self._judge_reset(gpu, out)
        if gpu.lost:
            gpu.lost = False
            log.warning("gpu %d answers again after being lost", index, extra={"uuid": gpu.uuid})
        if procs:
            out["processes"] = procs
        return GpuReading(
            index=index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id, **out
        )

    def _judge_reset(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        """Reset required: a call said so this sweep, or the driver's recovery action asks for
        a reset; unknown (None) when neither source answered."""
        action = out.get("recovery_action")
        if gpu.reset_required:
            out["reset_required"] = True
        elif action is not None:
            out["reset_required"] = action in (
                compat.GPU_RECOVERY_ACTION_GPU_RESET,
                compat.GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
            )

    def _lost_reading(self, gpu: _Gpu) -> GpuReading:
        if gpu.gpm is not None:  # a sample from before the loss means nothing after it
            gpu.gpm.primed = False
        if not gpu.lost:
            gpu.lost = True
            self.errors["gpu_lost"] += 1
            log.error("gpu %d is lost (fallen off the bus)", gpu.index, extra={"uuid": gpu.uuid})
        return GpuReading(
            index=gpu.index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id, lost=True
        )

    def _read_thermal_power(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        h, call = gpu.handle, self._call
        temp = call(gpu, "temp_gpu_c", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        out["temp_gpu_c"] = None if temp is None else float(temp)
        mw = call(gpu, "power_w", nvml.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = None if mw is None else mw / 1000.0
        limit = call(gpu, "power_limit_w", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        out["power_limit_w"] = None if limit is None else limit / 1000.0
        out["throttle_reasons"] = call(gpu, "throttle_reasons", self._clock_reasons, h)

    def _process_reader(self) -> Callable[[Any], tuple[GpuProcess, ...]]:
        """Past pynvml where the driver has the v3 call (see nvml/processes.py), through it
        where not; either way under the deadline watch."""
        try:
            reader = ProcessReader().read
        except pynvml.NVMLError_FunctionNotFound:
            return lambda handle: tuple(
                GpuProcess(p.pid, p.usedGpuMemory)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
        return trace(WATCH, "nvmlDeviceGetComputeRunningProcesses_v3", reader)

    def _clock_reasons(self, handle: Any) -> int:
        """Clocks-event reasons; drivers older than R535 only have the throttle-reasons name."""
        try:
            return int(self._reasons_fn(handle))
        except nvml.NVMLError_FunctionNotFound:
            if self._reasons_fn is nvml.nvmlDeviceGetCurrentClocksThrottleReasons:
                raise
            self._reasons_fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            return int(self._reasons_fn(handle))

    def _read_clocks_memory(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        h, call = gpu.handle, self._call
        out["sm_clock_mhz"] = call(
            gpu, "sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM
        )
        out["mem_clock_mhz"] = call(
            gpu, "mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM
        )
        util = call(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["util_gpu_pct"], out["util_mem_pct"] = util.gpu, util.memory
        mem = call(gpu, "memory_info", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out["fb_used_bytes"], out["fb_free_bytes"] = mem.used, mem.free
            out["fb_total_bytes"] = mem.total

    # ---- NVLink, GPM ----------------------------------------------------------------------

    def _build_fields(self, gpu: _Gpu) -> None:
        """The field-value batch: the per-GPU scalars (nvml/scalars.py) this GPU still answers in
        it, then the DL counters and state of each active link.

        Summing NVLink counters over the links active at start keeps the sums monotonic (they
        are counters) when a link goes down later.
        """
        live = [s for s in self._scalars if s.key not in gpu.skip and s.key not in gpu.by_call]
        gpu.scalars = [s for s in live if not s.costly]
        gpu.scalar_outputs = [output for s in gpu.scalars for output in s.outputs]
        gpu.slow_scalars = [s for s in live if s.costly]
        gpu.slow_outputs = [output for s in gpu.slow_scalars for output in s.outputs]
        slow = [(field_id, 0) for _, field_id, _ in gpu.slow_outputs]
        gpu.slow_fields = FieldBatch(slow) if slow else None
        requests = [(field_id, 0) for _, field_id, _ in gpu.scalar_outputs]
        scalars = len(requests)
        if gpu.nvlink_by_fields:
            for link in gpu.links:
                for _, field_id in (
                    *_NVLINK_DL_FIELDS,
                    (_LINK_STATE, nvml.NVML_FI_DEV_NVLINK_GET_STATE),
                ):
                    requests.append((field_id, link))
        gpu.nvlink_entries = len(requests) - scalars
        gpu.fields = FieldBatch(requests) if requests else None

    def _read_batch(self, gpu: _Gpu, batch: FieldBatch) -> tuple[Sequence[int], list[Any]]:
        self.watch.begin("nvmlDeviceGetFieldValues")  # called past pynvml: see nvml/fields.py
        try:
            return batch.read(gpu.handle)
        except pynvml.NVMLError as exc:  # the whole call: every field in it is missing
            return [exc.value] * len(batch.requests), [0] * len(batch.requests)
        finally:
            self.watch.end()

    def _read_fields(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        rebuild = False
        if gpu.fields is not None:
            codes, values = self._read_batch(gpu, gpu.fields)
            at = len(codes) - gpu.nvlink_entries
            rebuild = self._take_scalars(
                gpu, gpu.scalars, gpu.scalar_outputs, codes[:at], values[:at], out
            )
            self._take_nvlink(gpu, codes[at:], values[at:], out)
        slow_due = time.monotonic() - gpu.slow_read_at >= self._slow_every_s
        if slow_due:
            gpu.slow_read_at, gpu.slow_values = time.monotonic(), {}  # a failure: missing
            if gpu.slow_fields is not None:
                codes, values = self._read_batch(gpu, gpu.slow_fields)
                rebuild = (
                    self._take_scalars(
                        gpu, gpu.slow_scalars, gpu.slow_outputs, codes, values, gpu.slow_values
                    )
                    or rebuild
                )
        if rebuild:
            self._build_fields(gpu)
        if gpu.by_call:
            self._read_by_call(gpu, out, slow_due)
        out.update(gpu.slow_values)
        if gpu.links and not gpu.nvlink_by_fields:
            self._read_link_counters(gpu, out)
            out["nvlink_links_down"] = self._links_down(gpu)

    def _take_scalars(
        self,
        gpu: _Gpu,
        scalars: list[Scalar],
        outputs: list[tuple[str, int, Convert]],
        codes: Sequence[int],
        values: list[Any],
        out: dict[str, Any],
    ) -> bool:
        """The scalars' answers (`outputs`: theirs, flat, in batch order); True when one must
        leave its batch (the batches are rebuilt)."""
        if not any(codes):  # every field answered: the common case, one pass
            for (key, _, convert), value in zip(outputs, values, strict=True):
                out[key] = convert(value)
            return False
        rebuild = False
        at = 0
        for scalar in scalars:
            end = at + len(scalar.outputs)
            code = next((c for c in codes[at:end] if c), nvml.NVML_SUCCESS)
            if code == nvml.NVML_SUCCESS:
                for (key, _, convert), value in zip(scalar.outputs, values[at:end], strict=True):
                    out[key] = convert(value)
            elif code in UNSUPPORTED_CODES and scalar.by_call is not None:
                # A driver older than the field id may still have the call: ask it this sweep.
                # Debug only: a GPU that lacks the reading altogether is logged once by _call.
                log.debug(
                    "gpu %d: %s unsupported as a field; trying its call", gpu.index, scalar.key
                )
                gpu.by_call.add(scalar.key)
                rebuild = True
            else:
                self._note_failure(gpu, scalar.key, code)
                rebuild = rebuild or scalar.key in gpu.skip
            at = end
        return rebuild

    def _read_by_call(self, gpu: _Gpu, out: dict[str, Any], slow_due: bool) -> None:
        """Scalars the batch does not serve, through their own calls (unsupported: skipped);
        the costly ones only when due, kept with the other slow values."""
        for scalar in self._scalars:
            if scalar.key in gpu.by_call and scalar.by_call is not None:
                if scalar.costly and not slow_due:
                    continue
                values = self._call(gpu, scalar.key, scalar.by_call, gpu.handle)
                if values is not None:
                    into = gpu.slow_values if scalar.costly else out
                    into.update(zip((key for key, _, _ in scalar.outputs), values, strict=True))

    def _take_nvlink(
        self, gpu: _Gpu, codes: Sequence[int], values: list[Any], out: dict[str, Any]
    ) -> None:
        """Each link's entries are its DL counters, then its state (`_build_fields`)."""
        if not gpu.nvlink_entries:
            return
        stride = len(_NVLINK_DL_FIELDS) + 1
        code = next((c for c in codes if c), nvml.NVML_SUCCESS)
        totals = {key: sum(values[i::stride]) for i, key in enumerate(_NVLINK_KEYS)}
        self._nvlink_fields_done(gpu, code, totals, out)
        if code == nvml.NVML_SUCCESS:
            states = values[stride - 1 :: stride]
            out["nvlink_links_down"] = tuple(
                link
                for link, state in zip(gpu.links, states, strict=True)
                if state in _LINK_DOWN_STATES
            )

    def _links_down(self, gpu: _Gpu) -> tuple[int, ...] | None:
        """Per-link state calls, for drivers without the state field (older than R530)."""
        down = []
        for link in gpu.links:
            state = self._call(gpu, _LINK_STATE, nvml.nvmlDeviceGetNvLinkState, gpu.handle, link)
            if state is None:
                return None
            if state != compat.NVLINK_STATE_ACTIVE:
                down.append(link)
        return tuple(down)

    def _nvlink_fields_done(
        self, gpu: _Gpu, code: int, totals: dict[str, int], out: dict[str, Any]
    ) -> None:
        if code == nvml.NVML_SUCCESS:
            out.update(totals)
        elif code in UNSUPPORTED_CODES:
            log.info("gpu %d: no NVLink DL field values; reading per-link counters", gpu.index)
            gpu.nvlink_by_fields = False
            self._build_fields(gpu)
        else:
            self._note_failure(gpu, "nvlink", code)

    def _read_link_counters(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        """Sum each counter over the links. An unsupported counter (say CRC data) is left out
        of its sum; a failed read makes the sum missing rather than too small."""
        for key, counters in _NVLINK_COUNTERS:
            parts: list[int] = []
            complete = True
            for counter in counters:
                name = f"{key}[{counter}]"
                part = self._link_counter_sum(gpu, name, counter)
                if part is not None:
                    parts.append(part)
                elif name not in gpu.skip:
                    complete = False
            out[key] = sum(parts) if parts and complete else None

    def _link_counter_sum(self, gpu: _Gpu, name: str, counter: int) -> int | None:
        fn = nvml.nvmlDeviceGetNvLinkErrorCounter
        total = 0
        for link in gpu.links:
            value = self._call(gpu, name, fn, gpu.handle, link, counter)
            if value is None:
                return None
            total += value
        return total

    def _read_tensor_active(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        gpm = gpu.gpm
        if gpm is None or "tensor_active" in gpu.skip:
            return
        if self._call(gpu, "tensor_active", nvml.nvmlGpmSampleGet, gpu.handle, gpm.current) is None:
            gpm.primed = False
            return
        if gpm.primed:
            gpm.request.sample1, gpm.request.sample2 = gpm.previous, gpm.current
            if self._call(gpu, "tensor_active", nvml.nvmlGpmMetricsGet, gpm.request) is not None:
                metric = gpm.request.metrics[0]
                if metric.nvmlReturn == nvml.NVML_SUCCESS:
                    out["tensor_active"] = metric.value / 100.0
                else:
                    self._note_failure(gpu, "tensor_active", metric.nvmlReturn)
        gpm.previous, gpm.current = gpm.current, gpm.previous
        gpm.primed = True

    # ---- XID events -----------------------------------------------------------------------

    def _create_event_set(self) -> Any:
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("XID events unavailable: cannot create an NVML event set (%s)", exc)
            return None
        for gpu in self._gpus:
            if gpu.handle is None:
                continue
            try:
                types = self._event_types(gpu)
                nvml.nvmlDeviceRegisterEvents(gpu.handle, types, events)
            except nvml.NVMLError as exc:
                self.errors["xid_events"] += 1
                log.warning("gpu %d: XID events unavailable (%s)", gpu.index, exc)
            else:
                gpu.dbe_events = bool(types & nvml.nvmlEventTypeDoubleBitEccError)
        return events

    def _event_types(self, gpu: _Gpu) -> int:
        """XIDs, and double-bit ECC errors where the GPU raises events for them: those need no
        polling between sweeps (see `urgent`). Registration failing with both is a failure of
        XID events, which every GPU that has events supports."""
        xid: int = nvml.nvmlEventTypeXidCriticalError
        try:
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle))
        except nvml.NVMLError:
            return xid
        dbe: int = nvml.nvmlEventTypeDoubleBitEccError
        return xid | (supported & dbe)

    def urgent(self, critical_c: float) -> str | None:
        """XID and double-bit ECC events (XIDs kept for the next `drain_xids`), then the
        temperature of each GPU and the volatile double-bit ECC count of each GPU that raises
        no events for it: one event wait and one or two reads per GPU, through the deadline
        watch."""
        self._pending_xids += self._read_events()
        if self._pending_xids:
            x = self._pending_xids[-1]
            return f"xid {x.xid} on gpu {x.gpu}"
        if self._dbe_signalled:
            index = min(self._dbe_signalled)
            self._dbe_signalled.clear()
            return f"gpu {index}: dbe event"
        dbe, vol = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        found = None
        for gpu in self._gpus:
            if gpu.handle is None:
                continue
            count = None
            if not gpu.dbe_events:
                count = self._call(
                    gpu, "ecc_dbe_volatile", nvml.nvmlDeviceGetTotalEccErrors, gpu.handle, dbe, vol
                )
            temp = self._call(
                gpu,
                "temp_gpu_c",
                nvml.nvmlDeviceGetTemperature,
                gpu.handle,
                nvml.NVML_TEMPERATURE_GPU,
            )
            hot = temp is not None and temp >= critical_c
            seen = self._urgent_seen.get(gpu.index, (count or 0, hot))
            self._urgent_seen[gpu.index] = (count or 0, hot)
            if found is None and ((count or 0) > seen[0] or (hot and not seen[1])):
                found = f"gpu {gpu.index}: dbe {count}, {temp} C"
        return found

    def drain_xids(self) -> list[XidEvent]:
        found, self._pending_xids = self._pending_xids + self._read_events(), []
        self._dbe_signalled.clear()  # the sweep this drain belongs to reads the counts
        return found

    def _read_events(self) -> list[XidEvent]:
        """The XID events waiting in the event set (at most `_MAX_XIDS_PER_DRAIN`); the GPUs
        that signalled a double-bit ECC error are noted in `_dbe_signalled`."""
        if self._events is None:
            return []
        by_address: dict[int | None, _Gpu] = {
            gpu.address: gpu for gpu in self._gpus if gpu.address is not None
        }
        found: list[XidEvent] = []
        for _ in range(_MAX_XIDS_PER_DRAIN):  # bounded: a storm cannot stall a sweep
            try:
                data = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as exc:
                self.errors["xid_events"] += 1
                log.warning("reading XID events failed (%s)", exc)
                break
            gpu = by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            if data.eventType == nvml.nvmlEventTypeDoubleBitEccError:
                self._dbe_signalled.add(gpu.index if gpu is not None else -1)
                continue
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            index, uuid = (gpu.index, gpu.uuid) if gpu is not None else (-1, None)
            found.append(XidEvent(gpu=index, xid=int(data.eventData), uuid=uuid, ts=time.time()))
        return found
