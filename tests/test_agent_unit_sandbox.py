"""The shipped agent unit lets the agent read every source its rules need, proven by running
the real agent (pynvml on the fake libnvidia-ml) under the unit file's own sandbox settings.

This machine runs no systemd, so `systemd-run` cannot apply the unit; `tests/helpers/
unit_sandbox.py` applies what decides whether a source can be read (the capabilities a process
of the unit holds, NoNewPrivileges, and /dev/kmsg hidden as ProtectKernelLogs or a closed device
policy hides it) and says what it leaves out. On this machine, as on most distributions,
`kernel.dmesg_restrict=1`: reading /dev/kmsg takes CAP_SYSLOG.

A sandbox that hides a source fails the agent's readiness and its source series: the same
agent under the unit as it shipped before (ProtectKernelLogs=yes, no capability) reports the
kernel log down, once, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until

from tests.helpers.unit_sandbox import (
    held_capabilities,
    kmsg_hidden,
    sandbox_prefix,
    unit_settings,
)

pytestmark = pytest.mark.slow

UNIT = Path(__file__).parent.parent / "deploy" / "systemd" / "sentinel-agent.service"


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


def source_up(agent: FakeNvmlAgent) -> dict[str, float]:
    rows = agent.scrape().get("sentinel_agent_source_up", [])
    return {lbl["source"]: v for lbl, v in rows}


def readiness(agent: FakeNvmlAgent) -> tuple[int, dict[str, object]]:
    code, body = agent.get("/readyz")
    return code, json.loads(body)


def sandboxed(tmp_path: Path, lib: Path, unit_text: str) -> FakeNvmlAgent:
    prefix = sandbox_prefix(unit_settings(unit_text), tmp_path)
    # the unit's node reads /dev/kmsg: the agent's default for real GPUs (kmsg: auto)
    config = "agent:\n  expected_gpus: 2\n"
    return FakeNvmlAgent(
        tmp_path, lib, [FakeGpu(index=0), FakeGpu(index=1)], config=config, prefix=prefix
    )


def test_the_shipped_unit_holds_what_its_sources_need() -> None:
    settings = unit_settings(UNIT.read_text())
    assert "syslog" in held_capabilities(settings), "no CAP_SYSLOG: /dev/kmsg is unreadable"
    assert not kmsg_hidden(settings)
    # a non-root User= holds its ambient capabilities only, within the bounding set
    ambient = {c for v in settings["AmbientCapabilities"] for c in v.split()}
    bounding = {c for v in settings["CapabilityBoundingSet"] for c in v.split()}
    assert ambient <= bounding and settings["User"] != ["root"]


def test_the_agent_reads_every_source_under_the_shipped_unit(tmp_path: Path, lib: Path) -> None:
    agent = sandboxed(tmp_path, lib, UNIT.read_text())
    try:
        wait_until(lambda: source_up(agent).get("kmsg") == 1.0, what="kmsg up")
        wait_until(lambda: readiness(agent)[0] == 200, what="ready")
        assert source_up(agent) == {"nvml": 1.0, "kmsg": 1.0, "host": 1.0, "rank_socket": 1.0}
        assert "source kmsg down" not in agent.log()
    finally:
        assert agent.stop() == 0, agent.log()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # the unit as it shipped before: the log hidden and no capability
        ({"ProtectKernelLogs=yes": True, "CAP_SYSLOG": False}, "Permission denied"),
        # a capability set without CAP_SYSLOG: dmesg_restrict refuses the open
        ({"CAP_SYSLOG": False}, "Operation not permitted"),
    ],
    ids=["protect-kernel-logs", "no-cap-syslog"],
)
def test_a_sandbox_that_hides_the_kernel_log_is_reported_once(
    tmp_path: Path, lib: Path, change: dict[str, bool], why: str
) -> None:
    text = UNIT.read_text()
    if change.get("CAP_SYSLOG") is False:
        text = text.replace("=CAP_SYSLOG", "=")
    if change.get("ProtectKernelLogs=yes"):
        text = text.replace(
            "ProtectKernelModules=yes\n", "ProtectKernelModules=yes\nProtectKernelLogs=yes\n"
        )
    agent = sandboxed(tmp_path, lib, text)
    try:
        wait_until(lambda: source_up(agent).get("kmsg") == 0.0, what="kmsg down")
        code, body = readiness(agent)
        assert code == 503 and body["verdict"] == "healthy", body
        assert body["sources_down"] == {"kmsg": f"cannot open /dev/kmsg: {why}"}, body
        assert f"source kmsg down: cannot open /dev/kmsg: {why}" in body["reasons"]  # type: ignore[operator]
        # the agent polls the log several times a second: one line says it, not one a poll
        wait_until(lambda: agent.log().count('"source kmsg down') >= 1, what="logged")
        agent.serve()  # a few more sweeps and polls
        wait_until(
            lambda: agent.scrape()["sentinel_agent_collection_duration_seconds_count"][0][1] > 10,
            what="sweeps",
        )
        assert agent.log().count("source kmsg down") == 1, agent.log()
        assert source_up(agent)["nvml"] == 1.0
    finally:
        assert agent.stop() == 0, agent.log()
