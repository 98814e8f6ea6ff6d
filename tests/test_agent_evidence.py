"""The node's part of an incident's evidence bundle (`node.evidence`): gathered from the agent's
own objects, its GPUs read by the real NVML backend from the fake libnvidia-ml, and carried to
a real coordinator as `node-evidence.json` of the command's check."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from coord_util import Coordinator
from fake_nvml import (
    BackendProcess,
    FakeGpu,
    build_library,
    expected_fingerprint,
    expected_reading,
    write_config,
)

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.readings import GpuBackend, GpuProcess, GpuReading, XidEvent
from sentinel.agent.ranks.registry import Peer
from sentinel.agent.service import Agent
from sentinel.agent.uplink.commands import CommandRelay
from sentinel.agent.uplink.evidence import FILE_NAME, FORMAT, EvidenceGatherer
from sentinel.beacon import beacon_path
from sentinel.config import AgentConfig, HealthThresholds
from sentinel.failover import Coordinators
from sentinel.protocol import RankRegistration

NODE = "node-1"
HUNG = "INFO: task python:4242 blocked for more than 120 seconds."


class ChildNvml(GpuBackend):
    """The real NvmlBackend on the fake library, in the child process `BackendProcess` runs
    (the loader reads LD_LIBRARY_PATH at a process's start only); its answers rebuilt here as
    the agent's own readings, for the agent's objects in this process."""

    def __init__(self, proc: BackendProcess) -> None:
        self.proc = proc

    def gpu_count(self) -> int:
        return int(self.proc.hello["gpus"])

    def sweep(self) -> list[GpuReading]:
        return [_reading(r) for r in self.proc.sweep()]

    def read(self, index: int) -> GpuReading:
        return self.sweep()[index]

    def drain_xids(self) -> list[XidEvent]:
        return [XidEvent(**x) for x in self.proc.ask("xids")["xids"]]

    def fingerprint(self) -> dict[str, str]:
        return dict(self.proc.ask("fingerprint")["fingerprint"])

    def close(self) -> None:
        self.proc.close()


def _reading(raw: dict[str, Any]) -> GpuReading:
    down = raw["nvlink_links_down"]
    return GpuReading(
        **raw
        | {
            "processes": tuple(GpuProcess(**p) for p in raw["processes"]),
            "nvlink_links_down": None if down is None else tuple(down),
        }
    )


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("fake-nvml"))


GPUS = [FakeGpu(index=0), FakeGpu(index=1)]


@pytest.fixture
def nvml(lib: Path, tmp_path: Path) -> Iterator[tuple[ChildNvml, Path]]:
    config = tmp_path / "fake-nvml.conf"
    write_config(config, GPUS)
    backend = ChildNvml(BackendProcess(lib, config, tmp_path / "backend.log"))
    yield backend, config
    backend.close()


MakeAgent = Callable[[str, str], Agent]


@pytest.fixture
def node_agent(nvml: tuple[ChildNvml, Path], tmp_path: Path) -> Iterator[MakeAgent]:
    """The agent as `sentinel agent` builds it, on the fake NVML, reporting to the coordinator
    at a URL with a token; not started: the test drives its parts."""
    made: list[Agent] = []

    def make(url: str, token: str) -> Agent:
        (tmp_path / "token").write_text(token)
        (tmp_path / "kmsg").write_text("")
        cfg = AgentConfig(
            node_id=NODE,
            coordinator_url=(url,),
            token_file=tmp_path / "token",
            spool_dir=tmp_path / "spool",
            rank_socket=tmp_path / "agent.sock",
            kmsg=str(tmp_path / "kmsg"),
            expected_gpus=len(GPUS),
        )
        made.append(Agent(cfg, nvml[0], None))
        return made[-1]

    yield make
    for agent in made:
        if agent.spool is not None:
            agent.spool.close()
        if agent.kernel_log is not None:
            agent.kernel_log.close()


def kmsg(agent: Agent, message: str) -> None:
    assert agent.cfg.kmsg != "off"
    with Path(agent.cfg.kmsg).open("a") as f:
        f.write(f"4,1200,{time.monotonic_ns() // 1000},-;{message}\n")


def gatherer(agent: Agent) -> EvidenceGatherer:
    assert agent.relay is not None and agent.relay.evidence is not None
    return agent.relay.evidence


async def test_the_evidence_holds_every_part_the_agent_knows(
    nvml: tuple[ChildNvml, Path], node_agent: MakeAgent
) -> None:
    config = nvml[1]
    agent = node_agent("http://127.0.0.1:9", "tok")  # never called: no command is polled
    agent.monitor.poll_kernel()  # opens the log at its end, as at the agent's start
    agent.monitor.collect()  # a first sweep (GPM activity needs two samples: the next has it)
    write_config(config, GPUS, xids=[(1, 48)])  # a double-bit ECC error on GPU 1
    kmsg(agent, HUNG)
    agent.monitor.poll_kernel()
    agent.monitor.collect()
    assert agent.fingerprints is not None and agent.rank_server is not None
    reporter = asyncio.create_task(agent.fingerprints.run())
    while agent.fingerprints.sent is None:
        await asyncio.sleep(0.01)
    reporter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reporter
    beacon = str(beacon_path(os.getpid(), 3))
    reg = RankRegistration(job="llm", rank=3, gpu=1, pid=os.getpid(), beacon=beacon)
    agent.rank_server.registry.register("conn", reg, Peer(os.getpid(), os.getuid()))

    before = time.time()
    doc = json.loads(json.dumps(gatherer(agent).gather("chk-7")))  # as it travels

    assert doc["missing"] == []
    assert (doc["format"], doc["node"], doc["check_id"]) == (FORMAT, NODE, "chk-7")
    assert before <= doc["taken_at"] <= time.time()
    assert doc["gpus"] == [expected_reading(g) for g in GPUS]  # every field of every GPU
    [recent] = doc["xids"]["recent"]
    assert (recent["gpu"], recent["xid"], recent["uuid"]) == (1, 48, GPUS[1].uuid)
    assert [before - 5 < t <= doc["taken_at"] for t in recent["seen_at"]] == [True]
    assert doc["xids"]["counts"] == [{"gpu": 1, "xid": 48, "count": 1}]
    [verdict] = doc["verdicts"]
    assert verdict["verdict"] == "unhealthy"
    assert {"xid_48", "hung_task"} <= {f["rule"] for f in verdict["findings"]}
    assert [g["verdict"] for g in verdict["gpus"]] == ["healthy", "unhealthy"]
    assert doc["kernel_log"]["lines"][-1].endswith(HUNG)
    assert expected_fingerprint(GPUS).items() <= doc["fingerprint"].items()
    assert doc["ranks"] == [
        {"job": "llm", "rank": 3, "gpu": 1, "pid": os.getpid(), "state": "R (running)"}
    ]


def test_a_part_that_cannot_be_gathered_is_named_in_missing(tmp_path: Path) -> None:
    """Nothing swept, no kernel log, no ranks, no fingerprint, and one part that breaks:
    each is named with why, and the document still goes."""

    class NoGpus(GpuBackend):
        def gpu_count(self) -> int:
            return 0

        def read(self, index: int) -> GpuReading:
            raise IndexError(index)

        def drain_xids(self) -> list[XidEvent]:
            return []

    monitor = NodeMonitor(NODE, NoGpus(), None, HealthEvaluator(HealthThresholds()))
    gather = EvidenceGatherer(NODE, monitor, None, None, None)
    doc = gather.gather("chk-1")
    assert [m["part"] for m in doc["missing"]] == [
        "gpus",
        "verdicts",
        "kernel_log",
        "fingerprint",
        "ranks",
    ]
    assert doc["xids"]["recent"] == [] and doc["gpus"] is None

    def broken() -> None:
        raise RuntimeError("torn")

    monitor.xid_history = broken  # type: ignore[method-assign,assignment]
    missing = gather.gather("chk-1")["missing"]
    assert {"part": "xids", "why": "RuntimeError: torn"} in missing


async def test_the_relay_uploads_the_evidence_to_the_coordinator(
    coord: Coordinator, node_agent: MakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sentinel.agent.uplink.evidence")
    token = coord.token("--role", "node", "--node", NODE)
    agent = node_agent(coord.url, token)
    agent.monitor.collect()
    with coord.db() as db:
        for cid, args in (("ev-1", {"check_id": "chk-ev"}), ("ev-bad", {"check_id": "../x"})):
            db.execute(
                "INSERT INTO commands (id, target_kind, target, kind, args, created_at)"
                " VALUES (?, 'node', ?, 'node.evidence', ?, ?)",
                (cid, NODE, json.dumps(args), time.time()),
            )
    relay = agent.relay
    assert relay is not None
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        assert await relay.poll_once(session) == 2
        # the upload runs beside the poll (it may be done already, before the ack came back)
        await asyncio.wait_for(asyncio.gather(*relay._carrying), 10)
        # an agent built without a gatherer answers with an error, and no upload
        bare = CommandRelay(Coordinators(coord.url), token, NODE, None, wait_s=0)
        with coord.db() as db:
            db.execute(
                "INSERT INTO commands (id, target_kind, target, kind, args, created_at)"
                " VALUES ('ev-none', 'node', ?, 'node.evidence', ?, ?)",
                (NODE, json.dumps({"check_id": "chk-ev"}), time.time()),
            )
        assert await bare.poll_once(session) == 1 and not bare._carrying

    with coord.db() as db:
        acks = {r[0]: json.loads(r[1]) for r in db.execute("SELECT id, result FROM commands")}
    assert acks["ev-1"] == {"ok": True, "evidence": "gathering"}
    assert "node.evidence needs args.check_id" in acks["ev-bad"]["error"]
    assert acks["ev-none"] == {"ok": True, "error": "this agent gathers no evidence"}
    admin = coord.token("--role", "admin")
    files = coord.call("GET", "/v1/fr/chk-ev", admin)["files"]  # type: ignore[index]
    assert [(f["node"], f["name"]) for f in files] == [(NODE, FILE_NAME)]
    data = base64.b64decode(files[0]["data"])
    said = [r.getMessage() for r in caplog.records if r.name == "sentinel.agent.uplink.evidence"]
    assert [m.split(", gathered in ")[0] for m in said] == [
        f"uploaded the node evidence for chk-ev: {len(data)} bytes"
    ]
    doc = json.loads(data)
    assert (doc["format"], doc["node"], doc["check_id"]) == (FORMAT, NODE, "chk-ev")
    assert [g["uuid"] for g in doc["gpus"]] == [g.uuid for g in GPUS]
