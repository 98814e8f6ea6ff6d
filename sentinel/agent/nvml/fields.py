"""Many NVML field values in one call, read back without pynvml's per-attribute overhead.

pynvml's `nvmlDeviceGetFieldValues` builds a fresh array and its structures route every
attribute access through Python (`_PrintableStructure.__getattribute__`, ~1 µs each): with 18
NVLink links x 3 counters that alone cost about a millisecond per 8-GPU sweep. A batch builds
the request array once (pynvml's own structure type, so the layout is pynvml's), calls the C
function through pynvml's loaded library, and decodes the returned memory with `struct`.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pynvml as nvml

from sentinel.agent.nvml import compat

# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value union
_LAYOUT = struct.Struct("=IIqqII8s")
# What a sweep reads of each entry: valueType, nvmlReturn, and the value's 8 bytes as an
# unsigned 64-bit integer, which is the value itself for the (unsigned) long long counters
# that make up most of a batch; the others are converted from it (`_CONVERT`).
_ENTRY = "24xIIQ"
_U64 = struct.Struct("=Q")


def _as_double(raw: int) -> float:
    return float(struct.unpack("=d", _U64.pack(raw))[0])


def _as_signed(bits: int) -> Callable[[int], int]:
    top, mask = 1 << (bits - 1), (1 << bits) - 1
    return lambda raw: ((raw & mask) ^ top) - top


def _as_unsigned(bits: int) -> Callable[[int], int]:
    mask = (1 << bits) - 1
    return lambda raw: raw & mask


_CONVERT: dict[int, Callable[[int], int | float]] = {
    nvml.NVML_VALUE_TYPE_DOUBLE: _as_double,
    nvml.NVML_VALUE_TYPE_UNSIGNED_INT: _as_unsigned(32),
    nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: _as_signed(64),
    nvml.NVML_VALUE_TYPE_SIGNED_INT: _as_signed(32),
    compat.VALUE_TYPE_UNSIGNED_SHORT: _as_unsigned(16),
}


class FieldBatch:
    """A fixed list of (field id, scope id) read with one nvmlDeviceGetFieldValues call.

    The whole answer is unpacked by one `struct` call; only the entries whose type is not a
    64-bit unsigned integer are converted in Python, by a plan kept for the types the driver
    answered last (they do not change between sweeps of one GPU).
    """

    def __init__(self, requests: Sequence[tuple[int, int]]) -> None:
        if _LAYOUT.size != ctypes.sizeof(nvml.c_nvmlFieldValue_t):
            raise RuntimeError("this pynvml's nvmlFieldValue_t layout is not the one expected")
        self.requests = list(requests)
        self._array = (nvml.c_nvmlFieldValue_t * len(self.requests))()
        for slot, (field_id, scope_id) in zip(self._array, self.requests, strict=True):
            slot.fieldId, slot.scopeId = field_id, scope_id
        self._count = ctypes.c_int32(len(self.requests))
        self._fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        self._entries = struct.Struct("=" + _ENTRY * len(self.requests))
        self._types: tuple[int, ...] = ()
        self._plan: list[tuple[int, Callable[[int], int | float]]] = []

    def read(self, handle: Any) -> tuple[Sequence[int], list[int | float]]:
        """The nvmlReturn and the value of each request, in order; raises NVMLError if the
        call fails. A value whose own return is not success is meaningless."""
        ret = self._fn(handle, self._count, ctypes.byref(self._array))
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        flat = self._entries.unpack_from(self._array)
        types, codes, values = flat[0::3], flat[1::3], list(flat[2::3])
        if types != self._types:
            self._types = types
            self._plan = [(i, _CONVERT[t]) for i, t in enumerate(types) if t in _CONVERT]
        for i, convert in self._plan:
            values[i] = convert(values[i])
        return codes, values
