"""A real Prometheus scraping a real (simulated) fleet: the shipped scrape config and alert rules,
every dashboard query through Prometheus' HTTP API, and injected faults firing their alerts.

The fleet: three simulated node agents of 2 GPUs as processes (two H100 nodes and a V100 one,
since only pre-Ampere GPUs report retired pages), each delivering its events to a real
`sentinel coordinator` with its own node token (a node token may speak only for its node); a
short run of the hooked reference trainer, two ranks of a tiny model on node-0 and node-1, each
reporting every step through its node's agent socket, with a corrupt batch (a loss spike), a
straggling rank, checkpoints every 10 steps and, at the end, a hung rank; and a burn-in report,
turned into text by burnin_metrics, served as node_exporter's textfile collector would. Debian's `prometheus` binary
scrapes the agents, the coordinator (with an operator's bearer token) and the textfile every
second, on a free loopback port with its TSDB in tmp. Every dashboard panel and every series an
alert rule reads has data; nothing is exempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from burnin_sample import SAMPLE_REPORT
from coord_util import Coordinator
from system_deps import require_command

from sentinel.agent.export.dcgm import promql
from sentinel.dashboards import build_all
from sentinel.dashboards.burnin_metrics import exposition
from sentinel.dashboards.panels import expressions
from sentinel.lab.sim.fleet import AgentProcess, SimFleet
from sentinel.processes import free_port
from trainer_hooks.reference.launch import Gang, launch

ROOT = Path(__file__).resolve().parent.parent
PROM_DIR = ROOT / "deploy" / "prometheus"


# (dashboard, panel) whose series no process in this test's fleet exports (none today: the
# job panels read `sentinel_gpu_job_info`, from the ranks' registrations on their agents).
NOT_IN_THIS_FLEET: set[tuple[str, str]] = set()
JOB = "llm"
RANK_NODES = ["node-0", "node-1"]  # rank r runs on RANK_NODES[r]
HANG_STEP = 30
# A tiny model (as in test_reference_trainer), one micro-batch a step, every rank counter at 0
# in a scrape before its first report: batch 22 is garbage (a grad-norm/loss spike past the
# anomaly detector's 16-step warmup; the EMA z-score policy, as the 30-step curve is too noisy for
# the default median+MAD one), rank 1 runs 6x slow from step 16, and rank 0 hangs before step
# HANG_STEP (the run never ends: the fixture kills it).
TRAIN_ARGS = ["--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--vocab", "128"]
TRAIN_ARGS += ["--corpus-tokens", "65536", "--warmup", "2", "--quiet", "--mbs", "2"]
TRAIN_ARGS += ["--accum", "1", "--steps", str(HANG_STEP + 5), "--fault", "corrupt_batch:batch=22"]
TRAIN_ARGS += ["--checkpoint-every", "10"]  # committed (and reported by rank 0) by the hang
TRAIN_ARGS += [
    "--fault",
    "straggler:rank=1,slowdown=6,at_step=16",
    "--fault",
    f"hang:rank=0,at_step={HANG_STEP}",
]
HOOKS_ENV = {
    "SENTINEL_JOB": JOB,
    "SENTINEL_HOOKS_REPORT_EVERY": "1",
    "SENTINEL_HOOKS_ANOMALY_POLICY": "zclip",
    "SENTINEL_HOOKS_EXCHANGE_EVERY": "2",
    "SENTINEL_HOOKS_STRAGGLER_WINDOW": "2",
    "SENTINEL_HOOKS_STRAGGLER_PERSIST": "2",
    "SENTINEL_HOOKS_STRAGGLER_OVER": "2",
    # Two-step windows of two ranks on a loaded 2-core machine differ by 10% or more from noise
    # alone, and with two ranks one of them is always "the slowest": the default 1.03, and
    # once even 1.5, flagged the healthy rank 0 in CI (this tiny model's steps take a few ms,
    # and rank 0 also writes the run's metrics). The injected straggler is 6x slow; the
    # detector's sensitivity (5% within 100 steps, no false positive) is test_hooks_gang's.
    "SENTINEL_HOOKS_STRAGGLER_THRESHOLD": "3",
    "SENTINEL_HOOKS_HANG_FLOOR_S": "2",
    "SENTINEL_HOOKS_WATCHDOG_POLL_S": "0.2",
}
ALL_VALUES = {"node": ".*", "gpu": ".*", "job": ".*", "rank": ".*", "instance": ".*"}
# The training run's panels answer for its job (and a rank); the fleet panels for a node/GPU.
# Concrete nodes/GPUs (an H100 with a DBE, a V100 with one, the thermal H100 node that fails the
# burn-in): a panel must answer for at least one of them.
CONCRETE = [
    ALL_VALUES | {"node": "node-0", "gpu": "0", "job": JOB, "rank": "1"},
    ALL_VALUES | {"node": "node-2", "gpu": "0"},
    ALL_VALUES | {"node": "node-1", "gpu": "0"},
]
MODELS = {"node-2": "Tesla V100-SXM2-32GB"}
# dcgm-exporter's two namings: node-0 the legacy one (the default), node-1 dcgm-exporter 4.9's
# (DCGM 4.7's names, base units, `hostname`), node-2 both. The dashboards and alerts read all.
DCGM_NAMES = {"node-1": "dcgm-4.7", "node-2": "both"}


class MixedFleet(SimFleet):
    """A SimFleet whose nodes may simulate different GPU models and serve dcgm-exporter's
    series under different namings (through each agent's config)."""

    def command(self, a: AgentProcess) -> list[str]:
        cmd = super().command(a)
        agent: dict[str, Any] = {}
        if a.node_id in MODELS:
            agent["sim"] = {"model": MODELS[a.node_id]}
        if a.node_id in DCGM_NAMES:
            agent["dcgm_names"] = DCGM_NAMES[a.node_id]
        if agent:
            config = a.faults_file.parent / "agent.yaml"
            config.write_text(yaml.safe_dump({"agent": agent}))
            cmd[cmd.index("agent") + 1 : cmd.index("agent") + 1] = ["--config", str(config)]
        return cmd


class PromAPI:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as e:  # 400 on a bad query: the body says why
            body = json.loads(e.read())
        return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)

    def wait(self, what: str, ok: Any, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = ok()
                if result:
                    return result
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.25)


def prometheus_config(
    fleet: SimFleet,
    coordinator: Coordinator,
    token_file: Path,
    textfile_target: str,
    dcgm_target: str,
) -> dict[str, Any]:
    """The shipped scrape.yml with the agent and coordinator targets swapped for the fleet's,
    scraped each second. A `node` job stands in for node_exporter serving the burn-in textfile,
    and a `dcgm-exporter` job for a dcgm-exporter beside the agents (it needs DCGM and a GPU)."""
    config = yaml.safe_load((PROM_DIR / "scrape.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROM_DIR / "alerts.yml")]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    agent, coord = jobs["sentinel-agent"], jobs["sentinel-coordinator"]
    agent.pop("file_sd_configs")
    agent["scrape_interval"], agent["scrape_timeout"] = "1s", "1s"
    agent["static_configs"] = [{"targets": [f"127.0.0.1:{a.port}" for a in fleet.agents.values()]}]
    coord["scrape_interval"], coord["scrape_timeout"] = "1s", "1s"
    coord["authorization"]["credentials_file"] = str(token_file)
    coord["static_configs"] = [{"targets": [f"127.0.0.1:{coordinator.port}"]}]
    node = {"job_name": "node", "static_configs": [{"targets": [textfile_target]}]}
    dcgm = {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm_target]}]}
    config["scrape_configs"] = [agent, coord, node, dcgm]
    return config


@contextlib.contextmanager
def static_exporter(body: bytes) -> Iterator[str]:
    """An HTTP server answering every GET with `body` as a Prometheus exposition."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def textfile_exporter() -> Iterator[str]:
    """Serves the burn-in report's exposition at /metrics, as node_exporter's textfile collector
    would serve the file `sentinel dashboards burnin-textfile` writes."""
    with static_exporter(exposition(SAMPLE_REPORT, time.time() - 600)) as target:
        yield target


@pytest.fixture(scope="module")
def gpuless_dcgm_exporter() -> Iterator[str]:
    """A dcgm-exporter whose DCGM connection failed: it answers scrapes, with no GPU series (the
    real one needs DCGM and a GPU, so an empty exposition stands in for it)."""
    with static_exporter(b"") as target:
        yield target


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """A real `sentinel coordinator` process (tests/coord_util.py). On SIGTERM it lets requests
    in flight finish, and the agents' command long-polls last up to long_poll_max_s (30 s by
    default): 2 s here, so it stops promptly."""
    c = Coordinator(tmp_path_factory.mktemp("coordinator") / "state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SENTINEL_COORDINATOR__LONG_POLL_MAX_S", "2")
        c.start()
    try:
        yield c
    finally:
        assert c.proc is not None
        c.proc.terminate()
        c.proc.wait(20)


def write_token(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, coordinator: Coordinator) -> Iterator[SimFleet]:
    work = tmp_path_factory.mktemp("fleet")
    nodes = ["node-0", "node-1", "node-2"]
    tokens = {
        n: write_token(work / f"{n}.token", coordinator.token("--role", "node", "--node", n))
        for n in nodes
    }
    fleet = MixedFleet(work, nodes, 2, 0.5, coordinator_url=coordinator.url, token_files=tokens)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def training(
    fleet: SimFleet, prom: PromAPI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gang]:
    """The hooked reference trainer, rank r on RANK_NODES[r], each rank reporting through its
    node's agent socket, started once Prometheus scrapes every target (so it sees each rank's
    event counters at 0 before the faults). It hangs at HANG_STEP and is killed at teardown."""
    prom.wait("every target scraped", lambda: all_up(prom))
    out = tmp_path_factory.mktemp("train")
    args = [*TRAIN_ARGS, "--out", str(out), "--data-dir", str(out / "data")]
    env = {**os.environ, **HOOKS_ENV, "SENTINEL_HOOKS_FR_DIR": str(out / "fr")}
    gang = launch(
        len(RANK_NODES),
        args,
        log_dir=out / "logs",
        node_of_rank=RANK_NODES.__getitem__,
        env=env,
        env_of_node=lambda n: {"SENTINEL_AGENT_SOCKET": str(fleet.agents[n].rank_socket)},
        fork=True,
    )
    try:
        yield gang
    finally:
        gang.kill()


@pytest.fixture(scope="module")
def prom(
    fleet: SimFleet,
    coordinator: Coordinator,
    textfile_exporter: str,
    gpuless_dcgm_exporter: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PromAPI]:
    prometheus = require_command("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    token = write_token(work / "coordinator.token", coordinator.token("--role", "operator"))
    config = prometheus_config(fleet, coordinator, token, textfile_exporter, gpuless_dcgm_exporter)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=log,
    )
    api = PromAPI(f"http://127.0.0.1:{port}")
    try:
        api.wait("prometheus ready", lambda: proc.poll() is None and _ready(api.url))
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if proc.returncode not in (0, -15):
            print((work / "prometheus.log").read_text()[-3000:])


def _ready(url: str) -> bool:
    with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
        return resp.status == 200


def all_up(prom: PromAPI) -> bool:
    active = prom.get("/api/v1/targets")["data"]["activeTargets"]
    return len(active) == 6 and all(t["health"] == "up" for t in active)


@pytest.fixture(scope="module")
def faulted(fleet: SimFleet, prom: PromAPI, training: Gang) -> PromAPI:
    """Targets up and the training run started, then a DBE on node-0/0 and node-2/0, XID 79 on
    node-1/1 and a thermal fault on node-1/0, each seen by Prometheus; and the training run's
    loss spike, straggler, checkpoint and hang reports in the TSDB too."""

    fleet.inject("node-0", {"kind": "ecc_dbe", "gpu": 0})
    fleet.inject("node-1", {"kind": "xid", "gpu": 1, "xid": 79})
    fleet.inject("node-1", {"kind": "thermal", "gpu": 0, "temp_c": 96})
    fleet.inject("node-2", {"kind": "ecc_dbe", "gpu": 0})
    findings = 'sentinel_gpu_health_finding{rule=~"xid_79|xid_48|gpu_temp_unhealthy"}'
    # xid_48 on node-0/0 and node-2/0, xid_79 on node-1/1, gpu_temp_unhealthy on node-1/0.
    prom.wait("faults in the TSDB", lambda: len(prom.query(findings)["data"]["result"]) == 4)

    def reported(kind: str) -> bool:
        q = f'sentinel_rank_events_total{{job="{JOB}", kind="{kind}"}} > 0'
        return bool(prom.query(q)["data"]["result"])

    for kind in ("rank.anomaly", "rank.straggler", "rank.checkpoint", "rank.hang"):
        prom.wait(f"{kind} in the TSDB", lambda k=kind: reported(k), timeout_s=60)
    prom.wait(
        "incidents opened by the coordinator",
        lambda: prom.query("sentinel_coordinator_incidents_opened_total")["data"]["result"],
    )
    time.sleep(3)  # a few more scrapes, so 5s rates have two samples after the faults
    return prom


def substitute(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", "5s").replace("$__range", "1m")
    return re.sub(r"\$([A-Za-z_]\w*)", lambda m: values[m.group(1)], expr)  # not label_replace's $1


def as_query(title: str, expr: str) -> tuple[str, str | None]:
    """A variable's `label_values(series, label)` becomes the series query and its label."""
    if title.startswith("variable: "):
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", expr)
        assert m, expr
        return m.group(1), m.group(2)
    return expr, None


def test_every_dashboard_query_parses_and_returns_data(faulted: PromAPI) -> None:
    """Every query parses. Every panel answers, with all values and with some concrete node/GPU;
    a panel with several queries answers when one of them does (the others may show series that
    exist only sometimes, such as tensor activity on GPUs that report it)."""
    answered: dict[tuple[str, str], list[bool]] = {}
    asked = [
        (name, title, i, substitute(expr, values), label)
        for name, dashboard in build_all().items()
        for title, raw in expressions(dashboard)
        for expr, label in [as_query(title, raw)]
        for i, values in enumerate((ALL_VALUES, *CONCRETE))
    ]
    # Several at a time: the alert rules' `for:` clocks keep running while these are asked.
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda a: faulted.query(a[3]), asked))
    for (name, title, i, q, label), body in zip(asked, bodies, strict=True):
        row = answered.setdefault((name, title), [False] * (1 + len(CONCRETE)))
        assert body["status"] == "success", f"{name} / {title}: {q}: {body.get('error')}"
        result = body["data"]["result"]
        row[i] |= any(r["metric"].get(label) for r in result) if label else bool(result)
    missing = [
        f"{name} / {title} {row}"
        for (name, title), row in answered.items()
        if (name, title) not in NOT_IN_THIS_FLEET and not (row[0] and any(row[1:]))
    ]
    assert not missing, "panels with no data:\n" + "\n".join(missing)
    now_present = [f"{n} / {t}" for n, t in NOT_IN_THIS_FLEET if answered[(n, t)][0]]
    assert not now_present, "now answered, remove from NOT_IN_THIS_FLEET:\n" + "\n".join(
        sorted(now_present)
    )


def test_every_exempt_panel_exists() -> None:
    """NOT_IN_THIS_FLEET names real panels, so it cannot silently excuse a renamed one."""
    titles = {(n, t) for n, d in build_all().items() for t, _ in expressions(d)}
    assert titles >= NOT_IN_THIS_FLEET, NOT_IN_THIS_FLEET - titles


def test_dcgm_exporter_dashboard_queries_work(faulted: PromAPI) -> None:
    """A dcgm-exporter dashboard's queries in either naming, through `promql()`: every node
    answers once (node-2 serves both namings), in the legacy units."""
    temp = faulted.query(f"avg by (Hostname) ({promql('DCGM_FI_DEV_GPU_TEMP')})")
    nodes = {r["metric"]["Hostname"] for r in temp["data"]["result"]}
    assert nodes == {"node-0", "node-1", "node-2"}
    xid = promql("DCGM_FI_DEV_XID_ERRORS", host='="node-1"', rest='gpu="1"')
    assert [float(r["value"][1]) for r in faulted.query(xid)["data"]["result"]] == [79.0]
    gpus = faulted.query(f"count by (Hostname) ({promql('DCGM_FI_DEV_FB_USED')})")["data"]
    counts = {r["metric"]["Hostname"]: r["value"][1] for r in gpus["result"]}
    own = faulted.query("count by (node) (sentinel_gpu_framebuffer_used_bytes)")["data"]
    assert counts == {r["metric"]["node"]: r["value"][1] for r in own["result"]}  # node-1: 1 lost
    # The units: MiB and MHz in the legacy naming, bytes and Hz in DCGM 4.7's, the same reading.
    units = (
        ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", "framebuffer_used_bytes", 2**20),
        ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "sm_clock_hertz", 1e6),
    )
    for legacy, current, ours, per_unit in units:
        base = f'sentinel_gpu_{ours}{{node="node-2"}}'
        for diff in (
            f'{base} / {per_unit} - on (gpu) {legacy}{{Hostname="node-2"}}',
            f'{base} - on (gpu) {current}{{hostname="node-2"}}',
        ):
            result = faulted.query(diff)["data"]["result"]
            assert [abs(float(r["value"][1])) < 1e-6 for r in result] == [True, True], diff
    # dcgm-exporter's labels on every series, in each naming: the node as `Hostname` in the
    # legacy naming (node-0, node-2) and as `hostname` in 4.7's (node-1, node-2).
    for name, host, served in (
        ("DCGM_FI_DEV_FB_USED", "Hostname", {"node-0", "node-2"}),
        ("DCGM_FI_DEV_FB_USED_BYTES", "hostname", {"node-1", "node-2"}),
    ):
        series = faulted.query(name)["data"]["result"]
        assert {r["metric"][host] for r in series} == served, name
        for r in series:
            assert set(r["metric"]) >= {"gpu", "UUID", "device", "modelName", "pci_bus_id", host}
            assert r["metric"]["modelName"], r["metric"]


SELECTOR = re.compile(r"\b(?:sentinel_\w+|up)(?:\{[^}]*\})?")
# Exported only by a coordinator whose backend polls a scheduler (Slurm); this fleet's drains go
# to an exclude file. tests/test_slurm_bridge.py reads it from a real Slurm coordinator.
SCHEDULER_ONLY = {"sentinel_coordinator_scheduler_up"}


def test_every_alert_rule_evaluates_cleanly(faulted: PromAPI) -> None:
    shipped = {
        r["alert"]
        for g in yaml.safe_load((PROM_DIR / "alerts.yml").read_text())["groups"]
        for r in g["rules"]
    }
    groups = faulted.get("/api/v1/rules")["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == shipped
    for name, rule in loaded.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        body = faulted.query(rule["query"])
        assert body["status"] == "success", (name, body.get("error"))
        # Every series the rule reads exists here, so it is not watching a name nobody exports.
        for selector in SELECTOR.findall(rule["query"]):
            if selector in SCHEDULER_ONLY:
                continue
            assert faulted.query(selector)["data"]["result"], f"{name}: no series {selector}"


def test_injected_faults_fire_their_alerts(faulted: PromAPI, gpuless_dcgm_exporter: str) -> None:
    def alerts() -> list[dict[str, Any]]:
        return list(faulted.get("/api/v1/alerts")["data"]["alerts"])

    def firing(name: str, **labels: str) -> bool:
        return any(
            a["labels"]["alertname"] == name
            and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())
            for a in alerts()
        )

    faulted.wait("DBE alert", lambda: firing("SentinelGpuDoubleBitEcc", node="node-0", gpu="0"))
    faulted.wait(
        "XID 79 alert", lambda: firing("SentinelFatalXid", node="node-1", gpu="1", xid="79")
    )
    # A DBE raises XID 48 as well, which the catalog rates unhealthy.
    assert firing("SentinelFatalXid", node="node-0", gpu="0", xid="48")
    states = {(a["labels"]["alertname"], a["labels"].get("node")): a["state"] for a in alerts()}
    # Rules with a `for:` longer than this test are pending, on the right nodes only.
    assert states[("SentinelNodeUnhealthy", "node-0")] == "pending"
    assert states[("SentinelNodeUnhealthy", "node-1")] == "pending"
    assert states[("SentinelNodeUnhealthy", "node-2")] == "pending"
    assert states[("SentinelGpuThermalSlowdown", "node-1")] == "pending"
    assert ("SentinelGpuThermalSlowdown", "node-0") not in states
    # The dcgm-exporter answering with no GPU (its rule's `for:` is 10 minutes).
    assert [
        a["labels"]["instance"]
        for a in alerts()
        if a["labels"]["alertname"] == "SentinelDcgmExporterWithoutGpus"
    ] == [gpuless_dcgm_exporter]
    assert not any(a["labels"]["alertname"] == "SentinelAgentDown" for a in alerts())
    assert not firing("SentinelGpuDoubleBitEcc", node="node-1")
    # The training run: the corrupt batch's loss spike, the hung rank, the straggling rank 1
    # (pending: persistent means 15 minutes), and nothing else about it.
    faulted.wait("loss anomaly alert", lambda: firing("SentinelLossAnomaly", job=JOB))
    faulted.wait("training stalled alert", lambda: firing("SentinelTrainingStalled", job=JOB))

    def stragglers() -> set[tuple[str, str, str]]:
        return {
            (a["labels"]["node"], a["labels"]["rank"], a["state"])
            for a in alerts()
            if a["labels"]["alertname"] == "SentinelPersistentStraggler"
        }

    faulted.wait("straggler alert pending", stragglers)
    assert stragglers() == {("node-1", "1", "pending")}
    assert not any(a["labels"]["alertname"] == "SentinelMfuDrop" for a in alerts())
    # The coordinator is up with its eviction budget left.
    assert not any(a["labels"]["alertname"].startswith("SentinelCoordinator") for a in alerts())
    assert not any(a["labels"]["alertname"] == "SentinelEvictionBudgetExhausted" for a in alerts())
