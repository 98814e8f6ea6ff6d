"""The demo's long-lived processes, each with an explicit start and stop: the coordinator and
the job supervisor (`sentinel run`). The simulated agents are `sentinel.lab.sim.fleet.SimFleet`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.coordinator.core.auth import Role, TokenStore
from sentinel.coordinator.store import STORE_FILE, SqliteStore
from sentinel.lab.demo.observe import CoordinatorClient
from sentinel.processes import free_port, spawn, stop_process, wait_ready

SENTINEL = [sys.executable, "-m", "sentinel"]

# Coordinator settings for a drill on one machine: a fast engine tick, a job heartbeat timeout
# that survives a busy 2-core box, an eviction budget that allows one eviction per fault, and
# short long-polls (aiohttp's shutdown waits for open ones, whose clients are already gone).
COORDINATOR_ENV = {
    "SENTINEL_COORDINATOR__LONG_POLL_MAX_S": "3",
    "SENTINEL_COORDINATOR__ENGINE_TICK_S": "0.1",
    "SENTINEL_COORDINATOR__JOB_HEARTBEAT_TIMEOUT_S": "30",
    "SENTINEL_COORDINATOR__EVICTION__MAX_PER_WINDOW": "16",
    "SENTINEL_COORDINATOR__EVICTION__MIN_FLEET": "1",
}


@dataclass
class CoordinatorProcess:
    state_dir: Path
    log_file: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # the address it listens on (a cluster network's, on Slurm)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *SENTINEL,
            "--log-format",
            "json",
            "coordinator",
            "--listen",
            f"{self.host}:{self.port}",
            "--state-dir",
            str(self.state_dir),
        ]
        self.proc = spawn(cmd, env={**os.environ, **COORDINATOR_ENV, **self.env}, log=self.log_file)
        client = CoordinatorClient(self.url, "")
        wait_ready(
            client.healthy, self.proc, what="coordinator", log=self.log_file, timeout_s=timeout_s
        )

    def admin_token(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    def token(
        self, path: Path, role: str, *, node: str | None = None, job: str | None = None
    ) -> Path:
        """Create a token for `role` (a node token for `node`, a job token for `job`) into
        `path`, in the coordinator's store as `sentinel token create` makes it. In process: a
        drill makes one per node, and each CLI run costs a second of interpreter start."""
        store = SqliteStore(self.state_dir / STORE_FILE)
        try:
            _id, secret = TokenStore(store).create(Role(role), node, job, now=time.time())
        finally:
            store.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secret + "\n")
        path.chmod(0o600)
        return path

    def stop(self) -> int | None:
        return stop_process(self.proc, 15.0)


@dataclass
class SupervisorProcess:
    """`sentinel run ... -- TRAINER...` with its output in `log_file`."""

    argv: list[str]
    log_file: Path
    env: dict[str, str] = field(default_factory=dict)  # reaches every rank
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
        env.update(self.env)
        # `sentinel fr analyze` (the supervisor's analyzer) from this installation.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        self.proc = spawn(
            [*SENTINEL, "--log-format", "json", *self.argv], env=env, log=self.log_file
        )

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> int | None:
        return stop_process(self.proc, 30.0)
