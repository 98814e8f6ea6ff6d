"""Run the validation burn-in on this node when the coordinator asks (`node.validate`).

The coordinator's command carries the baseline's figures; the agent writes them to a private
temporary file and runs `sentinel burnin --validate` as a subprocess (torch stays out of the
agent), with the command's timeout. Its verdict goes back as a `node.validation` event through
the agent's spool, so it travels with this node's token and speaks only for this node. A run
that crashes, times out or prints no verdict is a failed validation, never a pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

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


class NodeValidator:
    def __init__(
        self,
        node_id: str,
        gpus: int,
        emit: Callable[[list[Event]], None],
        sim_faults: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self.node_id, self.gpus, self.emit = node_id, gpus, emit
        self.sim_faults = sim_faults
        self.python = python
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

    async def _run(self, rid: str, args: dict[str, Any]) -> NodeValidationPayload:
        timeout = float(args.get("timeout_s") or DEFAULT_TIMEOUT_S)
        with tempfile.TemporaryDirectory(prefix="sentinel-validate-") as tmp:
            baseline, out = Path(tmp) / "baseline.json", Path(tmp) / "result.json"
            baseline.write_text(json.dumps({"validation": args.get("baseline")}))
            argv = [
                self.python,
                "-m",
                "sentinel",
                "burnin",
                "--validate",
                "--no-progress",
                "--baseline",
                str(baseline),
                "--json",
                str(out),
                "--gpus",
                str(self.gpus),
            ]
            if self.sim_faults is not None:
                argv += ["--sim-faults", str(self.sim_faults)]
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            try:
                _, err = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return _failed(rid, f"the validation burn-in ran past {timeout:g} s")
            try:
                doc = json.loads(out.read_text())
                return NodeValidationPayload(
                    request_id=rid,
                    passed=bool(doc["passed"]) and proc.returncode == 0,
                    checks=[ValidationCheck.model_validate(c) for c in doc["checks"]],
                    reason=str(doc.get("reason", ""))[:4000],
                )
            except (OSError, ValueError, KeyError, TypeError, ValidationError):
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                why = f"exit code {proc.returncode}, no verdict: {' / '.join(tail)}"
                return _failed(rid, f"the validation burn-in failed ({why})"[:4000])


def _failed(rid: str, reason: str) -> NodeValidationPayload:
    return NodeValidationPayload(request_id=rid, passed=False, reason=reason)
