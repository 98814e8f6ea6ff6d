"""Burn-in over a real network: 4 "nodes" as network namespaces on a bridge, one rank each.

Ranks run `sentinel burnin` as a torchrun-launched gang would (RANK/WORLD_SIZE set) over
gloo/TCP inside their namespaces; one node's veth pair is rate-limited with `tc tbf`. The link
phase must flag that node and only it, with a bandwidth figure that reflects the limit.
Needs root and iproute2 (`.ci/run` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from system_deps import require_command, require_root

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODES = 4
SLOW = 2
RATE = "200mbit"  # 0.025 GB/s
# Ranks in separate network namespaces, talking over a real (veth) network, reach one verdict:
# the GPU 1.10x slow and the one with silent data corruption are flagged, and only they.
SCENARIO = """
fleet: {nodes: 4, gpus_per_node: 1, spares: 0}
trainer: {tp: 1, pp: 2, dp: 2}
faults:
  - {kind: straggler, rank: 1, slowdown: 1.10}
  - {kind: sdc, rank: 3}
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Fleet:
    namespaces: list[str]
    ifaces: list[str]  # namespace-side veth of each node
    hosts: list[str]  # host-side veth of each node
    addrs: list[str]


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    require_root("network namespaces and tc qdiscs")
    require_command("ip", "iproute2")
    require_command("tc", "iproute2")
    tag = uuid.uuid4().hex[:6]  # unique names: parallel runs must not clash
    bridge = f"sbr{tag}"
    octet = int(tag[:2], 16)
    f = Fleet(
        [f"sbn{tag}{k}" for k in range(NODES)],
        [f"sn{tag}{k}" for k in range(NODES)],
        [f"sh{tag}{k}" for k in range(NODES)],
        [f"198.18.{octet}.{k + 1}" for k in range(NODES)],
    )
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for ns, inner, outer, addr in zip(f.namespaces, f.ifaces, f.hosts, f.addrs, strict=True):
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
            _ip("link", "set", outer, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield f
    finally:
        for ns in f.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for outer in f.hosts:
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _limit(f: Fleet, k: int) -> None:
    tbf = ["root", "tbf", "rate", RATE, "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", f.hosts[k], *tbf], check=True)
    subprocess.run(
        ["ip", "netns", "exec", f.namespaces[k], "tc", "qdisc", "add", "dev", f.ifaces[k], *tbf],
        check=True,
    )


def _gang(f: Fleet, tmp: Path, *args: str) -> list[int]:
    procs = []
    for k, ns in enumerate(f.namespaces):
        env = dict(
            os.environ,
            RANK=str(k),
            WORLD_SIZE=str(NODES),
            LOCAL_RANK="0",
            MASTER_ADDR=f.addrs[0],
            MASTER_PORT="29511",
            SENTINEL_NODE=f"node-{k}",
            GLOO_SOCKET_IFNAME=f.ifaces[k],
            OMP_NUM_THREADS="1",
        )
        out = (
            ["--json", str(tmp / "r.json"), "--exclude-out", str(tmp / "ex.txt")] if k == 0 else []
        )
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "sentinel",
                    "burnin",
                    "--quick",
                    "--no-progress",
                    *out,
                    *args,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        return [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_tbf_limited_node_is_the_only_one_flagged(fleet: Fleet, tmp_path: Path) -> None:
    _limit(fleet, SLOW)
    codes = _gang(
        fleet,
        tmp_path,
        "--phases",
        "collectives,links",
        "-b",
        "4K",
        "-e",
        "64K",
        "--link-search",
        "both",
    )
    rep = json.loads((tmp_path / "r.json").read_text())
    assert codes == [1, 0, 0, 0]  # rank 0 reports the failure, as torchrun would surface it
    assert rep["exclude"] == [f"node-{SLOW}"]
    assert (tmp_path / "ex.txt").read_text() == f"node-{SLOW}\n"
    assert [n for n, row in rep["nodes"].items() if row["verdict"] == "fail"] == [f"node-{SLOW}"]
    assert all(c["correct"] for c in rep["collectives"])
    for link in rep["links"]:
        touches = f"node-{SLOW}" in (link["a"], link["b"])
        assert (link["verdict"] == "fail") == touches
        if touches:  # 200 Mbit/s is 0.025 GB/s; the unthrottled veth runs far faster
            assert 0.005 < link["gbps"] < 0.04, link
        else:
            assert link["gbps"] > 0.1, link
    bis = rep["link_search"]["bisection"]
    assert bis["found"] == f"node-{SLOW}" and bis["rounds"] == 2
    assert rep["link_search"]["circle"]["rounds"] == 3


def test_straggler_and_sdc_ranks_across_namespaces(fleet: Fleet, tmp_path: Path) -> None:
    sc = tmp_path / "faults.yaml"
    sc.write_text(SCENARIO)
    codes = _gang(fleet, tmp_path, "--phases", "stragglers,sdc", "--scenario", str(sc))
    rep = json.loads((tmp_path / "r.json").read_text())
    assert codes == [1, 0, 0, 0]
    assert rep["stragglers"] == [1]
    assert rep["sdc"]["mismatched_ranks"] == [3]
    assert rep["exclude"] == ["node-1", "node-3"]
    assert (tmp_path / "ex.txt").read_text() == "node-1\nnode-3\n"
