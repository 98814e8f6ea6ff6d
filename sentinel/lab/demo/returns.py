"""The validation-before-return drill inside `sentinel demo` (a scenario's `returns`).

A fault's repair evicts a node whose GPU stays damaged (`damage`: `sdc`/`slow` written into that
simulated GPU when the fault strikes; silent in every NVML reading, so its agent reports it
healthy). The `Operator` plays the person: once the eviction is seen it asks the coordinator to
return the node, with an operator token, through `POST /v1/actions` (what a person's
`curl` does); validation must refuse it. Then the GPU is repaired (`clear`) and it asks again;
validation must pass and the node be `returned`. What each request came to is read back from
the coordinator (`/v1/actions`, `/v1/nodes`), never assumed.

The baseline is recorded at start-up by the real command (`sentinel burnin --validate
--save-baseline`) on this machine, with no fault, before any agent or rank runs.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sentinel.config import ValidationConfig
from sentinel.lab.demo.observe import CoordinatorClient
from sentinel.lab.sim.inject import Polling
from sentinel.scenario import ReturnDrill


def record_baseline(
    sentinel: list[str], path: Path, gpus: int, log: Path, timeout_s: float = 300.0
) -> Path:
    """A healthy node's validation figures, by `sentinel burnin --validate --save-baseline`,
    with the shipped tolerances: a CPU "GPU" is timed against the host in the same rounds, so
    the training ranks beside it load both alike, and so is its loopback all-reduce."""
    argv = [
        *sentinel,
        "burnin",
        "--validate",
        "--no-progress",
        "--gpus",
        str(gpus),
        "--save-baseline",
        str(path),
    ]
    with log.open("ab") as f:
        code = subprocess.run(argv, stdout=f, stderr=f, timeout=timeout_s).returncode
    if code != 0 or not path.exists():
        raise RuntimeError(f"recording the validation baseline failed (exit {code}); see {log}")
    return path


def validation_env(baseline: Path, compression: int) -> dict[str, str]:
    """The coordinator's `validation` settings for a drill: the baseline, and the hold-down and
    timeout compressed by the drill's one time scale. `stale_s` stays the shipped default: it is
    tied to the agents' heartbeat, which the drill does not compress."""
    shipped = ValidationConfig.model_fields
    hold = float(shipped["hold_down_s"].default) / compression
    timeout = float(shipped["timeout_s"].default) / compression
    prefix = "SENTINEL_COORDINATOR__VALIDATION__"
    return {
        f"{prefix}BASELINE": str(baseline),
        f"{prefix}HOLD_DOWN_S": f"{hold:g}",
        f"{prefix}TIMEOUT_S": f"{timeout:g}",
    }


def damage_lines(spec: ReturnDrill) -> list[dict[str, Any]]:
    """The sim faults that keep the GPU damaged (`sentinel.agent.nvml.sim`)."""
    return [
        {"kind": "slow", "gpu": spec.gpu, "slowdown": spec.slowdown}
        if kind == "slow"
        else {"kind": kind, "gpu": spec.gpu}
        for kind in spec.damage
    ]


@dataclass
class Attempt:
    """One return an operator asked for: in demo seconds, and what the coordinator did."""

    asked_t: float
    still_damaged: bool
    outcome: str | None = None  # "refused" (back to evicted) or "returned"; None: no answer
    reason: str = ""
    answered_t: float | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)  # the validation's figures


class Operator(Polling):
    """Asks for the returns once the node is evicted (see the module's docstring)."""

    def __init__(
        self,
        spec: ReturnDrill,
        admin: CoordinatorClient,
        operator_token: str,
        repair: Callable[[dict[str, Any]], None],
        t0: float,
        note: Callable[..., None],
    ) -> None:
        super().__init__("demo-operator", 0.5, join_s=15)
        self.spec, self.admin, self.operator_token = spec, admin, operator_token
        self.repair, self.t0, self.note = repair, t0, note
        self.attempts: list[Attempt] = []
        self.incident: int | None = None
        self.repaired = False

    @property
    def done(self) -> bool:
        return len(self.attempts) == 2 and self.attempts[-1].outcome is not None

    def tick(self) -> None:
        if self.done or self.stopping.is_set():
            return
        if self.incident is None:
            self.incident = self._evicted_by()
            if self.incident is not None:
                self._ask(still_damaged=True)
            return
        last = self.attempts[-1]
        if last.outcome is None and not self._answer(last, len(self.attempts)):
            return
        if len(self.attempts) == 1 and last.outcome == "refused":
            self.repair({"kind": "clear", "gpu": self.spec.gpu})
            self.repaired = True
            self.note("info", self.spec.node, f"{self.spec.node}'s GPU {self.spec.gpu} repaired")
            self._ask(still_damaged=False)

    def _evicted_by(self) -> int | None:
        """The incident whose playbook evicted the node, once the node is evicted."""
        if self._node_state()[0] != "evicted":
            return None
        for step in self.admin.get("/v1/actions?limit=1000"):
            nodes = (step.get("result") or {}).get("nodes") or []
            if (
                step["action"] == "evict_node"
                and step["state"] == "done"
                and self.spec.node in nodes
            ):
                return int(step["incident_id"])
        return None

    def _node_state(self) -> tuple[str, str]:
        for n in self.admin.get("/v1/nodes"):
            if n["name"] == self.spec.node:
                return str(n["state"]), str(n.get("reason") or "")
        return "", ""

    def _ask(self, still_damaged: bool) -> None:
        why = "operator: back from repair?" if not still_damaged else "operator: looks fine now?"
        body = {
            "incident": self.incident,
            "action": "return_node",
            "params": {"node": self.spec.node},
            "why": why,
        }
        req = urllib.request.Request(
            self.admin.url + "/v1/actions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self.operator_token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=self.admin.timeout_s) as r:
            r.read()
        self.attempts.append(Attempt(asked_t=time.time() - self.t0, still_damaged=still_damaged))
        state = "still damaged" if still_damaged else "repaired"
        self.note(
            "action",
            self.spec.node,
            f"operator asks to return {self.spec.node} ({state}): validating",
            ref=f"return:{len(self.attempts)}",
        )

    def _answer(self, attempt: Attempt, n: int) -> bool:
        """Whether the n-th return_node step has ended; fills in `attempt`."""
        steps = [
            s for s in self.admin.get("/v1/actions?limit=1000") if s["action"] == "return_node"
        ]
        steps.sort(key=lambda s: s["id"])
        if len(steps) < n or steps[n - 1]["state"] not in ("done", "escalated", "failed"):
            return False
        step, state = steps[n - 1], self._node_state()[0]
        result = step.get("result") or {}
        attempt.answered_t = time.time() - self.t0
        attempt.outcome = (
            "returned" if step["state"] == "done" and state == "returned" else "refused"
        )
        attempt.reason = str(result.get("reason") or result.get("error") or "")
        validation = result.get("validation") or {}
        attempt.checks = list(validation.get("checks") or [])
        if attempt.outcome == "returned":
            self.note(
                "resume",
                self.spec.node,
                f"{self.spec.node} passed validation: returned",
                ref=f"return:{n}",
            )
        else:
            self.note(
                "detect", self.spec.node, f"return refused: {attempt.reason}", ref=f"return:{n}"
            )
        return True

    def record(self) -> dict[str, Any]:
        return {
            "node": self.spec.node,
            "damage": list(self.spec.damage),
            "incident": self.incident,
            "attempts": [asdict(a) for a in self.attempts],
        }
