"""`sentinel agent` as a real process on the fake NVML library, for end-to-end agent tests."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from fake_nvml import FakeGpu, fake_env, write_config
from sentinel.lab.sim.fleet import AgentProcess
from sentinel.processes import free_port

Samples = dict[str, list[tuple[dict[str, str], float]]]


def wait_until(pred: Callable[[], object], timeout_s: float = 20.0, what: str = "") -> float:
    """Poll `pred` every 0.1 s; returns the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - start
        except (OSError, KeyError):
            pass
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not met within {timeout_s} s: {what}")
        time.sleep(0.1)


class FakeNvmlAgent:
    """An agent process reading `gpus` through pynvml from the fake library in `lib`."""

    def __init__(
        self,
        tmp: Path,
        lib: Path,
        gpus: Sequence[FakeGpu],
        *,
        config: str = "",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        node: str = "gpu-node-1",
        prefix: Sequence[str] = (),  # a command the agent runs under (a sandbox)
    ) -> None:
        self.tmp, self.gpus, self.node = tmp, list(gpus), node
        self.nvml_config = tmp / "fake-nvml.conf"
        write_config(self.nvml_config, self.gpus)
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "sentinel",
            "--log-format",
            "json",
            "agent",
            "--node-id",
            node,
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.2",
            "--rank-socket",
            str(tmp / "agent.sock"),
            "--spool-dir",
            str(tmp / "spool"),
            *args,
        ]
        if config:
            (tmp / "agent.yaml").write_text(config)
            cmd[6:6] = ["--config", str(tmp / "agent.yaml")]
        self.log_path = tmp / "agent.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*prefix, *cmd],
            env={**fake_env(lib, self.nvml_config), **(env or {})},
            stderr=self._log,
        )
        self.http = AgentProcess(node, port, tmp / "none", tmp / "agent.sock", tmp)
        wait_until(lambda: "sentinel_node_health_verdict" in self.scrape(), 30, "first scrape")

    def serve(self, xids: Sequence[tuple[int, int]] = (), hang: str = "") -> None:
        write_config(self.nvml_config, self.gpus, xids=xids, hang=hang)

    def scrape(self) -> Samples:
        return self.http.scrape()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            return 200, self.http.get(path)
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def verdict(self) -> str:
        rows = self.scrape()["sentinel_node_health_verdict"]
        return next(lbl["verdict"] for lbl, v in rows if v == 1.0)

    def node_rules(self) -> set[str]:
        return {lbl["rule"] for lbl, _ in self.scrape().get("sentinel_node_health_finding", [])}

    def gpu_rules(self, gpu: int) -> set[str]:
        rows = self.scrape().get("sentinel_gpu_health_finding", [])
        return {lbl["rule"] for lbl, _ in rows if lbl["gpu"] == str(gpu)}

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
