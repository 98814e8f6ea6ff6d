"""Launch simulated node agents as real processes and talk to them the way operators would:
inject hardware faults into their simulated GPUs, scrape their /metrics over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sentinel.processes import free_port, spawn, stop, wait_ready


@dataclass
class AgentProcess:
    node_id: str
    port: int
    faults_file: Path
    rank_socket: Path
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # where it listens (its node's address on a cluster network)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get(self, path: str, timeout: float = 2.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            return bytes(resp.read())

    def healthy(self) -> bool:
        """Whether /healthz answers with JSON now."""
        try:
            json.loads(self.get("/healthz", timeout=0.5))
        except OSError:
            return False
        return True

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Samples by name, parsed with Prometheus' own text-format parser."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(self.get("/metrics").decode()):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out


class SimFleet:
    def __init__(
        self,
        workdir: Path,
        nodes: list[str],
        gpus_per_node: int,
        interval_s: float = 0.5,
        coordinator_url: str | None = None,
        token_file: Path | None = None,
        token_files: dict[str, Path] | None = None,
    ) -> None:
        """`token_file` is one token for every agent; `token_files` one per node (a node token
        may only speak for its own node), and wins for the nodes it names."""
        self.workdir = workdir
        self.gpus_per_node = gpus_per_node
        self.interval_s = interval_s
        self.coordinator_url = coordinator_url
        self.token_file = token_file
        self.token_files = dict(token_files or {})
        self.agents = {
            n: AgentProcess(
                node_id=n,
                port=free_port(),
                faults_file=workdir / n / "faults.jsonl",
                rank_socket=workdir / n / "agent.sock",
                log_file=workdir / n / "agent.log",
            )
            for n in nodes
        }

    def command(self, a: AgentProcess) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "sentinel",
            "--log-format",
            "json",
            "agent",
            "--sim",
            "--gpus",
            str(self.gpus_per_node),
            "--expected-gpus",
            str(self.gpus_per_node),
            "--node-id",
            a.node_id,
            "--listen",
            f"{a.host}:{a.port}",
            "--sim-faults",
            str(a.faults_file),
            "--rank-socket",
            str(a.rank_socket),
            "--spool-dir",
            str(a.faults_file.parent / "spool"),
            "--interval",
            str(self.interval_s),
        ]
        if self.coordinator_url:
            cmd += ["--coordinator", self.coordinator_url]
        return cmd

    def agent_env(self, a: AgentProcess) -> dict[str, str]:
        """More environment for one agent (a subclass: its node-local directories)."""
        return {}

    def launch(self, a: AgentProcess) -> list[str]:
        """The agent's argv as started: here a local process; a subclass may wrap it (run it
        inside its node's network namespace)."""
        return self.command(a)

    def start(self, timeout_s: float = 30.0) -> None:
        for a in self.agents.values():
            a.faults_file.parent.mkdir(parents=True, exist_ok=True)
            a.faults_file.touch()
            env = dict(os.environ)
            token = self.token_files.get(a.node_id, self.token_file)
            if token is not None:
                env["SENTINEL_AGENT__TOKEN_FILE"] = str(token)
            env.update(self.agent_env(a))
            a.proc = spawn(self.launch(a), env=env, log=a.log_file)
        deadline = time.monotonic() + timeout_s
        for a in self.agents.values():
            wait_ready(
                a.healthy,
                a.proc,
                what=f"agent {a.node_id}",
                log=a.log_file,
                timeout_s=timeout_s,
                deadline=deadline,
            )

    def inject(self, node: str, fault: dict[str, object]) -> None:
        from sentinel.agent.nvml.sim import inject

        inject(self.agents[node].faults_file, fault)

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        started = {a.node_id: a.proc for a in self.agents.values() if a.proc is not None}
        return dict(zip(started, stop(list(started.values()), timeout_s), strict=True))

    def __enter__(self) -> SimFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
