"""The agent as a real process: /metrics, events to a coordinator, restarts, signals, systemd."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sentinel.lab.sim.fleet import AgentProcess, SimFleet
from sentinel.processes import free_port
from sentinel.protocol import (
    AgentHeartbeatPayload,
    Event,
    EventKind,
    GpuVerdict,
    NodeHealthEvent,
    RankCheckpointEvent,
    Source,
    Verdict,
    XidReport,
    decode_batch,
    encode,
    make_event,
)


class Ingest(BaseHTTPRequestHandler):
    """A stand-in coordinator: stores every batch it acknowledges (the real one comes later)."""

    received: list[Event]
    tokens: list[str | None]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.extend(decode_batch(body).events)  # type: ignore[attr-defined]
        self.server.tokens.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class StandInCoordinator:
    def __init__(self, port: int) -> None:
        self.port = port
        self.server: ThreadingHTTPServer | None = None
        self.received: list[Event] = []
        self.tokens: list[str | None] = []

    def start(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Ingest)
        self.server.received = self.received  # type: ignore[attr-defined]
        self.server.tokens = self.tokens  # type: ignore[attr-defined]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.received]


def wait_until(pred, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def gpu_verdicts(coordinator: StandInCoordinator) -> list[tuple[Event, GpuVerdict]]:
    """Every GPU verdict change the node's health events carried, with its event."""
    health = [e for e in coordinator.received if isinstance(e, NodeHealthEvent)]
    return [(e, g) for e in health for g in e.payload.gpus]


def xids_received(coordinator: StandInCoordinator) -> list[XidReport]:
    health = [e for e in coordinator.received if isinstance(e, NodeHealthEvent)]
    return [x for e in health for x in e.payload.xids]


def verdict_of(a: AgentProcess, node: str) -> str:
    samples = a.scrape()["sentinel_node_health_verdict"]
    return next(lbl["verdict"] for lbl, v in samples if v == 1 and lbl["node"] == node)


def node_token(directory: Path) -> Path:
    """A token file: an agent that reports to a coordinator refuses to start without one."""
    token = directory / "token"
    token.write_text("node-token\n")
    return token


@pytest.fixture
def coordinator() -> Iterator[StandInCoordinator]:
    c = StandInCoordinator(free_port())
    yield c
    c.stop()


def test_metrics_fault_and_events_reach_the_coordinator(
    tmp_path: Path, coordinator: StandInCoordinator
) -> None:
    coordinator.start()
    token = tmp_path / "token"
    token.write_text("node-token\n")
    fleet = SimFleet(
        tmp_path,
        ["node-0"],
        4,
        interval_s=0.2,
        coordinator_url=f"http://127.0.0.1:{coordinator.port}",
        token_file=token,
    )
    with fleet:
        a = fleet.agents["node-0"]
        samples = a.scrape()
        # dcgm-exporter names and labels, so existing dashboards keep working
        temp = samples["DCGM_FI_DEV_GPU_TEMP"]
        assert len(temp) == 4
        assert set(temp[0][0]) == {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}
        assert temp[0][0]["modelName"] == "NVIDIA H100 80GB HBM3"
        assert "sentinel_agent_collection_duration_seconds_count" in samples
        wait_until(lambda: "node.health" in coordinator.kinds())
        fleet.inject("node-0", {"kind": "ecc_dbe", "gpu": 2})
        wait_until(lambda: verdict_of(a, "node-0") == "unhealthy")
        wait_until(lambda: gpu_verdicts(coordinator))
        event, gpu = gpu_verdicts(coordinator)[0]
        assert gpu.gpu == 2
        assert gpu.verdict == "unhealthy"
        assert event.source.node == "node-0"
        dbe = {lbl["gpu"]: v for lbl, v in a.scrape()["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]}
        assert dbe == {"0": 0, "1": 0, "2": 1, "3": 0}
        assert coordinator.tokens[0] == "Bearer node-token"
    assert fleet.agents["node-0"].proc.returncode == 0  # type: ignore[union-attr]


def test_no_event_lost_while_coordinator_is_down_and_agent_restarts(
    tmp_path: Path, coordinator: StandInCoordinator
) -> None:
    fleet = SimFleet(
        tmp_path,
        ["node-1"],
        2,
        interval_s=0.2,
        coordinator_url=f"http://127.0.0.1:{coordinator.port}",
        token_file=node_token(tmp_path),
    )
    fleet.start()
    fleet.inject("node-1", {"kind": "xid", "gpu": 1, "xid": 79})
    a = fleet.agents["node-1"]
    wait_until(lambda: verdict_of(a, "node-1") == "unhealthy")
    a.proc.kill()  # type: ignore[union-attr]  # kill -9 with the events only on disk
    a.proc.wait()  # type: ignore[union-attr]
    coordinator.start()
    fleet.start()  # the same spool directory
    try:
        wait_until(lambda: xids_received(coordinator) and gpu_verdicts(coordinator))
    finally:
        fleet.stop()
    assert [(x.gpu, x.xid) for x in xids_received(coordinator)] == [(1, 79)]
    ids = [e.id for e in coordinator.received]
    assert len(ids) == len(set(ids))


def test_sighup_reloads_thresholds_and_bad_reload_keeps_running(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("agent:\n  thresholds: {gpu_temp_degraded_c: 85}\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sentinel",
            "agent",
            "--config",
            str(cfg),
            "--sim",
            "--gpus",
            "2",
            "--node-id",
            "node-5",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.2",
            "--rank-socket",
            str(tmp_path / "s.sock"),
        ],
        stderr=subprocess.PIPE,
    )
    a = AgentProcess("node-5", port, tmp_path / "f", tmp_path / "s.sock", tmp_path / "log")
    try:
        wait_until(lambda: _answers(a))
        assert verdict_of(a, "node-5") == "healthy"
        cfg.write_text(
            "agent:\n  thresholds: {gpu_temp_degraded_c: 10, gpu_temp_unhealthy_c: 200}\n"
        )
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: verdict_of(a, "node-5") == "degraded")
        cfg.write_text("agent:\n  thresholds: {gpu_temp_degraded_c: cold}\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and verdict_of(a, "node-5") == "degraded"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "reload refused" in err and "gpu_temp_degraded_c" in err


def _answers(a: AgentProcess) -> bool:
    try:
        a.get("/healthz")
        return True
    except OSError:
        return False


def test_systemd_notify_ready_and_watchdog_from_a_real_agent(tmp_path: Path) -> None:
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(10)
    env = {"NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "400000", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sentinel",
            "agent",
            "--sim",
            "--gpus",
            "1",
            "--node-id",
            "n",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--interval",
            "0.1",
            "--rank-socket",
            str(tmp_path / "r.sock"),
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        messages = [sock.recv(4096).decode() for _ in range(3)]
        assert messages[0].startswith("READY=1")
        assert "WATCHDOG=1" in messages[1:]
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode()
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        sock.close()


def test_rank_events_are_relayed_and_reexported(
    tmp_path: Path, coordinator: StandInCoordinator
) -> None:
    coordinator.start()
    fleet = SimFleet(
        tmp_path,
        ["node-3"],
        2,
        interval_s=0.2,
        coordinator_url=f"http://127.0.0.1:{coordinator.port}",
        token_file=node_token(tmp_path),
    )
    with fleet:
        a = fleet.agents["node-3"]
        payload = AgentHeartbeatPayload(gpus=1, verdict=Verdict.HEALTHY, agent_version="rank")
        mine = make_event(
            EventKind.AGENT_HEARTBEAT, Source(node="node-3", rank=7, job="j1"), payload
        )
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(a.rank_socket))
            s.sendall(f"{encode(mine)}\nnot json\n".encode())
        wait_until(lambda: mine.id in {e.id for e in coordinator.received})
        samples = a.scrape()
        relayed = samples["sentinel_rank_events_total"]
        assert (
            {"node": "node-3", "job": "j1", "rank": "7", "kind": "agent.heartbeat"},
            1.0,
        ) in relayed
        # Alerted kinds start at 0, so a rank's first anomaly is an increase Prometheus sees.
        zero = {"node": "node-3", "job": "j1", "rank": "7", "kind": "rank.anomaly"}
        assert (zero, 0.0) in relayed
        assert samples["sentinel_agent_rank_garbage_lines_total"][0][1] == 1.0


def test_a_checkpoint_the_hooks_report_is_relayed_and_reexported(
    tmp_path: Path, coordinator: StandInCoordinator
) -> None:
    """The trainer's `checkpoint_saved` call, through the hooks' real transport and a real
    agent's rank socket: relayed to the coordinator and exported as the last checkpoint's step,
    time and blocking seconds, labelled with the rank that reported it."""
    from trainer_hooks import HooksConfig, SentinelHooks  # torch: only in this test's process

    coordinator.start()
    fleet = SimFleet(
        tmp_path,
        ["node-3"],
        2,
        interval_s=0.2,
        coordinator_url=f"http://127.0.0.1:{coordinator.port}",
        token_file=node_token(tmp_path),
    )
    with fleet:
        a = fleet.agents["node-3"]
        cfg = HooksConfig(
            agent_socket=str(a.rank_socket), node="node-3", job="j1", instrument_collectives=False
        )
        hooks = SentinelHooks(cfg)
        before = time.time()
        try:
            hooks.checkpoint_saved(20, blocked_s=0.25, path="/ckpt/step-00000020")
            hooks.checkpoint_saved(30, blocked_s=0.5)
        finally:
            hooks.close()
        assert hooks.errors == 0

        def checkpoints() -> list[RankCheckpointEvent]:
            return [e for e in coordinator.received if isinstance(e, RankCheckpointEvent)]

        wait_until(lambda: len(checkpoints()) == 2)
        assert [e.payload.step for e in checkpoints()] == [20, 30]
        assert checkpoints()[0].payload.path == "/ckpt/step-00000020"
        samples = a.scrape()
        me = {"node": "node-3", "job": "j1", "rank": "0"}
        assert samples["sentinel_rank_last_checkpoint_step"] == [(me, 30.0)]
        assert samples["sentinel_rank_last_checkpoint_blocked_seconds"] == [(me, 0.5)]
        ((labels, ts),) = samples["sentinel_rank_last_checkpoint_timestamp_seconds"]
        assert labels == me and before <= ts <= time.time()
        assert (me | {"kind": "rank.checkpoint"}, 2.0) in samples["sentinel_rank_events_total"]


def test_bad_input_exits_2(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "sentinel", "agent", "--sim", "--listen", "nonsense"]
    res = subprocess.run(run, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "not HOST:PORT" in res.stderr
    bad = tmp_path / "a.yaml"
    bad.write_text("agent: {interval_s: 0}\n")
    res = subprocess.run([*run[:4], "--config", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2 and "agent.interval_s" in res.stderr


def test_agent_and_its_deps_never_import_torch() -> None:
    code = (
        "import sys, sentinel.cli, sentinel.commands.agent_cmd, sentinel.agent.service, "
        "sentinel.agent.nvml.sim, sentinel.agent.nvml.backend, sentinel.lab.sim.fleet; "
        "sentinel.cli.build_parser(); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'trainer_hooks'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_hardware_faults_are_judged_between_sweeps(
    tmp_path: Path, coordinator: StandInCoordinator
) -> None:
    """Sweeps every 10 s: a double-bit ECC error, a GPU at 96 °C and an XID 79 each reach the
    coordinator as an unhealthy GPU verdict long before the next sweep, because the urgent
    check between sweeps (every 0.25 s) sees them move and sweeps at once."""
    coordinator.start()
    fleet = SimFleet(
        tmp_path,
        ["node-0"],
        4,
        interval_s=10.0,
        coordinator_url=f"http://127.0.0.1:{coordinator.port}",
        token_file=node_token(tmp_path),
    )
    with fleet:
        wait_until(lambda: "node.health" in coordinator.kinds())
        time.sleep(0.5)  # clear of the first sweep: the next is ~9.5 s away
        for gpu, fault in enumerate(
            ({"kind": "ecc_dbe"}, {"kind": "thermal", "temp_c": 96}, {"kind": "xid", "xid": 79})
        ):
            start = time.monotonic()
            fleet.inject("node-0", {**fault, "gpu": gpu})

            def unhealthy(g: int = gpu) -> bool:
                return any(
                    v.gpu == g and v.verdict == "unhealthy" for _, v in gpu_verdicts(coordinator)
                )

            wait_until(unhealthy, timeout_s=5.0)
            assert time.monotonic() - start < 5.0, fault  # half the sweep interval
        log = fleet.agents["node-0"].log_file.read_text()
        assert log.count("urgent signal: sweeping now") >= 3
