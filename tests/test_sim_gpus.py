"""Simulated GPUs: plausible seeded readings, faults from the faults file, and their verdicts."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import fields
from pathlib import Path

import pytest

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.nvml.readings import GpuReading
from sentinel.agent.nvml.sim import SimulatedGpus, inject
from sentinel.config import HealthThresholds
from sentinel.exitcodes import InputError
from sentinel.faults.catalog import rule
from sentinel.protocol import Action, Verdict

IDENTITY = {"index", "uuid", "name", "pci_bus_id"}


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def changed(a: GpuReading, b: GpuReading) -> set[str]:
    return {f.name for f in fields(GpuReading) if getattr(a, f.name) != getattr(b, f.name)}


def twins(tmp_path: Path, gpus: int = 4, model: str = "NVIDIA H100 80GB HBM3"):
    """Two identical simulators on one clock; only the second one reads a faults file."""
    clock = FakeClock()
    faults = tmp_path / "faults.jsonl"
    ref = SimulatedGpus(gpus, model=model, seed=7, clock=clock)
    sim = SimulatedGpus(gpus, model=model, seed=7, faults_file=faults, clock=clock)
    return clock, faults, ref, sim


def test_h100_readings_are_plausible_and_noisy() -> None:
    clock = FakeClock()
    sim = SimulatedGpus(8, clock=clock)
    sweeps = []
    for _ in range(30):
        clock.now += 1.0
        sweeps.append(sim.sweep())
    readings = [r for sweep in sweeps for r in sweep]
    for r in readings:
        assert r.name == "NVIDIA H100 80GB HBM3" and not r.lost
        assert 35 <= r.temp_gpu_c <= 55 and 38 <= r.temp_mem_c <= 65
        assert 300 <= r.power_w <= 650 and r.power_limit_w == 700
        assert (r.sm_clock_mhz, r.mem_clock_mhz) == (1980, 2619)
        assert 0 <= r.util_gpu_pct <= 100 and 0 <= r.util_mem_pct <= 100
        assert r.fb_total_bytes == 81559 * 2**20
        assert r.fb_used_bytes + r.fb_free_bytes == r.fb_total_bytes
        assert r.fb_used_bytes > r.fb_total_bytes // 2
        assert 0 < r.tensor_active < 1
        assert r.throttle_reasons == 0 and r.pcie_replay_count == 0
        assert r.ecc_sbe_volatile == r.ecc_dbe_volatile == r.ecc_dbe_aggregate == 0
        assert r.remapped_rows_uncorrectable == 0 and r.remapped_rows_pending is False
        assert r.remapped_rows_failure is False
        assert r.retired_pages_dbe is None  # Hopper remaps rows; page retirement is N/A
        assert r.nvlink_crc_errors == 0
        assert len(r.processes) == 1 and r.processes[0].used_memory_bytes == r.fb_used_bytes
    assert len({r.temp_gpu_c for r in readings}) > 20
    assert len({r.power_w for r in readings}) > 20
    assert len({r.uuid for r in sweeps[0]}) == 8 and all(
        r.uuid.startswith("GPU-") for r in readings
    )
    assert sweeps[0][0].pci_bus_id == "00000000:18:00.0"
    assert len({r.pci_bus_id for r in SimulatedGpus(64).sweep()}) == 64


def test_energy_grows_with_power_times_time() -> None:
    clock = FakeClock()
    sim = SimulatedGpus(1, clock=clock)
    first = sim.read(0)
    clock.now += 10.0
    second = sim.read(0)
    assert abs((second.energy_mj - first.energy_mj) - second.power_w * 10.0 * 1000) <= 1


def test_seeded_noise_is_deterministic() -> None:
    def run(seed: int, node_id: str = "") -> list[GpuReading]:
        clock = FakeClock()
        sim = SimulatedGpus(4, seed=seed, clock=clock, node_id=node_id)
        out = []
        for _ in range(5):
            clock.now += 1.0
            out.extend(sim.sweep())
        return out

    assert run(3) == run(3)
    assert run(3) != run(4)
    assert {r.uuid for r in run(3, "node-0")}.isdisjoint({r.uuid for r in run(3, "node-1")})


def test_other_models_and_bad_arguments() -> None:
    v100 = SimulatedGpus(1, model="Tesla V100-SXM2-32GB").read(0)
    assert v100.retired_pages_dbe == 0 and v100.remapped_rows_pending is None
    assert v100.tensor_active is None and v100.power_limit_w == 300
    with pytest.raises(InputError, match="unknown model 'RTX 9090'"):
        SimulatedGpus(1, model="RTX 9090")
    with pytest.raises(InputError, match="at least 1 GPU"):
        SimulatedGpus(0)
    with pytest.raises(IndexError, match="GPU 4 does not exist"):
        SimulatedGpus(4).read(4)


def test_clean_simulated_node_is_healthy() -> None:
    clock = FakeClock()
    sim = SimulatedGpus(8, clock=clock)
    ev = HealthEvaluator(HealthThresholds(), clock=clock)
    for _ in range(20):
        clock.now += 1.0
        node = ev.evaluate(sim.sweep(), sim.drain_xids())
        assert (node.verdict, node.action, node.findings) == (Verdict.HEALTHY, Action.NONE, ())


# --- each fault changes exactly what the real fault changes ---------------------------------

ECC_FIELDS = {
    "ecc_dbe_volatile",
    "ecc_dbe_aggregate",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
}
THERMAL_FIELDS = {"temp_gpu_c", "throttle_reasons", "sm_clock_mhz"}
FAULT_CASES = [
    ({"kind": "ecc_dbe", "gpu": 1}, ECC_FIELDS, [48]),
    ({"kind": "xid", "gpu": 1, "xid": 48}, ECC_FIELDS, [48]),
    ({"kind": "xid", "gpu": 1, "xid": 13}, set(), [13]),
    ({"kind": "xid", "gpu": 1, "xid": 94}, set(), [94]),
    ({"kind": "thermal", "gpu": 1, "temp_c": 96}, THERMAL_FIELDS, []),
    # what healthy fleets see (the rules corpus's benign streams)
    ({"kind": "sbe", "gpu": 1, "count": 40}, {"ecc_sbe_volatile", "ecc_sbe_aggregate"}, []),
    ({"kind": "pcie_replay", "gpu": 1, "count": 5}, {"pcie_replay_count"}, []),
    ({"kind": "nvlink_crc", "gpu": 1, "count": 3}, {"nvlink_crc_errors"}, []),
    ({"kind": "nvlink_down", "gpu": 1, "link": 5}, {"nvlink_links_down"}, []),
    ({"kind": "warm", "gpu": 1, "temp_c": 84}, {"temp_gpu_c"}, []),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "fields_changed", "xids"), FAULT_CASES)
def test_fault_changes_exactly_its_fields(
    tmp_path: Path, fault: dict[str, object], fields_changed: set[str], xids: list[int]
) -> None:
    clock, faults, ref, sim = twins(tmp_path)
    assert ref.sweep() == sim.sweep()
    inject(faults, fault)
    clock.now += 5.0
    before, after = ref.sweep(), sim.sweep()
    assert [changed(a, b) for a, b in zip(before, after, strict=True)] == [
        set(),
        fields_changed,
        set(),
        set(),
    ]
    events = sim.drain_xids()
    assert [(e.gpu, e.xid, e.uuid, e.ts) for e in events] == [
        (1, x, after[1].uuid, clock.now) for x in xids
    ]
    assert sim.drain_xids() == []


def test_ecc_dbe_values(tmp_path: Path) -> None:
    _, faults, _, sim = twins(tmp_path)
    inject(faults, {"kind": "ecc_dbe", "gpu": 0})
    r = sim.read(0)
    assert (r.ecc_dbe_volatile, r.ecc_dbe_aggregate, r.remapped_rows_uncorrectable) == (1, 1, 1)
    assert r.remapped_rows_pending is True and r.remapped_rows_failure is False


def test_ecc_dbe_retires_a_page_on_pre_ampere_gpus(tmp_path: Path) -> None:
    _, faults, ref, sim = twins(tmp_path, gpus=1, model="Tesla V100-SXM2-32GB")
    inject(faults, {"kind": "ecc_dbe", "gpu": 0})
    assert changed(ref.read(0), sim.read(0)) == {
        "ecc_dbe_volatile",
        "ecc_dbe_aggregate",
        "retired_pages_dbe",
        "retired_pages_pending",
    }


def test_thermal_values_and_clear(tmp_path: Path) -> None:
    clock, faults, ref, sim = twins(tmp_path)
    inject(faults, {"kind": "thermal", "gpu": 2, "temp_c": 96})
    ref.sweep()
    r = sim.sweep()[2]
    assert r.temp_gpu_c == 96
    assert r.throttle_reasons & 0x40 and r.throttle_reasons & 0x20  # HW + SW thermal
    assert r.sm_clock_mhz == 990
    inject(faults, {"kind": "clear", "gpu": 2})
    clock.now += 1.0
    assert ref.sweep() == sim.sweep()


def test_benign_churn_values_and_clear(tmp_path: Path) -> None:
    _, faults, _, sim = twins(tmp_path)
    for fault in (
        {"kind": "sbe", "gpu": 0, "count": 40},
        {"kind": "sbe", "gpu": 0, "count": 2},
        {"kind": "pcie_replay", "gpu": 0, "count": 5},
        {"kind": "nvlink_down", "gpu": 0, "link": 5},
        {"kind": "nvlink_down", "gpu": 0, "link": 2},
        {"kind": "warm", "gpu": 0, "temp_c": 84},
    ):
        inject(faults, fault)
    r = sim.read(0)
    assert (r.ecc_sbe_volatile, r.ecc_sbe_aggregate, r.pcie_replay_count) == (42, 42, 5)
    assert (r.nvlink_links_down, r.temp_gpu_c, r.throttle_reasons) == ((2, 5), 84, 0)
    # a clear ends the excursion and brings the links back; counters stay counted
    inject(faults, {"kind": "clear", "gpu": 0})
    r = sim.read(0)
    assert (r.nvlink_links_down, r.ecc_sbe_aggregate, r.pcie_replay_count) == ((), 42, 5)
    assert r.temp_gpu_c is not None and r.temp_gpu_c <= 55  # back to its noise (35-55 C)


def test_xid_79_loses_the_gpu_for_good(tmp_path: Path) -> None:
    clock, faults, _, sim = twins(tmp_path)
    inject(faults, {"kind": "xid", "gpu": 3, "xid": 79})
    for _ in range(3):
        clock.now += 1.0
        r = sim.read(3)
        assert r.lost and r.uuid and r.index == 3
        assert all(
            getattr(r, f.name) in (None, ())
            for f in fields(GpuReading)
            if f.name not in IDENTITY | {"lost"}
        )
    assert [e.xid for e in sim.drain_xids()] == [79]
    assert not sim.read(2).lost


# --- the faults file -------------------------------------------------------------------------


def test_faults_file_is_read_incrementally(tmp_path: Path) -> None:
    _, faults, _, sim = twins(tmp_path)
    assert sim.read(0).ecc_dbe_volatile == 0  # no file yet: nothing to do
    inject(faults, {"kind": "ecc_dbe", "gpu": 0})
    assert sim.read(0).ecc_dbe_volatile == 1
    assert sim.read(0).ecc_dbe_volatile == 1  # not applied twice
    inject(faults, {"kind": "ecc_dbe", "gpu": 0})
    assert sim.read(0).ecc_dbe_volatile == 2
    assert [e.xid for e in sim.drain_xids()] == [48, 48]


def test_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    _, faults, _, sim = twins(tmp_path)
    line = json.dumps({"kind": "xid", "gpu": 0, "xid": 74}).encode()
    faults.write_bytes(line[:10])
    assert sim.drain_xids() == []
    with faults.open("ab") as f:
        f.write(line[10:] + b"\n")
    assert [e.xid for e in sim.drain_xids()] == [74]


def test_a_truncated_faults_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    _, faults, _, sim = twins(tmp_path)
    inject(faults, {"kind": "xid", "gpu": 0, "xid": 94})
    inject(faults, {"kind": "xid", "gpu": 0, "xid": 94})
    assert len(sim.drain_xids()) == 2
    faults.write_text("")  # the injector started a fresh file
    inject(faults, {"kind": "xid", "gpu": 1, "xid": 13})
    assert [(e.gpu, e.xid) for e in sim.drain_xids()] == [(1, 13)]


def test_garbage_lines_are_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, faults, _, sim = twins(tmp_path)
    faults.write_bytes(
        b"not json\n"
        b"[1, 2]\n"
        b'{"kind": "meteor", "gpu": 0}\n'
        b'{"kind": "xid", "gpu": 0}\n'
        b'{"kind": "thermal", "gpu": 0, "temp_c": -5}\n'
        b'{"kind": "ecc_dbe", "gpu": 9}\n'
        b"\xff\xfe\n"
        b"\n"
        b'{"kind": "xid", "gpu": 2, "xid": 31, "node": "node-1", "at_step": 4}\n'
    )
    with caplog.at_level(logging.WARNING, logger="sentinel.agent.nvml.sim"):
        assert [(e.gpu, e.xid) for e in sim.drain_xids()] == [(2, 31)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 7
    assert "line 1: skipped, not valid JSON" in warnings[0]
    assert "line 4: skipped" in warnings[3] and "xid: Field required" in warnings[3]
    assert "line 6: skipped, no GPU 9 on this node" in warnings[5]
    assert all(r.ecc_dbe_volatile == 0 and r.throttle_reasons == 0 for r in sim.sweep())


def test_inject_validates_and_appends_whole_lines(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    with pytest.raises(InputError, match="temp_c: Field required"):
        inject(faults, {"kind": "thermal", "gpu": 0})
    assert not faults.exists()

    sim = SimulatedGpus(4, faults_file=faults)

    def burst(gpu: int) -> None:
        for _ in range(50):
            inject(faults, {"kind": "xid", "gpu": gpu, "xid": 94})

    threads = [threading.Thread(target=burst, args=(g,)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = faults.read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["kind"] == "xid" for line in lines)
    assert sorted({e.gpu for e in sim.drain_xids()}) == [0, 1, 2, 3]


def test_a_restarted_agent_sees_past_faults_as_state_not_as_new_xids(tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    inject(faults, {"kind": "xid", "gpu": 1, "xid": 79})
    inject(faults, {"kind": "ecc_dbe", "gpu": 0})
    sim = SimulatedGpus(2, faults_file=faults)  # started after the faults struck
    assert sim.drain_xids() == []  # NVML does not replay past XID events
    gpu0, gpu1 = sim.sweep()
    assert gpu1.lost and gpu0.ecc_dbe_volatile == 1
    inject(faults, {"kind": "xid", "gpu": 0, "xid": 94})
    assert [(e.gpu, e.xid) for e in sim.drain_xids()] == [(0, 94)]


# --- the path the demo relies on: injected fault -> verdict ----------------------------------

VERDICT_CASES = [
    ({"kind": "ecc_dbe", "gpu": 1}, Verdict.UNHEALTHY, Action.RESET_GPU,
     {"ecc_dbe_volatile", "row_remap_pending", "remapped_rows_uncorrectable", "xid_48"}),
    ({"kind": "xid", "gpu": 1, "xid": 79}, Verdict.UNHEALTHY, Action.REBOOT_NODE,
     {"gpu_lost", "xid_79"}),
    ({"kind": "thermal", "gpu": 1, "temp_c": 96}, Verdict.UNHEALTHY, Action.DRAIN_AND_INSPECT,
     {"gpu_temp_unhealthy", "hw_thermal_slowdown", "sw_thermal_slowdown"}),
    ({"kind": "thermal", "gpu": 1, "temp_c": 88}, Verdict.DEGRADED, Action.DRAIN_AND_INSPECT,
     {"gpu_temp_degraded", "hw_thermal_slowdown", "sw_thermal_slowdown"}),
    ({"kind": "xid", "gpu": 1, "xid": 94}, Verdict.DEGRADED, Action.RESTART_JOB, {"xid_94"}),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "verdict", "action", "rules"), VERDICT_CASES)
def test_injected_fault_becomes_the_right_verdict(
    tmp_path: Path, fault: dict[str, object], verdict: Verdict, action: Action, rules: set[str]
) -> None:
    clock, faults, _, sim = twins(tmp_path)
    ev = HealthEvaluator(HealthThresholds(), clock=clock)
    assert ev.evaluate(sim.sweep(), sim.drain_xids()).verdict is Verdict.HEALTHY
    inject(faults, fault)
    clock.now += 1.0
    node = ev.evaluate(sim.sweep(), sim.drain_xids())
    assert (node.verdict, node.action) == (verdict, action)
    assert [(g.gpu, g.verdict) for g in node.gpus if g.verdict is not Verdict.HEALTHY] == [
        (1, verdict)
    ]
    assert {f.rule for f in node.gpus[1].findings} == rules


def test_thermal_verdict_recovers_after_clear(tmp_path: Path) -> None:
    clock, faults, _, sim = twins(tmp_path)
    ev = HealthEvaluator(HealthThresholds(), clock=clock)
    inject(faults, {"kind": "thermal", "gpu": 0, "temp_c": 96})
    assert ev.evaluate(sim.sweep(), sim.drain_xids()).unhealthy_gpus == [0]
    inject(faults, {"kind": "clear", "gpu": 0})
    clock.now += 1.0
    held = ev.evaluate(sim.sweep(), sim.drain_xids())
    assert held.unhealthy_gpus == [0]  # the hold-down outlasts a brief cool spell
    clock.now += rule("gpu_temp_unhealthy").hold_s
    node = ev.evaluate(sim.sweep(), sim.drain_xids())
    assert (node.verdict, node.action) == (Verdict.HEALTHY, Action.NONE)
