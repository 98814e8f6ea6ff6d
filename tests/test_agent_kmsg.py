"""The kernel-log watcher: units on a regular file, then the real agent process reading a FIFO
of kmsg records while the fake libnvidia-ml serves its GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until

from sentinel.agent.health.kmsg import KernelLog, XidPairing, normal_bus_id, watched_devices
from sentinel.faults.catalog import rule

SEQ = iter(range(1000, 100_000))


def record(message: str, prio: int = 3) -> str:
    return f"{prio},{next(SEQ)},{next(SEQ) * 1000},-;{message}\n"


MOUNTS = "/dev/nvme0n1p2 / ext4 rw 0 0\n/dev/nvme1n1 /ckpt xfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n"
LINES = {
    "fs_read_only": "EXT4-fs (nvme0n1p2): Remounting filesystem read-only",
    "machine_check": "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: be00000000800400",
    "pcie_aer_fatal": "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: "
    "0000:18:00.0",
    "hung_task": "INFO: task python:4242 blocked for more than 120 seconds.",
}


def test_watched_devices_map_mounts_to_directories(tmp_path: Path) -> None:
    (tmp_path / "mounts").write_text(MOUNTS)
    got = watched_devices(tmp_path / "mounts", [Path("/"), Path("/ckpt/run-7")])
    assert got == {"nvme0n1p2": "/", "nvme1n1": "/ckpt/run-7"}


def test_parse_every_kind_of_line(tmp_path: Path) -> None:
    log_file = tmp_path / "kmsg"
    text = [record(m) for m in LINES.values()]
    text += [
        record(
            "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
        ),
        " SUBSYSTEM=pci\n",  # a record's continuation line: neither news nor garbage
        record("EXT4-fs (sdb1): Remounting filesystem read-only"),  # not a watched filesystem
        record("XFS (nvme1n1): Corruption of in-memory data detected. Shutting down filesystem"),
        record("NVRM: Xid (PCI:garbage"),
        "random bytes without a header\n",
        record("usb 1-1: new high-speed USB device number 2"),
        record("INFO: task half written"),  # the last line has no newline yet: waits
    ]
    log_file.write_text("".join(text)[:-1])
    watched = {"nvme0n1p2": "/", "nvme1n1": "/ckpt"}
    kl = KernelLog(log_file, watched, from_start=True)
    xids, reports = kl.poll()
    assert [(x.pci_bus_id, x.xid) for x in xids] == [("0000:18:00", 79)]
    assert [r.rule for r in reports] == [
        "fs_read_only",
        "machine_check",
        "pcie_aer_fatal",
        "hung_task",
        "fs_read_only",
        "unknown_signal",
        "unknown_signal",
    ]
    assert "/ckpt (nvme1n1)" in reports[4].detail
    assert dict(kl.garbage) == {"unreadable NVRM Xid line": 1, "not a kmsg record": 1}
    with log_file.open("a") as f:
        f.write("\n")
    assert kl.poll() == ([], [])  # the finished line is not a hung-task warning
    kl.close()


def test_the_watcher_starts_at_the_end_of_the_log(tmp_path: Path) -> None:
    log_file = tmp_path / "kmsg"
    log_file.write_text(record(LINES["machine_check"]))  # before the agent started: history
    kl = KernelLog(log_file)
    assert kl.poll() == ([], [])
    with log_file.open("a") as f:
        f.write(record(LINES["hung_task"]))
    assert [r.rule for r in kl.poll()[1]] == ["hung_task"]
    kl.close()


def test_bus_ids_from_nvml_and_nvrm_match() -> None:
    assert normal_bus_id("00000000:1A:00.0") == normal_bus_id("0000:1a:00") == "0000:1a:00"


def test_an_xid_seen_by_both_sources_counts_once_and_repeats_stay_repeats() -> None:
    p = XidPairing(window_s=30)
    assert p.admit("nvml", 1, 48, 100.0)
    assert not p.admit("kmsg", 1, 48, 101.0)  # the same XID, from the kernel log
    assert p.admit("kmsg", 1, 13, 102.0) and p.admit("kmsg", 1, 13, 102.5)
    assert not p.admit("nvml", 1, 13, 103.0) and not p.admit("nvml", 1, 13, 103.5)
    assert p.admit("nvml", 1, 13, 104.0)  # a third one NVML saw: new
    assert p.admit("kmsg", 1, 48, 200.0)  # long after: a new occurrence


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


def test_the_agent_turns_kernel_log_lines_into_findings(tmp_path: Path, lib: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    (tmp_path / "mounts").write_text(MOUNTS)
    config = (
        f"agent:\n  kmsg: {fifo}\n  mounts_file: {tmp_path / 'mounts'}\n"
        "  checkpoint_dirs: [/ckpt]\n  expected_gpus: 2\n"
    )
    gpus = [FakeGpu(index=0), FakeGpu(index=1)]
    agent = FakeNvmlAgent(tmp_path, lib, gpus, config=config)
    writer = os.open(fifo, os.O_WRONLY)

    def write(*messages: str) -> None:
        os.write(writer, "".join(record(m) for m in messages).encode())

    def xid_count(gpu: str, xid: str) -> float:
        rows = agent.scrape().get("sentinel_gpu_xid_errors_total", [])
        return sum(v for lbl, v in rows if lbl["gpu"] == gpu and lbl["xid"] == xid)

    bus1 = normal_bus_id(gpus[1].pci_bus_id)
    try:
        wait_until(lambda: agent.verdict() == "healthy", what="healthy at start")
        # XID 48 on GPU 1, reported by the driver to NVML and to the kernel log: one XID.
        write(f"NVRM: Xid (PCI:{bus1}): 48, pid=77, name=python, Ch 00000010")
        agent.serve(xids=[(1, 48)])
        wait_until(lambda: xid_count("1", "48") == 1, what="xid 48")
        wait_until(
            lambda: sum(v for _, v in agent.scrape()["sentinel_agent_xid_reports_total"]) == 1,
            what="one report",
        )
        assert "xid_48" in agent.gpu_rules(1)
        # An XID only the kernel log saw still counts, judged by the catalog.
        write(f"NVRM: Xid (PCI:{normal_bus_id(gpus[0].pci_bus_id)}): 94, pid=78, name=python")
        wait_until(lambda: "xid_94" in agent.gpu_rules(0), what="xid 94 from kmsg")
        assert xid_count("0", "94") == 1
        write(*LINES.values())
        wait_until(lambda: set(LINES) <= agent.node_rules(), what="host findings")
        findings = agent.scrape()["sentinel_node_health_finding"]
        for lbl, _ in findings:
            assert lbl["verdict"] == rule(lbl["rule"]).verdict.value
        write("EXT4-fs (sdb1): Remounting filesystem read-only")  # not root, not checkpoints
        os.write(writer, b"garbage that is not a kmsg record\n")
        write(f"NVRM: Xid (PCI:{bus1}): 4242, pid=79, name=python")  # unknown to the catalog
        wait_until(lambda: "unknown_signal" in agent.node_rules(), what="unknown")
        wait_until(lambda: unknown_now(agent).get("xid") == 1, what="unknown xid")
        assert unknown_now(agent)["kmsg: not a kmsg record"] == 1
        assert agent.verdict() == "unhealthy"  # read-only root: drain
        assert agent.proc.poll() is None
    finally:
        os.close(writer)
        assert agent.stop() == 0, agent.log()


def unknown_now(agent: FakeNvmlAgent) -> dict[str, float]:
    return {lbl["kind"]: v for lbl, v in agent.scrape()["sentinel_agent_unknown_inputs_total"]}
