"""The per-GPU readings NVML also exposes as field ids, read in the one field-value batch.

Each pynvml call costs the agent's sweep thread tens of microseconds of Python (argument
structures, the error check, the deadline watch); ten of them per GPU per sweep were most of
the agent's CPU. NVML serves the same counters as field ids, so they ride in the
`nvmlDeviceGetFieldValues` call the agent makes anyway, each with its own return code.

A reading keeps the per-call function NVML had before the field id (where there is one):
when the batch answers "unsupported" for a field, the backend asks that function instead, so
a driver that lacks a field id but has the call loses nothing, and a GPU that has neither
reports the reading missing exactly as before. Names are the backend's failure keys (what is
logged once, counted, and never asked again), so they are the same as before the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from sentinel.agent.nvml import compat

Convert = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Scalar:
    """Reading fields that stand or fall together, their field ids and their per-call read."""

    key: str  # the failure key: logged once, counted, skipped when unsupported
    outputs: tuple[tuple[str, int, Convert], ...]  # (reading field, field id, convert)
    by_call: Callable[[Any], tuple[Any, ...]] | None  # the same values per call; None: none
    # Costly to the driver: read every `slow_every_s` (NvmlBackend), not every sweep.
    costly: bool = False


def _one(
    key: str,
    field_id: int,
    convert: Convert,
    call: Callable[[Any], Any] | None,
    costly: bool = False,
) -> Scalar:
    by_call = None if call is None else (lambda h: (convert(call(h)),))
    return Scalar(key, ((key, field_id, convert),), by_call, costly)


def scalars(lib: Any) -> tuple[Scalar, ...]:
    """The table, with per-call reads through `lib` (the deadline-traced pynvml)."""
    sbe, dbe = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    multi_sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    single_dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR

    def ecc(kind: int, counter: int) -> Callable[[Any], Any]:
        return lambda h: lib.nvmlDeviceGetTotalEccErrors(h, kind, counter)

    def pages(cause: int) -> Callable[[Any], Any]:
        # The call lists the pages; the field counts them. The reading is the count.
        return lambda h: len(lib.nvmlDeviceGetRetiredPages(h, cause))

    def rows(h: Any) -> tuple[Any, ...]:
        correctable, uncorrectable, pending, failure = lib.nvmlDeviceGetRemappedRows(h)
        return int(correctable), int(uncorrectable), bool(pending), bool(failure)

    fi = pynvml
    return (
        # Only field ids: nothing to fall back to.
        _one("temp_mem_c", fi.NVML_FI_DEV_MEMORY_TEMP, float, None),
        _one("recovery_action", compat.FI_DEV_GET_GPU_RECOVERY_ACTION, int, None),
        # Field ids with the per-call function the agent used before. On an H200 (driver 580)
        # the energy counter costs the driver ~3.1 ms of CPU a read and the PCIe replay count
        # ~0.17 ms, as a field or a call alike, where every other reading here costs under
        # 0.01 ms: at 1 Hz on 8 GPUs the energy alone was ~2.5% of a core. Both are counters,
        # judged as rates over minutes, so they are read every `slow_every_s`.
        _one(
            "energy_mj",
            fi.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            int,
            lib.nvmlDeviceGetTotalEnergyConsumption,
            costly=True,
        ),
        _one(
            "pcie_replay_count",
            fi.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
            int,
            lib.nvmlDeviceGetPcieReplayCounter,
            costly=True,
        ),
        _one("ecc_sbe_volatile", fi.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, int, ecc(sbe, vol)),
        _one("ecc_dbe_volatile", fi.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, int, ecc(dbe, vol)),
        _one("ecc_sbe_aggregate", fi.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, int, ecc(sbe, agg)),
        _one("ecc_dbe_aggregate", fi.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, int, ecc(dbe, agg)),
        _one("retired_pages_sbe", fi.NVML_FI_DEV_RETIRED_SBE, int, pages(multi_sbe)),
        _one("retired_pages_dbe", fi.NVML_FI_DEV_RETIRED_DBE, int, pages(single_dbe)),
        _one(
            "retired_pages_pending",
            fi.NVML_FI_DEV_RETIRED_PENDING,
            bool,
            lib.nvmlDeviceGetRetiredPagesPendingStatus,
        ),
        # One call gave all four, so they are missing together, under the call's old key.
        Scalar(
            "remapped_rows",
            (
                ("remapped_rows_correctable", fi.NVML_FI_DEV_REMAPPED_COR, int),
                ("remapped_rows_uncorrectable", fi.NVML_FI_DEV_REMAPPED_UNC, int),
                ("remapped_rows_pending", fi.NVML_FI_DEV_REMAPPED_PENDING, bool),
                ("remapped_rows_failure", fi.NVML_FI_DEV_REMAPPED_FAILURE, bool),
            ),
            rows,
        ),
    )
