"""The fake NVML library: build it, describe GPUs, serve them, and drive the real backend.

`fake_nvml.c` is compiled with gcc into `libnvidia-ml.so.1`; pynvml loads it with
`CDLL("libnvidia-ml.so.1")`, found through `LD_LIBRARY_PATH`. The dynamic loader reads that
variable once, at process start, so the backend runs in a child process (`driver.py`) started
with it set — `BackendProcess` below — and answers sweeps as JSON lines.

`FakeGpu` is what the library serves; `expected_reading()` is what the agent must make of it,
computed from the served values on their own (units converted, NVLink summed over active links),
and `expected_fingerprint()` the node's configuration fingerprint the backend must report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
DRIVER = HERE / "driver.py"
ROOT = HERE.parent.parent
LIBRARY_NAME = "libnvidia-ml.so.1"

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN

H100_FB_TOTAL = 85_520_809_984  # 81559 MiB, what NVML reports for an H100 80GB HBM3
DRIVER_VERSION = "570.124.06"
CUDA_DRIVER_VERSION = 12080  # nvmlSystemGetCudaDriverVersion_v2: 1000 * major + 10 * minor


def build_library(dest_dir: Path, *, old_driver: bool = False) -> Path:
    """Compile the fake into dest_dir/libnvidia-ml.so.1 and return dest_dir.

    `old_driver` leaves out what drivers before R520 lack (GPM, ClocksEventReasons).
    """
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("gcc is needed to build the fake NVML library (apt-get install gcc)")
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / LIBRARY_NAME
    cmd = [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(out)]
    cmd.append("-Wl,-soname," + LIBRARY_NAME)  # as the real one has: preloading by path works
    if old_driver:
        cmd.append("-DFAKE_NVML_OLD_DRIVER")
    subprocess.run([*cmd, str(SOURCE)], check=True, capture_output=True, text=True)
    return dest_dir


@dataclass
class FakeGpu:
    """One GPU as the fake library serves it (raw NVML units: mW, MHz, bytes, percent)."""

    index: int = 0
    uuid: str = ""
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = ""
    vbios: str = "96.00.A5.00.01"
    inforom: str = "G525.0225.00.03"  # the InfoROM image version
    persistence_mode: int = 1  # nvmlEnableState_t: 1 enabled
    ecc_mode: int = 1
    ecc_mode_pending: int = 1  # after the next reset: differs from ecc_mode while a change waits
    temp_gpu: int = 41
    temp_mem: int = 48
    power_mw: int = 312_456
    power_limit_mw: int = 700_000
    energy_mj: int = 98_765_432_100
    clock_sm: int = 1980
    clock_mem: int = 2619
    util_gpu: int = 87
    util_mem: int = 41
    fb_total: int = H100_FB_TOTAL
    fb_used: int = 62_914_560_000
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: int = 0
    remap_failure: int = 0
    clocks_event_reasons: int = 0
    pcie_replay: int = 0
    recovery_action: int = 0  # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, ...
    no_dbe_events: int = 0  # 1: the GPU raises no double-bit ECC events (polled instead)
    nvlink_state: list[int] = field(default_factory=lambda: [1] * 18)
    nvlink_replay: list[int] = field(default_factory=lambda: [0] * 18)
    nvlink_recovery: list[int] = field(default_factory=lambda: [0] * 18)
    nvlink_crc_flit: list[int] = field(default_factory=lambda: [0] * 18)
    nvlink_crc_data: list[int] = field(default_factory=lambda: [0] * 18)
    gpm_supported: int = 1
    tensor_util: float = 37.5  # percent, as NVML's GPM metric gives it
    processes: list[tuple[int, int]] = field(default_factory=lambda: [(4242, 8 << 30)])
    errors: dict[str, int] = field(default_factory=dict)  # error.<key> = NVML code
    missing_fields: list[int] = field(default_factory=list)  # field ids the driver lacks
    lost: bool = False
    # The NVLink fabric (NVL72-like): its cluster UUID and the GPU's clique; "" serves a GPU on
    # no fabric (NOT_SUPPORTED). fabric_state: nvmlGpuFabricState_t, 3 once registered.
    fabric_cluster: str = ""
    fabric_clique: int = 0
    fabric_state: int = 3

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.index:08x}-fake-4b1d-9c2e-{self.index:012x}"
        self.pci_bus_id = self.pci_bus_id or f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"

    @property
    def fb_free(self) -> int:
        return self.fb_total - self.fb_used

    def render(self) -> str:
        def ints(values: Iterable[int]) -> str:
            return ",".join(str(v) for v in values)

        lines = [f"[gpu {self.index}]", f"uuid = {self.uuid}", f"name = {self.name}"]
        lines.append(f"pci_bus_id = {self.pci_bus_id}")
        lines.append(f"vbios = {self.vbios}")
        lines.append(f"inforom = {self.inforom}")
        if self.fabric_cluster:
            lines.append(f"fabric_cluster = {self.fabric_cluster}")
            lines.append(f"fabric_clique = {self.fabric_clique}")
            lines.append(f"fabric_state = {self.fabric_state}")
        for key in _NUMBER_KEYS:
            lines.append(f"{key} = {getattr(self, key)}")
        lines.append(f"fb_free = {self.fb_free}")
        lines.append(f"clocks_event_reasons = {self.clocks_event_reasons:#x}")
        for key in ("nvlink_state", "nvlink_replay", "nvlink_recovery"):
            lines.append(f"{key} = {ints(getattr(self, key))}")
        lines.append(f"nvlink_crc_flit = {ints(self.nvlink_crc_flit)}")
        lines.append(f"nvlink_crc_data = {ints(self.nvlink_crc_data)}")
        lines.append(f"gpm_supported = {self.gpm_supported}")
        lines.append(f"tensor_util = {self.tensor_util!r}")
        lines.append("processes = " + ",".join(f"{pid}:{mem}" for pid, mem in self.processes))
        lines.extend(f"error.{key} = {code}" for key, code in sorted(self.errors.items()))
        lines.append(f"lost = {int(self.lost)}")
        if self.missing_fields:
            lines.append(f"missing_fields = {ints(self.missing_fields)}")
        return "\n".join(lines) + "\n"


_NUMBER_KEYS = [
    "temp_gpu",
    "temp_mem",
    "power_mw",
    "power_limit_mw",
    "energy_mj",
    "clock_sm",
    "clock_mem",
    "util_gpu",
    "util_mem",
    "fb_total",
    "fb_used",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_sbe",
    "retired_dbe",
    "retired_pending",
    "remap_correctable",
    "remap_uncorrectable",
    "remap_pending",
    "remap_failure",
    "pcie_replay",
    "recovery_action",
    "no_dbe_events",
    "persistence_mode",
    "ecc_mode",
    "ecc_mode_pending",
]


def write_config(
    path: Path,
    gpus: Sequence[FakeGpu],
    xids: Sequence[tuple[int, int]] = (),
    init_error: int = 0,
    hang: str = "",
    *,
    driver_version: str = DRIVER_VERSION,
    cuda_driver_version: int = CUDA_DRIVER_VERSION,
    system_errors: Mapping[str, int] | None = None,
) -> None:
    """Write the config atomically (a new inode each time), so the library sees every change.

    `hang` names an NVML C function (or `*` for all) that blocks until a later config drops it;
    `system_errors` makes a system-wide call fail (`driver_version`, `cuda_driver_version`: an
    NVML code).
    """
    text = [f"init_error = {init_error}\n"]
    if hang:
        text.append(f"hang = {hang}\n")
    text.append(f"driver_version = {driver_version}\n")
    text.append(f"cuda_driver_version = {cuda_driver_version}\n")
    text.extend(f"error.{key} = {code}\n" for key, code in sorted((system_errors or {}).items()))
    text.extend(f"xid = {gpu} {code}\n" for gpu, code in xids)
    text.extend(gpu.render() for gpu in gpus)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(text))
    os.replace(tmp, path)


def expected_reading(gpu: FakeGpu, *, tensor_active: bool = True) -> dict[str, Any]:
    """The reading the agent must produce for what `gpu` serves (the test oracle)."""
    active = [i for i, state in enumerate(gpu.nvlink_state) if state == 1]
    reset = gpu.recovery_action in (1, 4)  # GPU_RESET, DRAIN_AND_RESET

    def over_active(values: list[int]) -> int | None:
        return sum(values[i] for i in active) if active else None

    crc = [f + d for f, d in zip(gpu.nvlink_crc_flit, gpu.nvlink_crc_data, strict=True)]
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "lost": False,
        "temp_gpu_c": float(gpu.temp_gpu),
        "temp_mem_c": float(gpu.temp_mem),
        "power_w": gpu.power_mw / 1000.0,
        "power_limit_w": gpu.power_limit_mw / 1000.0,
        "energy_mj": gpu.energy_mj,
        "sm_clock_mhz": gpu.clock_sm,
        "mem_clock_mhz": gpu.clock_mem,
        "util_gpu_pct": gpu.util_gpu,
        "util_mem_pct": gpu.util_mem,
        "fb_used_bytes": gpu.fb_used,
        "fb_free_bytes": gpu.fb_free,
        "fb_total_bytes": gpu.fb_total,
        "ecc_sbe_volatile": gpu.ecc_sbe_volatile,
        "ecc_dbe_volatile": gpu.ecc_dbe_volatile,
        "ecc_sbe_aggregate": gpu.ecc_sbe_aggregate,
        "ecc_dbe_aggregate": gpu.ecc_dbe_aggregate,
        "retired_pages_sbe": gpu.retired_sbe,
        "retired_pages_dbe": gpu.retired_dbe,
        "retired_pages_pending": bool(gpu.retired_pending),
        "remapped_rows_correctable": gpu.remap_correctable,
        "remapped_rows_uncorrectable": gpu.remap_uncorrectable,
        "remapped_rows_pending": bool(gpu.remap_pending),
        "remapped_rows_failure": bool(gpu.remap_failure),
        "throttle_reasons": gpu.clocks_event_reasons,
        "pcie_replay_count": gpu.pcie_replay,
        "nvlink_crc_errors": over_active(crc),
        "nvlink_replay_errors": over_active(gpu.nvlink_replay),
        "nvlink_recovery_errors": over_active(gpu.nvlink_recovery),
        "tensor_active": gpu.tensor_util / 100.0 if gpu.gpm_supported and tensor_active else None,
        "nvlink_links_down": [] if active else None,  # every link active at start still is
        "recovery_action": gpu.recovery_action,
        "reset_required": reset,
        "processes": [{"pid": pid, "used_memory_bytes": mem} for pid, mem in gpu.processes],
    }


def expected_fingerprint(
    gpus: Sequence[FakeGpu],
    driver_version: str = DRIVER_VERSION,
    cuda_driver_version: int = CUDA_DRIVER_VERSION,
) -> dict[str, str]:
    """The NVML fingerprint fields the backend must report for what the library serves, every
    call answering (a test drops the fields it makes fail)."""

    def mode(value: int) -> str:
        return "on" if value else "off"

    major, minor = divmod(cuda_driver_version, 1000)
    fields = {"driver": driver_version, "cuda_driver": f"{major}.{minor // 10}"}
    for gpu in gpus:
        at = f"gpu.{gpu.index}."
        fields |= {
            at + "name": gpu.name,
            at + "vbios": gpu.vbios,
            at + "inforom": gpu.inforom,
            at + "persistence": mode(gpu.persistence_mode),
            at + "ecc": mode(gpu.ecc_mode),
        }
        if mode(gpu.ecc_mode_pending) != mode(gpu.ecc_mode):
            fields[at + "ecc_pending"] = mode(gpu.ecc_mode_pending)
    domains = sorted(
        {
            f"{g.fabric_cluster.lower()}/{g.fabric_clique}"
            for g in gpus
            if g.fabric_cluster and g.fabric_state == 3
        }
    )
    if domains:
        fields["nvlink_domain"] = ",".join(domains)
    return fields


def fake_env(lib_dir: Path, config: Path) -> dict[str, str]:
    """The environment of a process whose pynvml must load the fake library."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(lib_dir), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env["FAKE_NVML_CONFIG"] = str(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class BackendProcess:
    """The real NvmlBackend in a child process, one JSON reply per command."""

    def __init__(
        self,
        lib_dir: Path,
        config: Path,
        log_path: Path,
        pynvml_dir: Path | None = None,
        slow_every_s: float = 0.0,
    ) -> None:
        """`pynvml_dir`: a folder holding another nvidia-ml-py release, found before the venv's;
        `slow_every_s`: the backend's cadence of costly readings (0: every sweep)."""
        self.log_path = log_path
        self._log = log_path.open("w")
        env = fake_env(lib_dir, config) | {"FAKE_DRIVER_SLOW_EVERY_S": str(slow_every_s)}
        if pynvml_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join((str(pynvml_dir), env["PYTHONPATH"]))
        self._proc = subprocess.Popen(
            [sys.executable, str(DRIVER)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.hello = self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=10)
            raise RuntimeError(f"backend process died:\n{self.log_path.read_text()}")
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._reply()

    def sweep(self) -> list[dict[str, Any]]:
        return self.ask("sweep")["readings"]

    def close(self) -> str:
        """Stop the process; returns everything it logged."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        self._log.close()
        return self.log_path.read_text()
