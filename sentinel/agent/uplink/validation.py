"""Run the validation burn-in on this node when the coordinator asks (`node.validate`).

The coordinator's command carries the baseline's figures; the agent writes them into a private
directory of the request and runs `sentinel burnin --validate` where the config's launcher says
(`agent.validation`), with the command's timeout:

- `process`: a child of the agent, under the agent's own limits (development, the simulated
  fleet). Torch stays out of the agent either way.
- `systemd`: the shipped template unit `sentinel-validate@.service`, started for the request
  (`systemctl start`, allowed to the agent's user by the shipped polkit rule): its own cgroup
  with the node's limits, the GPU devices, and the interpreter with the torch extra.
- `slurm`: a job step on this node (`srun --reservation`), inside the maintenance reservation
  the coordinator's Slurm backend holds the node in, named in the command (Slurm runs no job on
  a drained node, and none but this one in the reservation).

Its verdict goes back as a `node.validation` event through the agent's spool, so it travels
with this node's token and speaks only for this node. A run that crashes, times out or prints
no verdict is a failed validation, never a pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sentinel.config import NodeValidationConfig
from sentinel.protocol import (
    Command,
    Event,
    NodeValidationEvent,
    NodeValidationPayload,
    Source,
    ValidationCheck,
)

log = logging.getLogger("sentinel.agent.uplink.validation")
DEFAULT_TIMEOUT_S = 600.0
UNIT_TEMPLATE = "sentinel-validate@{}.service"
# srun gives up when the reservation cannot take the job within this long (a node not resumed
# into it yet, a job already there), rather than queueing until the command's timeout.
SRUN_IMMEDIATE_S = 60


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    where: str  # said in the verdict, with the host the burn-in ran on
    stop: list[str] | None = None  # what ends it at the timeout, besides killing argv


class NodeValidator:
    def __init__(
        self,
        node_id: str,
        gpus: int,
        emit: Callable[[list[Event]], None],
        sim_faults: Path | None = None,
        cfg: NodeValidationConfig | None = None,
        python: str | None = None,  # the job's interpreter (agent.job_python), if set
    ) -> None:
        self.node_id, self.gpus, self.emit = node_id, gpus, emit
        self.sim_faults = sim_faults
        self.cfg = cfg or NodeValidationConfig()
        self.python = self.cfg.python or python or sys.executable
        self._running: dict[str, asyncio.Task[None]] = {}

    def start(self, cmd: Command) -> bool:
        """Begin the validation `cmd` asks for; False when that one is already running."""
        rid = str(cmd.args.get("request_id") or cmd.id)
        if rid in self._running:
            return False
        task = asyncio.create_task(self._validate(rid, cmd.args), name=f"validate {rid}")
        self._running[rid] = task
        task.add_done_callback(lambda _: self._running.pop(rid, None))
        return True

    async def _validate(self, rid: str, args: dict[str, Any]) -> None:
        t0 = time.monotonic()
        try:
            payload = await self._run(rid, args)
        except Exception as e:  # never a pass: the coordinator keeps the node out
            log.exception("validation %s failed to run", rid)
            payload = _failed(rid, f"the validation burn-in did not run: {e}")
        payload = payload.model_copy(update={"seconds": round(time.monotonic() - t0, 3)})
        log.info("validation %s: %s", rid, "pass" if payload.passed else payload.reason)
        self.emit([NodeValidationEvent(source=Source(node=self.node_id), payload=payload)])

    def burnin_argv(self, python: str, folder: Path, gpus: str) -> list[str]:
        """`sentinel burnin --validate` reading and writing the request's folder."""
        argv = [python, "-m", "sentinel", "burnin", "--validate", "--no-progress"]
        argv += ["--baseline", str(folder / "baseline.json"), "--json", str(folder / "result.json")]
        argv += ["--gpus", gpus]
        if self.sim_faults is not None:
            argv += ["--sim-faults", str(self.sim_faults)]
        return argv

    def launch(self, folder: Path, args: dict[str, Any], timeout: float) -> Launch:
        """How this node's launcher runs the burn-in of the request in `folder`."""
        launcher = self.cfg.launcher
        if launcher == "systemd":  # the unit names its interpreter; GPUS from its env file
            unit = UNIT_TEMPLATE.format(folder.name)
            (folder / "env").write_text(f"GPUS={self.gpus}\n")
            systemctl = self.cfg.systemctl
            return Launch(
                [systemctl, "start", unit], f"systemd unit {unit}", [systemctl, "stop", unit]
            )
        burnin = self.burnin_argv(self.python, folder, str(self.gpus))
        if launcher == "process":
            return Launch(burnin, "a process of the agent")
        reservation = str((args.get("launch") or {}).get("reservation") or "")
        if not reservation:
            raise LaunchError(
                "the slurm launcher runs the burn-in in the reservation the coordinator holds"
                " the node in, and the command names none (is coordinator.eviction_backend"
                " slurm?)"
            )
        srun = [self.cfg.srun, f"--reservation={reservation}", f"--nodelist={self.node_id}"]
        srun += ["--nodes=1", "--ntasks=1", "--exclusive", "--job-name=sentinel-validate"]
        srun += [f"--time={max(1, math.ceil(timeout / 60))}", f"--immediate={SRUN_IMMEDIATE_S}"]
        return Launch([*srun, *burnin], f"a Slurm job step in reservation {reservation}")

    async def _run(self, rid: str, args: dict[str, Any]) -> NodeValidationPayload:
        timeout = float(args.get("timeout_s") or DEFAULT_TIMEOUT_S)
        folder = _request_folder(self.cfg.workdir, rid)
        try:
            (folder / "baseline.json").write_text(json.dumps({"validation": args.get("baseline")}))
            try:
                launch = self.launch(folder, args, timeout)
            except LaunchError as e:
                return _failed(rid, str(e))
            return await self._launch(rid, folder, launch, timeout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def _launch(
        self, rid: str, folder: Path, launch: Launch, timeout: float
    ) -> NodeValidationPayload:
        proc = await asyncio.create_subprocess_exec(
            *launch.argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.terminate()  # srun cancels its job on the first signal
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            if launch.stop is not None:
                stopper = await asyncio.create_subprocess_exec(*launch.stop)
                await asyncio.wait_for(stopper.wait(), 30.0)
            return _failed(rid, f"the validation burn-in ({launch.where}) ran past {timeout:g} s")
        try:
            doc = json.loads((folder / "result.json").read_text())
            return NodeValidationPayload(
                request_id=rid,
                passed=bool(doc["passed"]) and proc.returncode == 0,
                checks=[ValidationCheck.model_validate(c) for c in doc["checks"]],
                reason=str(doc.get("reason", ""))[:4000],
                ran=f"{launch.where} on {doc.get('host') or 'an unnamed host'}"[:200],
            )
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            why = f"exit code {proc.returncode}, no verdict: {' / '.join(tail)}"
            return _failed(rid, f"the validation burn-in ({launch.where}) failed ({why})"[:4000])


class LaunchError(RuntimeError):
    """The launcher cannot run this request (said in the failed verdict)."""


def _request_folder(workdir: Path | None, rid: str) -> Path:
    """A folder of the request's own, private to the agent's user (and the job it launches as
    that user). Its name is a digest of the request: a unit instance name needs no escaping."""
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="sentinel-validate-"))
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = workdir / f"v{hashlib.sha256(rid.encode()).hexdigest()[:16]}"
    shutil.rmtree(folder, ignore_errors=True)  # a run of this request cut short before
    folder.mkdir(mode=0o700)
    return folder


def _failed(rid: str, reason: str) -> NodeValidationPayload:
    return NodeValidationPayload(request_id=rid, passed=False, reason=reason)
