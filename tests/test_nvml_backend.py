"""The agent's real pynvml path against the fake libnvidia-ml (tests/fake_nvml/).

Each test runs NvmlBackend in a child process whose LD_LIBRARY_PATH finds the fake library,
serves values from a config file, and checks every collected field against what was served.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
from fake_nvml import (
    DRIVER,
    DRIVER_NOT_LOADED,
    NO_PERMISSION,
    NOT_SUPPORTED,
    UNKNOWN,
    BackendProcess,
    FakeGpu,
    build_library,
    expected_reading,
    fake_env,
    write_config,
)

Starter = Callable[[], BackendProcess]


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture(scope="session")
def old_fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml-old"), old_driver=True)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tmp_path / "fake-nvml.conf"


@pytest.fixture
def start(fake_lib: Path, config: Path, tmp_path: Path) -> Iterator[Starter]:
    procs: list[BackendProcess] = []

    def _start() -> BackendProcess:
        proc = BackendProcess(fake_lib, config, tmp_path / f"backend-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield _start
    for proc in procs:
        proc.close()


def distinct_gpu(index: int) -> FakeGpu:
    """A GPU whose every value differs from the defaults and from the other GPUs'."""
    k = index + 1
    links = 12 + index
    return FakeGpu(
        index=index,
        temp_gpu=40 + k,
        temp_mem=50 + k,
        power_mw=300_123 + k,
        power_limit_mw=650_000 + k * 1000,
        energy_mj=10**11 + k,
        clock_sm=1700 + k,
        clock_mem=2600 + k,
        util_gpu=80 + k,
        util_mem=30 + k,
        fb_used=10**10 + k,
        ecc_sbe_volatile=10 + k,
        ecc_dbe_volatile=k,
        ecc_sbe_aggregate=100 + k,
        ecc_dbe_aggregate=2 * k,
        retired_sbe=k,
        retired_dbe=k + 1,
        retired_pending=index % 2,
        remap_correctable=5 + k,
        remap_uncorrectable=k,
        remap_pending=(index + 1) % 2,
        remap_failure=index % 2,
        clocks_event_reasons=0x20 | (0x8 << index),
        pcie_replay=7 * k,
        nvlink_state=[0 if link == 3 else 1 for link in range(links)],
        nvlink_replay=[link + k for link in range(links)],
        nvlink_recovery=[2 * link for link in range(links)],
        nvlink_crc_flit=[link * k for link in range(links)],
        nvlink_crc_data=[1000] * links,  # link 3 is inactive: its 1000 must not count
        tensor_util=10.0 * k + 0.25,
        processes=[(1000 + k, k << 30), (2000 + k, (k + 1) << 30)],
    )


def assert_matches(reading: dict[str, object], gpu: FakeGpu, **overrides: object) -> None:
    expected = expected_reading(gpu) | overrides
    assert reading == expected


def test_every_field_matches_what_the_library_served(start: Starter, config: Path) -> None:
    gpus = [distinct_gpu(i) for i in range(3)]
    gpus[2].gpm_supported = 0  # pre-Hopper: no GPM
    gpus[2].processes = []
    write_config(config, gpus)
    backend = start()
    assert backend.hello == {"gpus": 3}

    first = backend.sweep()  # GPM needs two samples: no tensor activity on the first sweep
    for reading, gpu in zip(first, gpus, strict=True):
        assert_matches(reading, gpu, tensor_active=None)
    second = backend.sweep()
    for reading, gpu in zip(second, gpus, strict=True):
        assert_matches(reading, gpu)
    assert backend.ask("errors") == {"errors": {}, "unsupported": [[], [], ["tensor_active"]]}


OLDEST_PYNVML = Path(sys.executable).parent.parent / "pynvml-oldest"  # made by `make venv`


def test_the_backend_reads_everything_on_the_oldest_pynvml_it_allows(
    fake_lib: Path, config: Path, tmp_path: Path
) -> None:
    """nvidia-ml-py 12.535 (the floor in pyproject.toml) lacks names the backend uses (the
    recovery-action field, NVLink states, the v3 process structure): they come from
    nvml_compat, and every reading is still served. A GPU machine's older pynvml once stopped
    the agent at import."""
    assert (OLDEST_PYNVML / "pynvml.py").exists(), f"{OLDEST_PYNVML} missing: run `make venv`"
    gpus = [distinct_gpu(i) for i in range(2)]
    gpus[1].recovery_action = 1  # GPU reset requested
    write_config(config, gpus)
    backend = BackendProcess(fake_lib, config, tmp_path / "backend.log", OLDEST_PYNVML)
    try:
        assert backend.ask("pynvml")["pynvml"] == str(OLDEST_PYNVML / "pynvml.py")
        backend.sweep()
        for reading, gpu in zip(backend.sweep(), gpus, strict=True):
            assert_matches(reading, gpu)
        assert backend.ask("errors")["errors"] == {}
        gpus[1].nvlink_state[1] = 3  # active at start, now active with traffic disabled: down
        write_config(config, gpus)
        assert backend.sweep()[1]["nvlink_links_down"] == [1]
    finally:
        backend.close()


@pytest.mark.parametrize("as_field", [True, False], ids=["field", "per-call"])
def test_costly_readings_are_read_at_their_cadence_and_carried_between(
    fake_lib: Path, config: Path, tmp_path: Path, as_field: bool
) -> None:
    """Energy and PCIe replays (milliseconds of driver CPU on an H200) are read once per
    `slow_every_s`; sweeps between carry the last values while every other reading moves.
    A driver without their field ids reads them per call, at the same cadence."""
    gpus = [distinct_gpu(0)]
    if not as_field:
        gpus[0].missing_fields = [83, 94]  # energy, PCIe replays
    write_config(config, gpus)
    backend = BackendProcess(fake_lib, config, tmp_path / "b.log", slow_every_s=3600.0)
    try:
        first = backend.sweep()[0]
        assert_matches(first, gpus[0], tensor_active=None)
        served = first["energy_mj"], first["pcie_replay_count"]
        for _ in range(3):
            gpus[0].energy_mj += 1000
            gpus[0].pcie_replay += 1
            gpus[0].temp_gpu += 1
            write_config(config, gpus)
            reading = backend.sweep()[0]
            assert (reading["energy_mj"], reading["pcie_replay_count"]) == served
            assert reading["temp_gpu_c"] == gpus[0].temp_gpu
        calls = backend.ask("calls")["calls"]
        if not as_field:  # asked once each (the sweep that found the fields missing)
            assert calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
            assert calls["nvmlDeviceGetPcieReplayCounter"] == 1
        assert backend.ask("errors")["errors"] == {}
    finally:
        backend.close()


def test_values_changing_between_sweeps_are_picked_up(start: Starter, config: Path) -> None:
    gpus = [distinct_gpu(i) for i in range(2)]
    write_config(config, gpus)
    backend = start()
    backend.sweep()
    for _ in range(2):
        gpus[1].temp_gpu += 9
        gpus[1].ecc_dbe_volatile += 1
        gpus[1].remap_pending, gpus[1].remap_failure = 1, 1
        gpus[1].clocks_event_reasons |= 0x40  # HW thermal slowdown
        gpus[1].nvlink_crc_flit[0] += 5
        gpus[1].tensor_util = 91.5
        gpus[0].processes = [(31337, 1 << 20)]
        write_config(config, gpus)
        for reading, gpu in zip(backend.sweep(), gpus, strict=True):
            assert_matches(reading, gpu)


def test_a_gpu_with_more_processes_than_the_reader_expects_lists_them_all(
    start: Starter, config: Path
) -> None:
    """The process list is read into an array kept between sweeps (32 entries): a GPU with
    more makes the reader grow it and ask again, within the same sweep."""
    gpus = [distinct_gpu(0)]
    write_config(config, gpus)
    backend = start()
    assert_matches(backend.sweep()[0], gpus[0], tensor_active=None)
    for many in (50, 3, 64):
        gpus[0].processes = [(7000 + i, i << 20) for i in range(many)]
        write_config(config, gpus)
        assert_matches(backend.sweep()[0], gpus[0])


@pytest.mark.parametrize("dbe_events", [True, False], ids=["dbe-events", "dbe-polled"])
def test_the_urgent_check_sees_dbe_heat_and_xids_and_keeps_the_xids(
    start: Starter, config: Path, dbe_events: bool
) -> None:
    """Between sweeps the agent reads only the event set (XIDs, and double-bit ECC errors on
    a GPU that raises events for them), the temperature, and the volatile DBE count of a GPU
    that raises none; each moving is reported once, and an XID seen there is still drained."""
    gpus = [distinct_gpu(i) for i in range(2)]
    gpus[0].temp_gpu = gpus[1].temp_gpu = 60
    for gpu in gpus:
        gpu.no_dbe_events = int(not dbe_events)
    write_config(config, gpus)
    backend = start()
    backend.sweep()
    polled_before = backend.ask("calls")["calls"].get("nvmlDeviceGetTotalEccErrors", 0)
    assert backend.ask("urgent 92")["urgent"] is None
    gpus[1].ecc_dbe_volatile += 1
    write_config(config, gpus)
    assert backend.ask("urgent 92")["urgent"].startswith("gpu 1: dbe")
    assert backend.ask("urgent 92")["urgent"] is None  # reported once
    polled = backend.ask("calls")["calls"].get("nvmlDeviceGetTotalEccErrors", 0) - polled_before
    assert polled == (0 if dbe_events else 2 * 3)  # 2 GPUs, 3 checks
    gpus[0].temp_gpu = 96
    write_config(config, gpus)
    assert backend.ask("urgent 92")["urgent"].startswith("gpu 0:")
    write_config(config, gpus, xids=[(1, 79)])
    assert backend.ask("urgent 92")["urgent"] == "xid 79 on gpu 1"
    assert [(x["gpu"], x["xid"]) for x in backend.ask("xids")["xids"]] == [(1, 79)]


def test_unsupported_fields_are_none_logged_once_and_not_asked_again(
    start: Starter, config: Path
) -> None:
    gpus = [distinct_gpu(i) for i in range(2)]
    gpus[0].errors = {
        key: NOT_SUPPORTED
        for key in (
            "temp_gpu",
            "temp_mem",
            "util",
            "ecc_dbe_aggregate",
            "retired_pages",
            "remapped_rows",
            "pcie_replay",
            "clocks_event",
            "processes",
        )
    }
    gpus[0].errors["power"] = UNKNOWN  # a transient failure: logged once, asked again
    gpus[0].gpm_supported = 0
    write_config(config, gpus)
    backend = start()
    missing = dict.fromkeys(
        [
            "temp_gpu_c",
            "temp_mem_c",
            "util_gpu_pct",
            "util_mem_pct",
            "ecc_dbe_aggregate",
            "retired_pages_sbe",
            "retired_pages_dbe",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
            "pcie_replay_count",
            "throttle_reasons",
            "power_w",
            "tensor_active",
        ]
    )
    backend.sweep()  # primes GPU 1's GPM pair; then three checked sweeps
    for _ in range(3):
        first, second = backend.sweep()
        assert_matches(first, gpus[0], processes=[], **missing)
        assert_matches(second, gpus[1])
    errors = backend.ask("errors")
    assert errors["errors"] == {"power_w": 4}
    assert set(errors["unsupported"][0]) == {
        "temp_gpu_c",
        "temp_mem_c",
        "utilization",
        "ecc_dbe_aggregate",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "remapped_rows",
        "pcie_replay_count",
        "throttle_reasons",
        "processes",
        "tensor_active",
    }
    # Unsupported: asked once on GPU 0, then never again (GPU 1 is asked every sweep).
    calls = backend.ask("calls")["calls"]
    assert calls["nvmlDeviceGetTemperature"] == 1 + 4
    # Remapped rows ride in the field values; GPU 0's "unsupported" there is checked once
    # against the per-call function (an older driver may have the call and not the field).
    assert calls["nvmlDeviceGetRemappedRows"] == 1
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1 + 4
    assert calls["nvmlDeviceGetPowerUsage"] == 4 + 4  # the transient failure is retried

    del gpus[0].errors["power"]  # the transient failure clears: the value flows again
    write_config(config, gpus)
    assert backend.sweep()[0]["power_w"] == gpus[0].power_mw / 1000.0

    log = [json.loads(line) for line in backend.close().splitlines()]
    messages = [entry["msg"] for entry in log]
    for key in ("temp_gpu_c", "temp_mem_c", "utilization", "remapped_rows", "processes"):
        assert sum(f"gpu 0: {key} unavailable" in m for m in messages) == 1, key
    assert sum("gpu 0: reading power_w failed" in m for m in messages) == 1
    assert not any("gpu 1:" in m for m in messages)


def test_fields_the_driver_lacks_are_read_per_call(start: Starter, config: Path) -> None:
    """A driver that knows the call but not the field id: the value still flows, from the call,
    and the batch stops asking for that field."""
    gpus = [distinct_gpu(i) for i in range(2)]
    lacking = [
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        pynvml.NVML_FI_DEV_RETIRED_SBE,
        pynvml.NVML_FI_DEV_RETIRED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,  # one of the four: the group is read per call
    ]
    gpus[0].missing_fields = lacking
    write_config(config, gpus)
    backend = start()
    for _ in range(3):
        for reading, gpu in zip(backend.sweep(), gpus, strict=True):
            assert_matches(reading, gpu, tensor_active=reading["tensor_active"])
        gpus[0].ecc_dbe_volatile += 1
        gpus[0].energy_mj += 1000
        gpus[0].remap_uncorrectable += 1
        write_config(config, gpus)
    assert backend.ask("errors") == {"errors": {}, "unsupported": [[], []]}
    calls = backend.ask("calls")["calls"]
    assert calls["nvmlDeviceGetTotalEnergyConsumption"] == 3  # GPU 0 only, once per sweep
    assert calls["nvmlDeviceGetRemappedRows"] == 3
    assert calls["nvmlDeviceGetRetiredPages"] == 3  # SBE only: DBE still rides in the batch
    assert calls["nvmlDeviceGetTotalEccErrors"] == 3  # volatile DBE; the other three: batch


def test_a_failed_field_is_one_missing_field(start: Starter, config: Path) -> None:
    """A transient failure of one field in the batch: that field is missing (counted, logged
    once, asked again), every other field of the same call still flows."""
    gpus = [distinct_gpu(i) for i in range(2)]
    gpus[1].errors = {"ecc_sbe_aggregate": UNKNOWN, "remapped_rows": UNKNOWN}
    write_config(config, gpus)
    backend = start()
    missing = dict.fromkeys(
        [
            "ecc_sbe_aggregate",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        ]
    )
    for _ in range(2):
        first, second = backend.sweep()
        assert_matches(first, gpus[0], tensor_active=first["tensor_active"])
        assert_matches(second, gpus[1], tensor_active=second["tensor_active"], **missing)
    errors = backend.ask("errors")
    assert errors == {
        "errors": {"ecc_sbe_aggregate": 2, "remapped_rows": 2},
        "unsupported": [[], []],
    }
    del gpus[1].errors["ecc_sbe_aggregate"]  # it clears: asked again, so it flows again
    write_config(config, gpus)
    assert backend.sweep()[1]["ecc_sbe_aggregate"] == gpus[1].ecc_sbe_aggregate
    messages = [json.loads(line)["msg"] for line in backend.close().splitlines()]
    assert sum("gpu 1: reading ecc_sbe_aggregate failed" in m for m in messages) == 1
    assert sum("gpu 1: reading remapped_rows failed" in m for m in messages) == 1


def test_nvlink_falls_back_to_per_link_counters(start: Starter, config: Path) -> None:
    """Drivers without the per-link DL field values: nvmlDeviceGetNvLinkErrorCounter per link.
    A counter the GPU lacks (CRC data here) is left out of its sum; no NVLink at all is None."""
    gpus = [distinct_gpu(i) for i in range(3)]
    gpus[0].errors = {"nvlink_fields": NOT_SUPPORTED}
    gpus[1].errors = {"nvlink_fields": NOT_SUPPORTED, "nvlink_crc_data": NOT_SUPPORTED}
    gpus[2].nvlink_state = []  # a PCIe card
    write_config(config, gpus)
    backend = start()
    backend.sweep()
    first, second, third = backend.sweep()
    assert_matches(first, gpus[0])
    active = [i for i, s in enumerate(gpus[1].nvlink_state) if s]
    assert_matches(
        second, gpus[1], nvlink_crc_errors=sum(gpus[1].nvlink_crc_flit[i] for i in active)
    )
    assert_matches(
        third,
        gpus[2],
        nvlink_crc_errors=None,
        nvlink_replay_errors=None,
        nvlink_recovery_errors=None,
    )


def test_lost_gpu_is_reported_and_the_others_still_flow(start: Starter, config: Path) -> None:
    gpus = [distinct_gpu(i) for i in range(4)]
    gpus[3].lost = True  # lost before the agent started: not even a handle
    write_config(config, gpus)
    backend = start()
    assert backend.sweep()[3] == {**_lost(gpus[3]), "uuid": None, "name": None, "pci_bus_id": None}

    gpus[1].lost = True  # falls off the bus while running
    write_config(config, gpus)
    for _ in range(2):
        readings = backend.sweep()
        assert readings[1] == _lost(gpus[1])
        assert_matches(readings[0], gpus[0])
        assert_matches(readings[2], gpus[2])

    gpus[1].lost = gpus[3].lost = False  # reset by an operator: both answer again
    write_config(config, gpus)
    readings = backend.sweep()
    assert_matches(readings[1], gpus[1], tensor_active=None)  # GPM restarts its pair
    assert_matches(readings[3], gpus[3], tensor_active=None)
    log = backend.close()
    assert log.count("gpu 1 is lost") == 1
    assert log.count("gpu 3 is lost") == 1
    assert "Traceback" not in log


def test_gpu_without_a_handle_reads_empty_not_lost(start: Starter, config: Path) -> None:
    gpus = [distinct_gpu(i) for i in range(2)]
    gpus[0].errors = {"handle": NO_PERMISSION}  # e.g. a device cgroup hides it
    write_config(config, gpus)
    backend = start()
    backend.sweep()
    first, second = backend.sweep()
    assert first == {**dict.fromkeys(first), "index": 0, "lost": False, "processes": []}
    assert_matches(second, gpus[1])


def test_an_older_driver_without_gpm_or_clocks_event_reasons(
    old_fake_lib: Path, config: Path, tmp_path: Path
) -> None:
    """The functions are missing from the library (FUNCTION_NOT_FOUND): throttle reasons come
    from the older ClocksThrottleReasons call, tensor activity is reported as missing."""
    gpus = [distinct_gpu(i) for i in range(2)]
    write_config(config, gpus)
    backend = BackendProcess(old_fake_lib, config, tmp_path / "old.log")
    try:
        for _ in range(2):
            for reading, gpu in zip(backend.sweep(), gpus, strict=True):
                assert_matches(reading, gpu, tensor_active=None)
        assert backend.ask("errors") == {
            "errors": {},
            "unsupported": [["tensor_active"], ["tensor_active"]],
        }
    finally:
        backend.close()


def _lost(gpu: FakeGpu) -> dict[str, object]:
    empty = dict.fromkeys(expected_reading(gpu))
    return empty | {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "lost": True,
        "processes": [],
    }


def test_xid_events_are_delivered_once_each_without_blocking(start: Starter, config: Path) -> None:
    gpus = [distinct_gpu(i) for i in range(3)]
    write_config(config, gpus, xids=[(0, 13)])  # happened before the agent: not delivered
    backend = start()
    assert backend.ask("xids")["xids"] == []

    queue = [(0, 13), (1, 79), (2, 48), (1, 94)]
    write_config(config, gpus, xids=queue)
    drained = backend.ask("xids")
    assert [(x["gpu"], x["xid"], x["uuid"]) for x in drained["xids"]] == [
        (1, 79, gpus[1].uuid),
        (2, 48, gpus[2].uuid),
        (1, 94, gpus[1].uuid),
    ]
    assert all(x["ts"] > 0 for x in drained["xids"])
    empty = backend.ask("xids")
    assert empty["xids"] == []
    # The fake honours NVML's wait timeout; a drain that waited would take >= 1 ms per call.
    assert empty["ms"] < 50

    write_config(config, gpus, xids=[*queue, (0, 119)])
    backend.sweep()
    assert [(x["gpu"], x["xid"]) for x in backend.ask("xids")["xids"]] == [(0, 119)]


def _run_driver(fake_lib: Path, config: Path, lib_dir: Path | None = None) -> dict[str, object]:
    env = fake_env(lib_dir or fake_lib, config)
    done = subprocess.run(
        [sys.executable, str(DRIVER)],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[0])


def test_nvml_init_failure_is_a_clear_error(fake_lib: Path, config: Path, tmp_path: Path) -> None:
    write_config(config, [distinct_gpu(0)], init_error=DRIVER_NOT_LOADED)
    reply = _run_driver(fake_lib, config)
    assert "NVIDIA kernel driver is not loaded" in str(reply["unavailable"])
    assert "--sim" in str(reply["unavailable"])

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed: cannot test its absence")
    reply = _run_driver(fake_lib, config, lib_dir=tmp_path / "empty")
    assert "libnvidia-ml.so.1 was not found" in str(reply["unavailable"])
