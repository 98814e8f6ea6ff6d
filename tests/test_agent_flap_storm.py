"""A flap storm through the whole path: the real agent process on the fake NVML library, a GPU
whose temperature toggles across the unhealthy line every half second for 15 s, and a real
coordinator with the shipped playbooks.

What an operator must see: one verdict episode and one incident, never a node taken out and put
back in a loop. The agent's hold keeps the GPU unhealthy through the storm's cool half-seconds
(`gpu_temp_unhealthy` holds 5 minutes), so the node leaves healthy once and stays out; the
coordinator opens one incident for the node, however many verdicts it receives.
(`test_agent_flapping.py` checks the property over random storms and every flapping rule with
the agent's own monitor; this is the same contract on real processes.)
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from coord_util import Coordinator
from fake_nvml import FakeGpu, build_library
from fake_nvml.agent import FakeNvmlAgent, wait_until

NODE = "gpu-node-1"
STORM_S = 15.0
TOGGLE_S = 0.5


def test_a_flap_storm_is_one_episode_and_one_incident(coord: Coordinator, tmp_path: Path) -> None:
    lib = build_library(tmp_path / "lib")
    admin = (coord.state / "admin.token").read_text().strip()
    token = tmp_path / "node.token"
    token.write_text(coord.token("--role", "node", "--node", NODE))
    cool, hot = FakeGpu(index=0, temp_gpu=55), FakeGpu(index=0, temp_gpu=97)
    agent = FakeNvmlAgent(
        tmp_path,
        lib,
        [cool],
        node=NODE,
        args=["--coordinator", coord.url],
        env={"SENTINEL_AGENT__TOKEN_FILE": str(token)},
    )
    try:
        wait_until(lambda: agent.verdict() == "healthy", 20, "a healthy start")
        verdicts: list[str] = []
        end = time.monotonic() + STORM_S
        flip = False
        while time.monotonic() < end:
            flip = not flip
            agent.gpus = [dataclasses.replace(hot if flip else cool)]
            agent.serve()
            deadline = time.monotonic() + TOGGLE_S
            while time.monotonic() < deadline:
                verdicts.append(agent.verdict())
                time.sleep(0.1)
        # /metrics, sampled every 0.1 s: healthy until the first hot reading, then unhealthy
        # to the end, through every cool half-second.
        first = verdicts.index("unhealthy")
        assert set(verdicts[:first]) == {"healthy"}
        assert set(verdicts[first:]) == {"unhealthy"}, verdicts[first:]
        wait_until(lambda: coord.call("GET", "/v1/incidents", admin), 20, "the incident")
        time.sleep(2.0)  # let any second incident show
        incidents = coord.call("GET", "/v1/incidents", admin)
        assert [(i["fault"], i["target"]) for i in incidents] == [("thermal", NODE)], incidents  # type: ignore[index,union-attr]
        nodes = {n["name"]: n["state"] for n in coord.call("GET", "/v1/nodes", admin)}  # type: ignore[union-attr,index]
        assert nodes.get(NODE) != "returned"
        audit = coord.call("GET", "/v1/audit?limit=1000", admin)
        moves = [a["why"] for a in audit if a.get("what") == "incident.recur"]  # type: ignore[union-attr]
        assert moves == []  # the storm never reopened it
    finally:
        agent.stop()
