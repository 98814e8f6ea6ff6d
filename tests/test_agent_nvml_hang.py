"""A wedged NVML call, on the real agent process over the fake libnvidia-ml in hang mode.

The contract: within 10 s the node turns unhealthy with rule `nvml_unresponsive`; a verdict
event naming the hung call reaches the coordinator; /metrics answers within 1 s throughout; the
systemd watchdog keeps being pinged (the driver is broken, not the agent); and the agent
recovers by itself when the call returns. The coordinator here is a stand-in ingest that
decodes batches with the real protocol decoder (tests/test_agent_service.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until
from test_agent_service import StandInCoordinator

from sentinel.processes import free_port
from sentinel.protocol import NodeHealthEvent, NodeHealthPayload

HUNG = "nvmlDeviceGetPowerUsage"


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


class Watchdog:
    """The receiving end of sd_notify: every datagram with its arrival time."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.pings: list[float] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            if b"WATCHDOG=1" in data:
                self.pings.append(time.monotonic())

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def _timed_scrape(agent: FakeNvmlAgent, slowest: list[float]) -> str:
    start = time.monotonic()
    verdict = agent.verdict()
    slowest.append(time.monotonic() - start)
    return verdict


def test_a_wedged_nvml_call_makes_the_node_unhealthy_and_not_the_agent(
    tmp_path: Path, lib: Path
) -> None:
    coord = StandInCoordinator(free_port())
    coord.start()
    dog = Watchdog(tmp_path / "notify.sock")
    token = tmp_path / "node.token"
    token.write_text("node-token\n")  # the stand-in coordinator takes any
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"}
    env["SENTINEL_AGENT__TOKEN_FILE"] = str(token)
    agent = FakeNvmlAgent(
        tmp_path,
        lib,
        [FakeGpu(index=0), FakeGpu(index=1)],
        env=env,
        args=[
            "--coordinator",
            f"http://127.0.0.1:{coord.port}",
            "--kmsg",
            "off",
            "--expected-gpus",
            "2",
        ],
        config="agent:\n  thresholds:\n    hold_s: {nvml_unresponsive: 3}\n",  # catalog: 60 s
    )
    scrapes: list[float] = []
    try:
        wait_until(lambda: _timed_scrape(agent, scrapes) == "healthy", what="healthy at start")
        agent.serve(hang=HUNG)
        wedged_at = time.monotonic()
        took = wait_until(lambda: _timed_scrape(agent, scrapes) == "unhealthy", 15, "unhealthy")
        assert took <= 10.0
        assert agent.node_rules() == {"nvml_unresponsive"}
        stalled = agent.scrape()["sentinel_agent_nvml_call_stalled_seconds"]
        assert [lbl["call"] for lbl, _ in stalled] == [HUNG]

        def verdict_events() -> list[NodeHealthPayload]:
            return [e.payload for e in coord.received if isinstance(e, NodeHealthEvent)]

        wait_until(lambda: any(p.verdict == "unhealthy" for p in verdict_events()), 10)
        event = next(p for p in verdict_events() if p.verdict == "unhealthy")
        (finding,) = event.findings
        assert finding.rule == "nvml_unresponsive" and HUNG in finding.detail
        status, body = agent.get("/healthz")  # the agent is alive: no reason to restart it
        assert status == 200 and HUNG in json.loads(body)["nvml_unresponsive"]
        status, body = agent.get("/readyz")
        assert status == 503 and "nvml_unresponsive" in body.decode()
        time.sleep(3.0)  # stays wedged a while: the watchdog keeps being fed throughout
        for _ in range(10):
            _timed_scrape(agent, scrapes)
        during = [t for t in dog.pings if t > wedged_at]
        gaps = [b - a for a, b in zip([wedged_at, *during], during, strict=False)]
        assert during and max(gaps) <= 1.5  # half the 2 s watchdog, plus scheduling slack
        assert agent.proc.poll() is None

        agent.serve()  # the driver answers again
        wait_until(
            lambda: (
                agent.node_rules() == {"nvml_unresponsive"}
                and not agent.scrape().get("sentinel_agent_nvml_call_stalled_seconds")
            ),
            10,
        )
        wait_until(lambda: _timed_scrape(agent, scrapes) == "healthy", 10, "recovered")
        assert agent.node_rules() == set()
        wait_until(lambda: verdict_events()[-1].verdict == "healthy", 10)
        assert max(scrapes) < 1.0, max(scrapes)
    finally:
        code = agent.stop()
        dog.close()
        coord.stop()
    assert code == 0, agent.log()


def test_an_agent_wedged_in_every_call_still_stops_cleanly(tmp_path: Path, lib: Path) -> None:
    agent = FakeNvmlAgent(tmp_path, lib, [FakeGpu(index=0)], args=["--kmsg", "off"])
    try:
        agent.serve(hang="*")
        wait_until(lambda: agent.verdict() == "unhealthy", 15, "unhealthy")
    finally:
        start = time.monotonic()
        code = agent.stop(timeout_s=10)
    assert code == 0 and time.monotonic() - start < 10, agent.log()
    assert "leaving NVML as it is" in agent.log()
