"""Per-job labels: ranks register on the real agent's socket; the agent exports
`sentinel_gpu_job_info` while each rank's connection is open, and queries join it onto the GPU
series (checked with Prometheus' own query engine through promtool)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until
from system_deps import require_command

from sentinel.protocol import RankRegistration, encode_registration
from trainer_hooks.transport import AgentTransport

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


def _connect(path: Path, *lines: dict[str, object]) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    return s


def _owners(agent: FakeNvmlAgent) -> list[dict[str, str]]:
    return [lbl for lbl, v in agent.scrape().get("sentinel_gpu_job_info", []) if v == 1.0]


def test_ranks_label_their_gpus_while_connected(tmp_path: Path, lib: Path) -> None:
    gpus = [FakeGpu(index=i, processes=[(5000 + i, 1 << 30)]) for i in range(2)]
    agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"])
    sock = tmp_path / "agent.sock"
    try:
        by_index = _connect(
            sock,
            {
                "v": 1,
                "register": {"job": "llm-70b", "rank": 9, "gpu": 1, "tp": 1, "pp": 0, "dp": 4},
            },
        )
        by_pid = _connect(
            sock,
            {
                "v": 1,
                "register": {"job": "llm-70b", "rank": 8, "pid": 5000, "tp": 0, "pp": 0, "dp": 4},
            },
        )
        bad = _connect(
            sock,
            {"v": 1, "register": {"job": "no spaces allowed", "rank": 1, "gpu": 0}},
            {"v": 1, "register": {"job": "j", "rank": 2}},  # neither gpu nor pid
            {"v": 7, "register": {"job": "j", "rank": 3, "gpu": 0}},
        )
        wait_until(lambda: len(_owners(agent)) == 2, what="two owners")
        assert _owners(agent) == [
            {
                "node": "gpu-node-1",
                "gpu": "0",
                "job": "llm-70b",
                "rank": "8",
                "tp": "0",
                "pp": "0",
                "dp": "4",
            },
            {
                "node": "gpu-node-1",
                "gpu": "1",
                "job": "llm-70b",
                "rank": "9",
                "tp": "1",
                "pp": "0",
                "dp": "4",
            },
        ]
        dropped = agent.scrape()["sentinel_agent_rank_garbage_lines_total"]
        assert sum(v for _, v in dropped) == 3
        by_index.close()  # rank 9 exits: GPU 1 is no longer its
        wait_until(lambda: [o["gpu"] for o in _owners(agent)] == ["0"], what="released")
        by_pid.close()
        bad.close()
        wait_until(lambda: _owners(agent) == [], what="all released")
        assert agent.proc.poll() is None
    finally:
        assert agent.stop() == 0, agent.log()


def test_the_job_join_in_prometheus() -> None:
    promtool = require_command("promtool", "prometheus")
    r = subprocess.run(
        [promtool, "test", "rules", "queries_test.yml"],
        cwd=PROM,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_hooks_transport_registers_and_registers_again_after_an_agent_restart(
    tmp_path: Path, lib: Path
) -> None:
    """The trainer hooks' own transport sends the registration first on every connection: when
    the agent restarts (its registrations gone with it), the rank's label comes back."""
    gpus = [FakeGpu(index=i) for i in range(2)]
    reg = RankRegistration(job="llm", rank=3, gpu=1, tp=1, pp=0, dp=1)
    transport = AgentTransport(tmp_path / "agent.sock", reconnect_s=0.1)
    transport.register(encode_registration(reg))
    transport.start()
    want = [
        {
            "node": "gpu-node-1",
            "gpu": "1",
            "job": "llm",
            "rank": "3",
            "tp": "1",
            "pp": "0",
            "dp": "1",
        }
    ]
    try:
        for _ in range(2):  # the agent, then the agent started again
            agent = FakeNvmlAgent(tmp_path, lib, gpus, args=["--kmsg", "off"])
            try:
                wait_until(lambda a=agent: _owners(a) == want, what="the rank's registration")
            finally:
                assert agent.stop() == 0, agent.log()
    finally:
        transport.stop()
