"""Configuration drift: the judgement (sentinel/fingerprint.py), each node's latest fingerprint
in the store (SQLite and PostgreSQL), and `sentinel fleet drift` against a real coordinator."""

from __future__ import annotations

import json
import subprocess
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from coord_util import SENTINEL, Coordinator

from sentinel.fingerprint import MISSING, checked, drift, node_fields, runtime_fields
from sentinel.protocol import (
    AgentFingerprintEvent,
    AgentFingerprintPayload,
    EventBatch,
    ProtocolError,
    Source,
    decode_event,
    encode,
)

BASE = {"driver": "570.124.06", "cuda_driver": "12.8", "gpu.0.vbios": "96.00.A5.00.01"}


def fleet(n: int, **changed: dict[str, str]) -> dict[str, dict[str, str]]:
    prints = {f"node-{i}": dict(BASE) for i in range(n)}
    for node, fields in changed.items():
        prints[node.replace("_", "-")] = fields
    return prints


def test_a_node_off_the_majority_is_named_with_the_fields_that_differ() -> None:
    prints = fleet(5, node_3=BASE | {"driver": "550.54.15", "env.NCCL_IB_HCA": "mlx5_1"})
    (found,) = drift(prints)
    assert found.node == "node-3"
    assert [(d.field, d.value, d.majority) for d in found.differences] == [
        ("driver", "550.54.15", "570.124.06"),
        ("env.NCCL_IB_HCA", "mlx5_1", MISSING),
    ]
    assert found.reason() == (
        "configuration drift: driver=550.54.15 (fleet: 570.124.06), "
        "env.NCCL_IB_HCA=mlx5_1 (fleet: (missing))"
    )
    # A field declared allowed to vary is not judged; patterns match as fnmatch.
    assert [d.node for d in drift(prints, ["driver", "env.*"])] == []
    assert [d.node for d in drift(prints, ["env.NCCL_*"])] == ["node-3"]


def test_a_split_field_names_every_node_and_two_nodes_have_no_majority() -> None:
    half = {"driver": "550.54.15"}
    prints = fleet(4, node_2=BASE | half, node_3=BASE | half)
    assert [d.node for d in drift(prints)] == ["node-0", "node-1", "node-2", "node-3"]
    assert {d.differences[0].majority for d in drift(prints)} == {""}
    assert drift(fleet(2, node_1=BASE | half)) == []
    assert drift(fleet(64)) == []


def test_a_node_is_its_ranks_and_per_rank_binding_is_no_drift() -> None:
    """Each rank bound to its own adapter (NCCL_IB_HCA by local rank) on every node: no drift.
    One rank of one node given another adapter: that node, by the rank's field."""
    rank = {"torch": "2.13.0"}
    bound = [rank | {"env.NCCL_IB_HCA": f"mlx5_{i}"} for i in range(2)]
    assert node_fields(bound) == {
        "torch": "2.13.0",
        "local.0.env.NCCL_IB_HCA": "mlx5_0",
        "local.1.env.NCCL_IB_HCA": "mlx5_1",
    }
    fleet_of = {f"node-{n}": node_fields(bound) for n in range(4)}
    assert drift(fleet_of) == []
    fleet_of["node-2"] = node_fields([bound[0], rank | {"env.NCCL_IB_HCA": "mlx5_0"}])
    (found,) = drift(fleet_of)
    assert found.node == "node-2" and [d.field for d in found.differences] == [
        "env.NCCL_IB_HCA",
        "local.0.env.NCCL_IB_HCA",
        "local.1.env.NCCL_IB_HCA",
    ]


def test_fingerprints_are_bounded_and_the_runtime_reads_the_ranks_environment() -> None:
    fields = runtime_fields({"NCCL_IB_HCA": "mlx5_0", "FI_PROVIDER": "efa", "HOME": "/root"})
    assert fields["env.NCCL_IB_HCA"] == "mlx5_0" and fields["env.FI_PROVIDER"] == "efa"
    assert "env.HOME" not in fields and fields["torch"].startswith("2.13")
    assert {"kernel", "python"} <= set(fields)
    assert checked({"ok": "x" * 1000, "bad name!": "y"}) == {"ok": "x" * 256}
    with pytest.raises(ProtocolError):  # the wire refuses what `checked` would have cut
        decode_event(
            '{"v": 1, "kind": "agent.fingerprint", "source": {"node": "n"}, "id": "a1", '
            '"ts": 1, "payload": {"fields": {"bad name!": "y"}}}'
        )


def fingerprint_event(node: str, fields: dict[str, str], ts: float = 1.0) -> AgentFingerprintEvent:
    return AgentFingerprintEvent(
        source=Source(node=node), ts=ts, payload=AgentFingerprintPayload(fields=fields)
    )


def test_the_store_keeps_each_nodes_latest_fingerprint(new_store: Callable[[], Any]) -> None:
    store = new_store()
    store.insert_events([fingerprint_event(n, f) for n, f in fleet(3).items()], 1.0)
    store.insert_events([fingerprint_event("node-1", BASE | {"driver": "550.54.15"}, 2.0)], 2.0)
    prints = store.fingerprints()
    assert sorted(prints) == ["node-0", "node-1", "node-2"]
    assert prints["node-1"]["driver"] == "550.54.15" and prints["node-0"] == BASE


def drift_cli(coord: Coordinator, token: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*SENTINEL, "fleet", "drift", "--coordinator", coord.url, "--token-file", str(token)]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60)


def test_sentinel_fleet_drift_names_the_drifted_node(coord: Coordinator, tmp_path: Path) -> None:
    node = coord.token("--role", "node", "--node", "node-2")
    admin = coord.token("--role", "admin")
    prints = fleet(5)
    del prints["node-2"]
    sent = [fingerprint_event(n, f) for n, f in prints.items()]
    coord.call("POST", "/v1/events", admin, encode(EventBatch(events=sent)).encode())
    token = tmp_path / "operator.token"
    token.write_text(coord.token("--role", "operator") + "\n")
    clean = drift_cli(coord, token)
    assert clean.returncode == 0, clean.stderr
    assert "4 nodes reported a fingerprint; none differs" in clean.stdout
    # node-2's agent speaks for node-2 only, with its own token.
    mine = fingerprint_event("node-2", BASE | {"gpu.0.vbios": "96.00.61.00.01"})
    coord.call("POST", "/v1/events", node, encode(EventBatch(events=[mine])).encode())
    found = drift_cli(coord, token, "--json")
    assert found.returncode == 1, found.stderr
    doc = json.loads(found.stdout)
    assert doc["nodes"] == 5 and [d["node"] for d in doc["drifted"]] == ["node-2"]
    (diff,) = doc["drifted"][0]["differences"]
    assert diff == {
        "field": "gpu.0.vbios",
        "value": "96.00.61.00.01",
        "majority": BASE["gpu.0.vbios"],
    }
    text = drift_cli(coord, token)
    assert "node-2\n    gpu.0.vbios: 96.00.61.00.01  (fleet: 96.00.A5.00.01)" in text.stdout
    allowed = drift_cli(coord, token, "--allow", "gpu.*.vbios")
    assert allowed.returncode == 0 and "allowed to differ: gpu.*.vbios" in allowed.stdout
    bad = drift_cli(coord, token, "--allow", "no spaces")
    assert bad.returncode == 2 and "--allow 'no spaces'" in bad.stderr
    # The API judges each pattern of its list as the command does: 400, naming the bad one.
    operator = token.read_text().strip()
    with pytest.raises(urllib.error.HTTPError) as refused:
        coord.call("GET", "/v1/fleet/drift?allow=gpu.*.vbios,a%2Fb", operator)
    assert (
        refused.value.code == 400 and "'a/b' is not a field name" in refused.value.read().decode()
    )
    too_long = "x" * 129  # one pattern longer than a field name can be
    with pytest.raises(urllib.error.HTTPError) as refused:
        coord.call("GET", f"/v1/fleet/drift?allow={too_long}", operator)
    assert refused.value.code == 400


def test_the_burnin_keeps_a_drifted_node_out_before_it_measures(tmp_path: Path) -> None:
    """The drill: node-2's ranks are given another NCCL_IB_HCA (`scenarios/config_drift.yaml`);
    the burn-in's first phase reads every rank's fingerprint and excludes node-2 with the field
    that differs. Declared allowed to vary (on a three-rank fleet: fewer processes), it passes."""

    def burnin(scenario: str, *args: str) -> tuple[int, dict[str, Any]]:
        report = tmp_path / "r.json"
        argv = [*SENTINEL, "burnin", "--scenario", scenario, "--quick", "--no-progress"]
        argv += ["--phases", "drift", "--json", str(report), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
        return done.returncode, json.loads(report.read_text())

    code, rep = burnin("config_drift", "--exclude-out", str(tmp_path / "ex.txt"))
    assert code == 1 and rep["exclude"] == ["node-2"]
    assert (tmp_path / "ex.txt").read_text().split() == ["node-2"]
    assert rep["nodes"]["node-2"]["reasons"] == [
        "configuration drift: env.NCCL_IB_HCA=mlx5_2,mlx5_3 (fleet: (missing))"
    ]
    assert rep["drift"]["nodes"] == 4 and [d["node"] for d in rep["drift"]["drifted"]] == ["node-2"]
    small = tmp_path / "small.yaml"
    small.write_text(
        "fleet: {nodes: 3, gpus_per_node: 1, spares: 0}\n"
        "trainer: {tp: 1, pp: 1, dp: 3, steps: 30, checkpoint_every: 10, seed: 7}\n"
        "faults: [{kind: config_drift, node: node-2, env: {NCCL_IB_HCA: mlx5_2}}]\n"
    )
    code, rep = burnin(str(small), "--allow-drift", "env.NCCL_IB_*")
    assert code == 0 and rep["exclude"] == [] and rep["drift"]["allowed"] == ["env.NCCL_IB_*"]
    bad = subprocess.run(
        [*SENTINEL, "burnin", "--sim-nodes", "2", "--allow-drift", "no spaces"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--allow-drift 'no spaces'" in bad.stderr
