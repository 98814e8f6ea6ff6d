"""The field-value batch's decoding, for every value type NVML can answer with.

The fake library answers only unsigned ints and unsigned long longs, so this test stands in
for the driver: it fills the answer array the way nvmlDeviceGetFieldValues does, with the
union's unused upper bytes left dirty, and checks each decoded value and return code.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from sentinel.agent.nvml import fields as nvml_fields
from sentinel.agent.nvml.fields import FieldBatch

ANSWERS: list[tuple[int, str, Any]] = [  # (value type, union member, value)
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", -2.5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 1 << 40),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", (1 << 64) - 2),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(1 << 50)),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -7),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65_000),
]


def fake_driver(answers: list[tuple[int, str, Any]], failed: int | None) -> Any:
    def get_field_values(_handle: Any, count: ctypes.c_int32, array_ref: Any) -> int:
        array = array_ref._obj
        assert count.value == len(array) == len(answers)
        for i, (slot, (value_type, member, value)) in enumerate(zip(array, answers, strict=True)):
            slot.value.ullVal = 0xDEAD_BEEF_DEAD_BEEF  # a previous answer's bytes
            slot.valueType = value_type
            setattr(slot.value, member, value)
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if i == failed else 0
        return pynvml.NVML_SUCCESS

    return get_field_values


@pytest.mark.parametrize("failed", [None, 2])
def test_every_value_type_decodes_and_each_entry_keeps_its_code(
    monkeypatch: pytest.MonkeyPatch, failed: int | None
) -> None:
    monkeypatch.setattr(
        nvml_fields.nvml, "_nvmlGetFunctionPointer", lambda _: fake_driver(ANSWERS, failed)
    )
    batch = FieldBatch([(100 + i, 0) for i in range(len(ANSWERS))])
    for _ in range(2):  # the second read reuses the conversion plan of the first
        codes, values = batch.read(handle=None)
        assert list(codes) == [
            pynvml.NVML_ERROR_NOT_SUPPORTED if i == failed else 0 for i in range(len(ANSWERS))
        ]
        assert values == [value for _, _, value in ANSWERS]


def test_a_failed_call_raises_the_nvml_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        nvml_fields.nvml,
        "_nvmlGetFunctionPointer",
        lambda _: lambda *_: pynvml.NVML_ERROR_GPU_IS_LOST,
    )
    with pytest.raises(pynvml.NVMLError) as raised:
        FieldBatch([(1, 0)]).read(handle=None)
    assert raised.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
