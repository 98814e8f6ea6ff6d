"""deploy/: Kubernetes manifests parse and agree with each other and with Sentinel's config,
systemd units pass `systemd-analyze verify`, the Slurm scripts pass shellcheck, and the Slurm
gate drains an unhealthy simulated node through a stand-in `scontrol` and passes a healthy one."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from system_deps import require_command

from sentinel.config import load_config
from sentinel.lab.sim.fleet import SimFleet
from sentinel.processes import free_port
from tests.helpers.unit_sandbox import unit_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SLURM = DEPLOY / "slurm"
_CLUSTER = {"Namespace", "ClusterRole", "ClusterRoleBinding"}  # kinds without a namespace


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def test_kubernetes_manifests_agree() -> None:
    m = manifests()
    ds, dep = m[("DaemonSet", "sentinel-agent")], m[("Deployment", "sentinel-coordinator")]
    svc = m[("Service", "sentinel-coordinator")]
    namespaces = {d["metadata"].get("namespace") for k, d in m.items() if k[0] not in _CLUSTER}
    assert namespaces == {"sentinel"} and ("Namespace", "sentinel") in m
    agent, coord = container(ds), container(dep)
    assert agent["image"] == coord["image"] and ":" in agent["image"]
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == agent["image"]
    pod = ds["spec"]["template"]
    assert pod["spec"]["hostPID"] is False
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in agent["env"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])
    # Prometheus annotations, container port, probes and the agent's listen address agree.
    (port,) = agent["ports"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port["containerPort"])
    assert agent["livenessProbe"]["httpGet"]["port"] == port["name"]
    agent_yaml = yaml.safe_load(m[("ConfigMap", "sentinel-agent")]["data"]["agent.yaml"])
    assert agent_yaml["agent"]["listen"].endswith(f":{port['containerPort']}")
    # The rank socket lives on a hostPath, where training pods can reach it.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {v["name"]: v["mountPath"] for v in agent["volumeMounts"]}
    sock = Path(agent_yaml["agent"]["rank_socket"])
    assert volumes["rank-socket"]["hostPath"]["path"] == mounts["rank-socket"] == str(sock.parent)
    # ...and the init container hands the host directories to the agent's (non-root) user.
    user = agent["securityContext"]["runAsUser"]
    init_mounts = sorted(v["mountPath"] for v in init["volumeMounts"])
    assert init["command"] == ["chown", "-R", f"{user}:{user}", *init_mounts]
    assert sorted(mounts[n] for n in ("rank-socket", "spool")) == init_mounts
    # Agents reach the coordinator's Service, which reaches its container.
    (svc_port,) = svc["spec"]["ports"]
    url = agent_yaml["agent"]["coordinator_url"]
    assert url == f"http://{svc['metadata']['name']}.sentinel.svc:{svc_port['port']}"
    (coord_port,) = coord["ports"]
    assert svc_port["targetPort"] == coord_port["name"]
    assert f"--listen=0.0.0.0:{coord_port['containerPort']}" in coord["args"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    claim = dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in m
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


def test_agent_configmap_is_a_valid_sentinel_config(tmp_path: Path) -> None:
    doc = manifests()[("ConfigMap", "sentinel-agent")]["data"]["agent.yaml"]
    (tmp_path / "agent.yaml").write_text(doc)
    env = {"SENTINEL_AGENT__NODE_ID": "gpu-node-7"}
    cfg = load_config(tmp_path / "agent.yaml", env=env)
    assert cfg.agent.node_id == "gpu-node-7" and cfg.agent.listen == "0.0.0.0:9410"


@pytest.mark.parametrize(
    "unit",
    ["sentinel-agent.service", "sentinel-coordinator.service", "sentinel-coordinator@.service"],
)
def test_systemd_units_verify(unit: str, tmp_path: Path) -> None:
    """As shipped, except ExecStart points at this checkout's `sentinel` (verify requires the
    binary to exist). A template is verified as an instance of it (`@a`), which also resolves
    its specifiers (%i, %d): one it cannot resolve is a warning naming the unit."""
    systemd_analyze = require_command("systemd-analyze", "systemd")
    sentinel = shutil.which("sentinel") or str(Path(sys.executable).parent / "sentinel")
    text = (DEPLOY / "systemd" / unit).read_text()
    assert "ExecStart=/usr/local/bin/sentinel " in text
    (tmp_path / unit).write_text(text.replace("/usr/local/bin/sentinel", sentinel))
    instance = unit.replace("@.", "@a.")
    r = subprocess.run(
        [systemd_analyze, "verify", str(tmp_path / instance)], capture_output=True, text=True
    )
    assert r.returncode == 0 and unit.split("@")[0] not in r.stderr, r.stderr


def test_coordinator_unit_type_matches_the_coordinator() -> None:
    """Type=notify would hang the start: the coordinator does not send READY=1."""
    text = (DEPLOY / "systemd" / "sentinel-coordinator.service").read_text()
    assert "Type=exec" in text and "NoNewPrivileges=yes" in text


# Coordinator replicas on PostgreSQL: systemd and Kubernetes ----------------------------------
# No Kubernetes API server exists here: the manifests are checked as data (they parse, and the
# names, ports, paths and files they refer to agree), not applied.

PG = DEPLOY / "k8s" / "postgresql" / "coordinator.yaml"


def test_replica_unit_keeps_the_password_out_of_argv_and_environment() -> None:
    """The password reaches libpq as a systemd credential (a file only this service reads),
    named by PGPASSFILE; nothing in the unit or its config is the password itself."""
    unit = unit_settings((DEPLOY / "systemd" / "sentinel-coordinator@.service").read_text())
    (credential,) = unit["LoadCredential"]
    name, _, source = credential.partition(":")
    assert source == "/etc/sentinel/pgpass"
    assert f"PGPASSFILE=%d/{name}" in unit["Environment"]
    assert not any("PASSWORD" in e.upper().split("=")[0] for e in unit["Environment"])
    (exec_start,) = unit["ExecStart"]
    assert "pass" not in exec_start.lower()
    # One file and one state directory per replica: two may share a host.
    assert "--config /etc/sentinel/coordinator-%i.yaml" in exec_start
    assert "--state-dir /var/lib/sentinel/coordinator-%i" in exec_start
    assert unit["StateDirectory"] == ["sentinel sentinel/coordinator-%i"]
    replica = yaml.safe_load((DEPLOY / "coordinator-replica.yaml").read_text())["coordinator"]
    assert replica["store"] == "postgresql://sentinel@db.example:5432/sentinel?sslmode=verify-full"
    assert set(replica) & {"store_password_file", "password"} == set()


def test_replica_config_is_a_valid_sentinel_config() -> None:
    cfg = load_config(DEPLOY / "coordinator-replica.yaml", env={})
    assert cfg.coordinator.store and cfg.coordinator.listen == "0.0.0.0:8470"


def test_agents_list_both_replicas() -> None:
    cfg = load_config(DEPLOY / "agent-replicas.yaml", env={})
    urls = ("https://coord-a.example:8470", "https://coord-b.example:8470")
    assert cfg.agent.coordinator_url == urls and cfg.supervisor.coordinator_url == urls


def pg_manifests() -> dict[tuple[str, str], dict[str, Any]]:
    docs = list(yaml.safe_load_all(PG.read_text()))
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def mounts_of(pod: dict[str, Any], c: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Volume name -> (its mount path, the volume)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["name"]: (m["mountPath"], volumes[m["name"]]) for m in c["volumeMounts"]}


def test_kubernetes_replicas_on_postgresql_agree() -> None:
    m, header = pg_manifests(), PG.read_text()
    dep, svc = m[("Deployment", "sentinel-coordinator")], m[("Service", "sentinel-coordinator")]
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert {d["metadata"]["namespace"] for d in m.values()} == {"sentinel"}
    # Both replicas ready on /healthz (a follower serves too), behind one Service.
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    (port,) = c["ports"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"]
    assert m[("PodDisruptionBudget", "sentinel-coordinator")]["spec"]["minAvailable"] == 1
    # The same Service name and port the agents' ConfigMap already dials.
    agent_cfg = manifests()[("ConfigMap", "sentinel-agent")]["data"]["agent.yaml"]
    assert yaml.safe_load(agent_cfg)["agent"]["coordinator_url"] == (
        f"http://{svc['metadata']['name']}.sentinel.svc:{svc['spec']['ports'][0]['port']}"
    )
    rbac = yaml.safe_load_all((DEPLOY / "k8s" / "coordinator-rbac.yaml").read_text())
    assert ("ServiceAccount", pod["serviceAccountName"]) in {
        (d["kind"], d["metadata"]["name"]) for d in rbac
    }
    # The config the container reads is the ConfigMap's, listening on the container's port.
    mounts = mounts_of(pod, c)
    path, volume = mounts["config"]
    assert f"--config={path}" in c["args"]
    doc = m[("ConfigMap", volume["configMap"]["name"])]["data"][path.rsplit("/", 1)[1]]
    coord = yaml.safe_load(doc)["coordinator"]
    assert coord["listen"] == f"0.0.0.0:{port['containerPort']}"
    assert coord["state_dir"] == mounts["state"][0]
    # The database: an ExternalName Service, dialled by its cluster name, verify-full.
    db = m[("Service", "sentinel-db")]
    assert db["spec"]["type"] == "ExternalName" and db["spec"]["externalName"]
    db_port = db["spec"]["ports"][0]["port"]
    assert coord["store"] == (
        f"postgresql://sentinel@sentinel-db.sentinel.svc:{db_port}/sentinel?sslmode=verify-full"
    )
    # The password: a file of a Secret this file tells the operator to create (no Secret, and
    # no password, in the manifests); the CA likewise, named to libpq by PGSSLROOTCERT.
    secret_path, secret = mounts["db-password"]
    name = secret["secret"]["secretName"]
    assert f"create secret generic {name} --from-file=password=" in header
    assert coord["store_password_file"] == f"{secret_path}/password"
    ca_path, ca = mounts["db-ca"]
    assert f"create configmap {ca['configMap']['name']} --from-file=ca.crt=" in header
    assert {"name": "PGSSLROOTCERT", "value": f"{ca_path}/ca.crt"} in c["env"]
    assert "Secret" not in {k for k, _ in m} and "PGPASSWORD" not in header


def test_kubernetes_replica_config_is_a_valid_sentinel_config(tmp_path: Path) -> None:
    doc = pg_manifests()[("ConfigMap", "sentinel-coordinator")]["data"]["coordinator.yaml"]
    (tmp_path / "coordinator.yaml").write_text(doc)
    cfg = load_config(tmp_path / "coordinator.yaml", env={})
    assert cfg.coordinator.store and cfg.coordinator.eviction_backend == "kubernetes"


def test_slurm_scripts_pass_shellcheck() -> None:
    scripts = sorted(str(p) for p in [*SLURM.glob("*.sh"), *SLURM.glob("*.sbatch")])
    assert len(scripts) == 4
    shellcheck = require_command("shellcheck", "shellcheck")
    r = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True, cwd=SLURM)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(os.access(s, os.X_OK) for s in scripts)


# The Slurm gate against a simulated node ----------------------------------------------------


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def slurm_env(tmp_path: Path) -> dict[str, str]:
    """PATH with a stand-in `scontrol` (records each call, one argument per line) and a stand-in
    `sentinel` for the optional burn-in (exits with $BURNIN_RC)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(
        bin_dir, "scontrol", 'printf "%s\\n" "$@" >> "$SCONTROL_LOG"; echo --- >> "$SCONTROL_LOG"'
    )
    stand_in(bin_dir, "sentinel", 'echo "burnin stand-in: $*" >&2; exit "${BURNIN_RC:-0}"')
    return dict(os.environ) | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "SENTINEL_BIN": str(bin_dir / "sentinel"),
        "SENTINEL_GATE_BURNIN_CMD": f"{bin_dir / 'sentinel'} burnin --quick",
    }


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    fleet = SimFleet(tmp_path_factory.mktemp("slurm"), ["gpu-node-0"], 2, interval_s=0.3)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def gate(script: str, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SLURM / script)], env=env | extra, capture_output=True, text=True, timeout=60
    )


def scontrol_calls(env: dict[str, str]) -> list[list[str]]:
    log = Path(env["SCONTROL_LOG"])
    if not log.exists():
        return []
    return [c.strip("\n").split("\n") for c in log.read_text().split("---\n") if c.strip()]


def hostname() -> str:
    return subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()


def test_slurm_gate(agent: SimFleet, slurm_env: dict[str, str]) -> None:
    """One agent, in order: healthy passes (also with a passing burn-in), a failing burn-in
    drains, then a DBE makes it unhealthy: the prolog drains and refuses, the epilog drains."""
    env = slurm_env | {"SENTINEL_AGENT_URL": agent.agents["gpu-node-0"].url}
    r = gate("prolog.sh", env)
    assert r.returncode == 0 and "healthy" in r.stderr, r.stderr
    r = gate("prolog.sh", env, SENTINEL_GATE_BURNIN="1")
    assert r.returncode == 0 and "burnin stand-in: burnin --quick --json" in r.stderr
    assert scontrol_calls(env) == []

    r = gate("prolog.sh", env, SENTINEL_GATE_BURNIN="1", BURNIN_RC="1")
    assert r.returncode == 1
    ((*head, reason),) = scontrol_calls(env)
    assert head == ["update", f"NodeName={hostname()}", "State=DRAIN"]
    assert reason.startswith("Reason=sentinel: quick burn-in failed")
    Path(env["SCONTROL_LOG"]).unlink()

    agent.inject("gpu-node-0", {"kind": "ecc_dbe", "gpu": 1})
    deadline = time.monotonic() + 20
    while json.loads(agent.agents["gpu-node-0"].get("/healthz"))["verdict"] != "unhealthy":
        assert time.monotonic() < deadline, "agent never judged the DBE"
        time.sleep(0.2)
    r = gate("prolog.sh", env)
    assert r.returncode == 1, r.stderr
    r = gate("epilog.sh", env)
    assert r.returncode == 0, r.stderr
    calls = scontrol_calls(env)
    assert len(calls) == 2
    for *head, reason in calls:
        assert head == ["update", f"NodeName={hostname()}", "State=DRAIN"]
        assert reason.startswith("Reason=sentinel: unhealthy: gpu1 ecc_dbe_volatile"), reason
        assert "(action: reset_gpu)" in reason


def test_slurm_gate_without_an_agent(slurm_env: dict[str, str]) -> None:
    env = slurm_env | {"SENTINEL_AGENT_URL": f"http://127.0.0.1:{free_port()}"}
    r = gate("prolog.sh", env, SENTINEL_GATE_TIMEOUT_S="2")
    assert r.returncode == 0 and "not gating" in r.stderr
    assert scontrol_calls(env) == []
    r = gate("prolog.sh", env, SENTINEL_GATE_TIMEOUT_S="2", SENTINEL_GATE_STRICT="1")
    assert r.returncode == 1
    ((*_, reason),) = scontrol_calls(env)
    assert "not answering" in reason
    r = subprocess.run([str(SLURM / "sentinel-gate.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


# A port in a URL (http://ctl:8470) or after a host named for the coordinator (coord-0:8470).
_URL_PORT = re.compile(r"(?:https?://[\w.-]+|coord[\w.-]*):(\d{4,5})\b")


def test_each_daemon_has_one_port_that_collides_with_nothing_usual() -> None:
    """The agent's and the coordinator's default ports are not dcgm-exporter's (9400, which runs
    beside the agent on the same nodes), node_exporter's (9100), Prometheus's (9090),
    Alertmanager's (9093) or Grafana's (3000); and every shipped file and doc names the
    coordinator by its one port (any URL's port, or a coordinator host's, on a line that names
    the coordinator)."""
    from sentinel.config import AgentConfig, CoordinatorConfig, host_port

    usual = {9400, 9100, 9090, 9093, 3000}
    agent, coordinator = (
        host_port(AgentConfig().listen)[1],
        host_port(CoordinatorConfig().listen)[1],
    )
    assert not {agent, coordinator} & usual and agent != coordinator
    texts = [p for d in ("deploy", "docs") for p in (ROOT / d).rglob("*") if p.is_file()]
    for path in [*texts, ROOT / "README.md"]:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "coord" in line.lower() and "dcgm" not in line.lower():
                for port in {int(p) for p in _URL_PORT.findall(line)}:
                    assert port == coordinator, f"{path.relative_to(ROOT)}:{n}: {line.strip()}"


def _merged(base: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A strategic merge of two lists keyed by `name` (containers, env, volumes)."""
    by_name = {item["name"]: dict(item) for item in base}
    for item in patch:
        by_name[item["name"]] = by_name.get(item["name"], {}) | item
    return list(by_name.values())


def test_the_kernel_log_is_off_on_kubernetes_unless_the_privileged_patch_is_applied(
    tmp_path: Path,
) -> None:
    """An unprivileged container cannot open the host's /dev/kmsg (the device cgroup): the
    DaemonSet does not claim the source (kmsg off, said at start), and the opt-in patch gives
    the agent what reading it takes: the device, privileged, as root (CAP_SYSLOG)."""
    ds = manifests()[("DaemonSet", "sentinel-agent")]
    agent = container(ds)
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["SENTINEL_AGENT__KMSG"] == "off" and not agent["securityContext"].get("privileged")
    doc = manifests()[("ConfigMap", "sentinel-agent")]["data"]["agent.yaml"]
    (tmp_path / "agent.yaml").write_text(doc)
    env = {"SENTINEL_AGENT__NODE_ID": "n", "SENTINEL_AGENT__KMSG": "off"}
    cfg = load_config(tmp_path / "agent.yaml", env=env)
    assert cfg.agent.kmsg == "off"
    patch = yaml.safe_load((DEPLOY / "k8s" / "patches" / "agent-kernel-log.yaml").read_text())
    (wanted,) = patch["spec"]["template"]["spec"]["containers"]
    assert wanted["name"] == agent["name"]
    patched = agent | {
        "env": _merged(agent["env"], wanted["env"]),
        "securityContext": agent["securityContext"] | wanted["securityContext"],
        "volumeMounts": _merged(agent["volumeMounts"], wanted["volumeMounts"]),
    }
    env = {e["name"]: e.get("value") for e in patched["env"]}
    assert env["SENTINEL_AGENT__KMSG"] == "auto"
    sc = patched["securityContext"]
    assert sc["privileged"] and sc["runAsUser"] == 0 and sc["runAsGroup"] == 65532
    volumes = _merged(
        ds["spec"]["template"]["spec"]["volumes"], patch["spec"]["template"]["spec"]["volumes"]
    )
    (kmsg,) = [v for v in volumes if v["name"] == "kmsg"]
    assert kmsg["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True} in patched["volumeMounts"]
