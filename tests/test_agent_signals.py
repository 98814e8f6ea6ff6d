"""New GPU signals on the real agent process over the fake libnvidia-ml: the driver's recovery
action and reset-required state, expected GPUs (config or the PCI bus), error counters judged as
rates, NVLink links going down, and peer outliers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until

RESET_REQUIRED = 16  # NVML_ERROR_RESET_REQUIRED


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


def _value(agent: FakeNvmlAgent, name: str, **labels: str) -> float | None:
    rows = agent.scrape().get(name, [])
    return next((v for lbl, v in rows if labels.items() <= lbl.items()), None)


def test_recovery_action_and_reset_required_are_exported_and_judged(
    tmp_path: Path, lib: Path
) -> None:
    gpus = [FakeGpu(index=0), FakeGpu(index=1)]
    holds = "agent:\n  thresholds:\n    hold_s: {recovery_gpu_reset: 2, recovery_node_reboot: 2}\n"
    agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"], config=holds)
    try:
        assert agent.verdict() == "healthy"
        assert _value(agent, "sentinel_gpu_recovery_action", gpu="1") == 0.0
        gpus[1].recovery_action = 1  # GPU_RESET
        agent.serve()
        wait_until(lambda: "recovery_gpu_reset" in agent.gpu_rules(1), what="reset")
        assert _value(agent, "sentinel_gpu_reset_required", gpu="1") == 1.0
        assert _value(agent, "sentinel_node_recommended_action", action="reset_gpu") == 1.0
        gpus[1].recovery_action = 2  # NODE_REBOOT
        agent.serve()
        wait_until(lambda: "recovery_node_reboot" in agent.gpu_rules(1), what="reboot")
        assert _value(agent, "sentinel_node_recommended_action", action="reboot_node") == 1.0
        gpus[1].recovery_action = 0
        agent.serve()
        wait_until(lambda: _value(agent, "sentinel_gpu_recovery_action", gpu="1") == 0, what="0")
        assert agent.verdict() == "unhealthy"  # held down for a while after the driver relents
        wait_until(lambda: agent.verdict() == "healthy", what="cleared after the hold")
        gpus[0].errors["temp_gpu"] = RESET_REQUIRED  # a call refuses until the GPU is reset
        agent.serve()
        wait_until(lambda: "recovery_gpu_reset" in agent.gpu_rules(0), what="reset required")
        assert _value(agent, "sentinel_gpu_reset_required", gpu="0") == 1.0
        gpus[0].errors.clear()
        gpus[0].recovery_action = 99  # a value this catalog does not know
        agent.serve()
        wait_until(lambda: "unknown_signal" in agent.node_rules(), what="unknown")
        # Once GPU 0's reset hold has passed: degraded, never healthy.
        wait_until(lambda: agent.verdict() == "degraded", what="degraded, not healthy")
        assert "unknown_signal" in agent.node_rules()
        assert _value(agent, "sentinel_agent_unknown_inputs_total", kind="recovery_action") == 1
    finally:
        assert agent.stop() == 0, agent.log()


def _pci_device(root: Path, bus: str, vendor: int, cls: int) -> None:
    dev = root / bus
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "class").write_text(f"0x{cls:06x}\n")


def test_fewer_gpus_than_the_pci_bus_shows_is_gpu_missing(tmp_path: Path, lib: Path) -> None:
    pci = tmp_path / "pci"
    for bus in ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"):
        _pci_device(pci, bus, 0x10DE, 0x030200)  # an H100: 3D controller
    _pci_device(pci, "0000:05:00.0", 0x10DE, 0x068000)  # an NVSwitch: not a GPU
    _pci_device(pci, "0000:00:1f.0", 0x8086, 0x060100)  # the chipset
    agent = FakeNvmlAgent(
        tmp_path,
        lib,
        [FakeGpu(index=0), FakeGpu(index=1)],
        args=["--kmsg", "off"],
        config=f"agent:\n  pci_devices_dir: {pci}\n",
    )
    try:
        wait_until(lambda: agent.verdict() == "unhealthy", what="gpu_missing")
        assert agent.node_rules() == {"gpu_missing"}
        assert _value(agent, "sentinel_node_gpus_expected") == 3.0
        assert _value(agent, "sentinel_node_gpus_visible") == 2.0
        status, body = agent.get("/readyz")
        reply = json.loads(body)
        assert status == 503 and not reply["ready"]
        assert any(r.startswith("gpu_missing: 2 of 3 expected GPUs") for r in reply["reasons"])
    finally:
        assert agent.stop() == 0, agent.log()


def test_configured_gpu_count_wins_and_a_full_node_is_ready(tmp_path: Path, lib: Path) -> None:
    agent = FakeNvmlAgent(
        tmp_path,
        lib,
        [FakeGpu(index=0), FakeGpu(index=1)],
        args=["--kmsg", "off", "--expected-gpus", "2"],
    )
    try:
        wait_until(lambda: agent.get("/readyz")[0] == 200, what="ready")
        assert agent.verdict() == "healthy" and agent.node_rules() == set()
    finally:
        assert agent.stop() == 0, agent.log()


RATES = """agent:
  costly_reads_interval_s: 0  # PCIe replays every sweep: the rate window is compressed to 4 s
  thresholds:
    rate_window_s: 4
    pcie_replay_rate_degraded: 60
    nvlink_error_rate_degraded: 60
    sbe_rate_degraded: 600
    hold_s: {pcie_replay_rate: 1, nvlink_error_rate: 1, ecc_sbe_rate: 1, nvlink_down: 1}
"""


def test_error_counters_are_judged_as_rates_and_links_as_state(tmp_path: Path, lib: Path) -> None:
    # A lifetime of errors behind it, none new: not a finding (a lifetime count was, before).
    gpus = [FakeGpu(index=0, pcie_replay=50_000, ecc_sbe_volatile=90_000), FakeGpu(index=1)]
    gpus[1].nvlink_crc_flit[2] = 40_000
    agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"], config=RATES)
    try:
        wait_until(lambda: agent.verdict() == "healthy", what="healthy at start")
        gpus[0].pcie_replay += 100  # a burst: 100 in a 4 s window is 1,500 a minute
        gpus[0].ecc_sbe_volatile += 1_000
        gpus[1].nvlink_crc_flit[2] += 50
        agent.serve()
        wait_until(lambda: agent.gpu_rules(0) == {"pcie_replay_rate", "ecc_sbe_rate"}, 10, "0")
        wait_until(lambda: agent.gpu_rules(1) == {"nvlink_error_rate"}, 10, "nvlink rate")
        # The burst is over: once the window and the hold pass, the rates clear on their own.
        wait_until(lambda: agent.verdict() == "healthy", 15, "rates cleared")
        gpus[1].nvlink_state[3] = 0  # a link active at start goes down
        agent.serve()
        wait_until(lambda: agent.gpu_rules(1) == {"nvlink_down"}, 10, "link down")
        assert agent.verdict() == "unhealthy"
        assert _value(agent, "sentinel_gpu_nvlink_links_down", gpu="1") == 1.0
        gpus[1].nvlink_state[3] = 1
        agent.serve()
        wait_until(lambda: agent.verdict() == "healthy", 10, "link back")
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_gpu_odd_among_its_peers_is_flagged(tmp_path: Path, lib: Path) -> None:
    gpus = [FakeGpu(index=i, temp_gpu=60 + i % 3, power_mw=650_000) for i in range(8)]
    agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"])
    try:
        wait_until(lambda: agent.verdict() == "healthy", what="healthy at start")
        gpus[5].temp_gpu = 80  # 19 C hotter than its peers at the same power: cooling
        agent.serve()
        wait_until(lambda: agent.gpu_rules(5) == {"peer_outlier"}, 10, "outlier")
        assert all(agent.gpu_rules(g) == set() for g in (0, 1, 2, 3, 4, 6, 7))
        rows = agent.scrape()["sentinel_gpu_health_finding"]
        assert [lbl["verdict"] for lbl, _ in rows] == ["degraded"]
    finally:
        assert agent.stop() == 0, agent.log()
