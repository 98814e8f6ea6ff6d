"""NVML names that older nvidia-ml-py releases lack, for every release the agent allows.

The agent depends on nvidia-ml-py >= 12.535, whose pynvml predates the GPU recovery action,
the NVLink "active, traffic disabled" state, the unsigned-short field value type and the
name `c_nvmlProcessInfo_v3_t`. The numbers are NVML's ABI (nvml.h: they do not change between
releases), so where this pynvml names one, its own is used, and where it does not, the value
below is; an agent on an older pynvml then reads what its driver offers instead of failing to
import (seen on a GPU machine whose pynvml lacked the NVLink state).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml


def _named(name: str, value: int) -> int:
    return int(getattr(pynvml, name, value))


NVLINK_STATE_INACTIVE = _named("NVML_NVLINK_STATE_INACTIVE", 0)
NVLINK_STATE_ACTIVE = _named("NVML_NVLINK_STATE_ACTIVE", 1)
NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED = _named("NVML_NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED", 3)
FI_DEV_GET_GPU_RECOVERY_ACTION = _named("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
GPU_RECOVERY_ACTION_GPU_RESET = _named("NVML_GPU_RECOVERY_ACTION_GPU_RESET", 1)
GPU_RECOVERY_ACTION_DRAIN_AND_RESET = _named("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", 4)
VALUE_TYPE_UNSIGNED_SHORT = _named("NVML_VALUE_TYPE_UNSIGNED_SHORT", 6)
GPU_FABRIC_STATE_COMPLETED = _named("NVML_GPU_FABRIC_STATE_COMPLETED", 3)
# nvmlProcessInfo_v3_t has v2's layout (pid, usedGpuMemory, gpuInstanceId, computeInstanceId).
ProcessInfo: Any = getattr(pynvml, "c_nvmlProcessInfo_v3_t", None) or pynvml.c_nvmlProcessInfo_v2_t


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h lays it out (R525 on), for `nvmlDeviceGetGpuFabricInfo`:
    nvidia-ml-py 12.535's own class has an older layout (an 80-byte UUID, a partition id)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]
