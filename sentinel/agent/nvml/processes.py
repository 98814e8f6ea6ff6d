"""A GPU's compute processes, read into an array kept between sweeps.

pynvml's `nvmlDeviceGetComputeRunningProcesses` calls the driver twice (once for the count,
once for the list) into a fresh array, and builds a Python object per process through
`_PrintableStructure.__getattribute__`: about a tenth of an 8-GPU sweep. This reader asks once
into an array sized for the processes a GPU normally has (grown, and asked again, when the
driver says it is too small) and decodes it with `struct`.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import pynvml as nvml

from sentinel.agent.nvml import compat
from sentinel.agent.nvml.readings import GpuProcess

# nvmlProcessInfo_v3_t: pid, (padding), usedGpuMemory, gpuInstanceId, computeInstanceId
_ENTRY = struct.Struct("=I4xQ8x")
_NOT_AVAILABLE = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


class ProcessReader:
    """nvmlDeviceGetComputeRunningProcesses_v3 for any GPU, one at a time (one thread)."""

    def __init__(self, capacity: int = 32) -> None:
        if _ENTRY.size != ctypes.sizeof(compat.ProcessInfo):
            raise RuntimeError("this pynvml's nvmlProcessInfo_v3_t layout is not the one expected")
        self._fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        self._count = ctypes.c_uint(0)
        self._resize(capacity)

    def _resize(self, capacity: int) -> None:
        self._array = (compat.ProcessInfo * capacity)()

    def read(self, handle: Any) -> tuple[GpuProcess, ...]:
        """The GPU's compute processes; raises NVMLError as pynvml's call does."""
        for _ in range(2):  # a second try after growing: processes may start in between
            self._count.value = len(self._array)
            ret = self._fn(handle, ctypes.byref(self._count), self._array)
            if ret != nvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            self._resize(self._count.value * 2 + 5)
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        listed = bytes(self._array)[: self._count.value * _ENTRY.size]
        return tuple(
            GpuProcess(pid, None if used == _NOT_AVAILABLE else used)
            for pid, used in _ENTRY.iter_unpack(listed)
        )
