"""Evicting a node (with the eviction budget) and swapping a hot spare in.

Backends: an exclude-list file (default; what a launcher reads), Slurm (`scontrol update
NodeName=... State=DRAIN Reason=...`) and Kubernetes (cordon + taint through the API server).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.actions.base import (
    ActionContext,
    BaseAction,
    EvictionBackend,
    EvictionError,
    StepResult,
    StepStatus,
)


class ExcludeFileBackend(EvictionBackend):
    name = "exclude_file"

    def __init__(self, path: Path) -> None:
        self.path = path

    def nodes(self) -> list[str]:
        if not self.path.exists():
            return []
        return [ln.strip() for ln in self.path.read_text().splitlines() if ln.strip()]

    def evict(self, node: str, reason: str) -> str:
        current = self.nodes()
        if node in current:
            return f"{node} already in {self.path}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{n}\n" for n in [*current, node]))
        os.replace(tmp, self.path)  # readers see the old list or the new one, never half
        return f"{node} added to {self.path}"

    def restore(self, node: str, reason: str) -> str:
        current = self.nodes()
        if node not in current:
            return f"{node} not in {self.path}"
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{n}\n" for n in current if n != node))
        os.replace(tmp, self.path)
        return f"{node} removed from {self.path}"


class SlurmBackend(EvictionBackend):
    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    def _update(self, node: str, *fields: str) -> None:
        """`scontrol update NodeName=NODE FIELD...`; any way it fails is an EvictionError with
        scontrol's own message (the controller down, the node unknown, no scontrol at all)."""
        argv = [self.scontrol, "update", f"NodeName={node}", *fields]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EvictionError(f"{self.scontrol} update NodeName={node}: {e}") from None
        if done.returncode != 0:
            err = done.stderr.strip() or done.stdout.strip()
            raise EvictionError(f"{' '.join(argv[:4])} exited {done.returncode}: {err}")

    def evict(self, node: str, reason: str) -> str:
        started = time.monotonic()
        self._update(node, "State=DRAIN", f"Reason={reason}")
        return f"drained {node} through scontrol in {time.monotonic() - started:.3f}s"

    def restore(self, node: str, reason: str) -> str:
        self._update(node, "State=RESUME")
        return f"resumed {node} through scontrol"


class KubernetesBackend(EvictionBackend):
    """Cordon (spec.unschedulable) and taint the node; two API calls, both idempotent."""

    name = "kubernetes"

    def __init__(self, api: str, token: str | None, taint_key: str) -> None:
        self.api = api.rstrip("/")
        self.token = token
        self.taint_key = taint_key

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(f"{self.api}{path}", method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/strategic-merge-patch+json")
        context = ssl.create_default_context() if self.api.startswith("https") else None
        with urllib.request.urlopen(req, data=data, timeout=30, context=context) as resp:
            return json.loads(resp.read() or b"{}")

    def evict(self, node: str, reason: str) -> str:
        current = self._call("GET", f"/api/v1/nodes/{node}")
        taints = list(current.get("spec", {}).get("taints") or [])
        if not any(t.get("key") == self.taint_key for t in taints):
            taints.append({"key": self.taint_key, "value": "true", "effect": "NoSchedule"})
        self._call(
            "PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True, "taints": taints}}
        )
        return f"cordoned and tainted {node} ({self.taint_key}) through the Kubernetes API"


def make_backend(cfg: CoordinatorConfig) -> EvictionBackend:
    if cfg.eviction_backend == "slurm":
        return SlurmBackend(cfg.scontrol, cfg.scontrol_timeout_s)
    if cfg.eviction_backend == "kubernetes":
        token = cfg.kubernetes_token_file.read_text().strip() if cfg.kubernetes_token_file else None
        return KubernetesBackend(cfg.kubernetes_api, token, cfg.kubernetes_taint_key)
    return ExcludeFileBackend(cfg.exclude_file or cfg.state_dir / "exclude.txt")


class EvictParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # incident: the incident's node(s); culprits: nodes a diagnosis step put in the context.
    target: Literal["incident", "culprits"] = "incident"
    reason: str = "sentinel playbook"


def incident_nodes(ctx: ActionContext, target: str) -> list[str]:
    if target == "culprits":
        return list(ctx.context.get("culprit_nodes", []))
    inc_target = str(ctx.incident["target"])
    if not inc_target.startswith("job:"):
        return [inc_target]
    return list(ctx.incident["detail"].get("nodes", []))


def _budget_refusal(ctx: ActionContext) -> str | None:
    budget = ctx.cfg.eviction
    row = ctx.store.one(
        "SELECT COUNT(*) AS n FROM nodes WHERE state='evicted' AND state_changed_at >= ?",
        (ctx.now - budget.window_s,),
    )
    recent = int(row["n"]) if row else 0
    if recent >= budget.max_per_window:
        return (
            f"eviction budget spent: {recent} node(s) evicted in the last "
            f"{budget.window_s:g} s (max {budget.max_per_window})"
        )
    row = ctx.store.one("SELECT COUNT(*) AS n FROM nodes WHERE state='active'")
    active = int(row["n"]) if row else 0
    if active - 1 < budget.min_fleet:
        return (
            f"evicting would leave {active - 1} active node(s), below min_fleet {budget.min_fleet}"
        )
    return None


def _replacement_refusal(ctx: ActionContext, node: str) -> str | None:
    """A node in a job's gang may go only when a hot spare of that job can take its place:
    the gang's shape (TP x PP x DP) is fixed, so evicting it without one would shrink the job
    or leave it unable to start. Spares already promised to nodes this run evicted count as
    taken."""
    jobs = ctx.store.query(
        "SELECT id, status FROM jobs WHERE state NOT IN ('finished','failed','lost')"
    )
    for job in jobs:
        status = job["status"] or {}
        if node not in status.get("nodes", []):
            continue
        free = [
            s
            for s in status.get("spares", [])
            if (row := ctx.store.one("SELECT state FROM nodes WHERE name=?", (s,))) is None
            or row["state"] == "spare"
        ]
        mapped = ctx.context.get("spare_map", {})
        promised = [n for n in ctx.context.get("evicted", []) if n != node and n not in mapped]
        if len(free) - len(promised) < 1:
            return (
                f"no hot spare left to take {node}'s place in job {job['id']}"
                f" ({len(free)} free, {len(promised)} already promised): evicting it would"
                " shrink the gang below its size"
            )
    return None


class EvictNode(BaseAction):
    name = "evict_node"
    Params = EvictParams
    description = "take the node out of service through the eviction backend (budgeted)"

    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        assert isinstance(params, EvictParams)
        nodes = incident_nodes(ctx, params.target)
        if not nodes:
            return StepResult(StepStatus.FAILED, {"error": "no node to evict"})
        done: list[str] = []
        for node in nodes:
            row = ctx.store.one("SELECT state FROM nodes WHERE name=?", (node,))
            already = row is not None and row["state"] == "evicted"
            if not already:
                refusal = _budget_refusal(ctx) or _replacement_refusal(ctx, node)
                if refusal:
                    return StepResult(StepStatus.ESCALATE, {"node": node, "reason": refusal})
            if ctx.dry_run:
                done.append(f"dry-run: would evict {node}")
                continue
            try:  # the scheduler is told why and by which incident
                done.append(
                    ctx.backend.evict(node, f"{params.reason} [incident {ctx.incident['id']}]")
                )
            except EvictionError as e:  # a person decides; the node stays as it was
                return StepResult(
                    StepStatus.ESCALATE,
                    {"node": node, "backend": ctx.backend.name, "error": str(e)},
                )
            ctx.store.execute(
                "INSERT INTO nodes (name, state, state_changed_at, reason) VALUES (?,?,?,?)"
                " ON CONFLICT(name) DO UPDATE SET state='evicted', reason=excluded.reason,"
                " state_changed_at=CASE WHEN nodes.state='evicted' THEN nodes.state_changed_at"
                " ELSE excluded.state_changed_at END",
                (node, "evicted", ctx.now, params.reason),
            )
            evicted = ctx.context.setdefault("evicted", [])
            if node not in evicted:
                evicted.append(node)
        return StepResult(
            StepStatus.DONE, {"nodes": nodes, "backend": ctx.backend.name, "did": done}
        )


class SwapParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    required: bool = False  # True: no spare left escalates instead of running one node short


class SwapSpare(BaseAction):
    name = "swap_spare"
    Params = SwapParams
    description = "map each node this run evicted to a free hot spare of the job"

    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        assert isinstance(params, SwapParams)
        job = ctx.job()
        spares: list[str] = list(job["status"].get("spares", [])) if job else []
        mapping: dict[str, str] = ctx.context.setdefault("spare_map", {})
        missing: list[str] = []
        for node in ctx.context.get("evicted", []) + ctx.context.get("to_swap", []):
            if node in mapping:
                continue
            spare = self._free_spare(ctx, spares, mapping)
            if spare is None:
                missing.append(node)
                continue
            mapping[node] = spare
            if not ctx.dry_run:
                why = f"swapped in for {node}"
                ctx.store.execute(
                    "INSERT INTO nodes (name, state, state_changed_at, reason)"
                    " VALUES (?,'active',?,?) ON CONFLICT(name) DO UPDATE SET state='active',"
                    " state_changed_at=excluded.state_changed_at, reason=excluded.reason",
                    (spare, ctx.now, why),
                )
        if missing and params.required:
            return StepResult(StepStatus.ESCALATE, {"reason": f"no hot spare left for {missing}"})
        return StepResult(StepStatus.DONE, {"spare_map": mapping, "without_spare": missing})

    @staticmethod
    def _free_spare(ctx: ActionContext, spares: list[str], mapping: dict[str, str]) -> str | None:
        for spare in spares:
            if spare in mapping.values():
                continue
            row = ctx.store.one("SELECT state FROM nodes WHERE name=?", (spare,))
            if row is None or row["state"] == "spare":
                return spare
        return None


__all__ = ["EvictNode", "ExcludeFileBackend", "KubernetesBackend", "SlurmBackend", "SwapSpare"]
