"""Watch the coordinator the way an operator would (its HTTP API, admin token) and turn what
changes into timeline entries: incidents opening and closing, playbook actions, job restarts."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sentinel.lab.sim.inject import Polling

BUNDLE_WAIT_S = 75.0  # the coordinator's seal deadline (60 s from the capture), and some


def captured(detail: dict[str, Any]) -> bool:
    """Whether the incident's repair captured evidence (a live `evidence` step done)."""
    return any(
        a["action"] == "evidence" and a["state"] == "done" and not a.get("dry_run")
        for a in detail.get("actions", [])
    )


class CoordinatorClient:
    def __init__(self, url: str, token: str, timeout_s: float = 5.0) -> None:
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s

    def get(self, path: str) -> Any:
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            return json.loads(r.read())

    def healthy(self) -> bool:
        try:
            urllib.request.urlopen(self.url + "/healthz", timeout=1).close()
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


@dataclass
class Seen:
    """What the observer has seen, each with the demo time it first saw it."""

    incidents: dict[int, dict[str, Any]] = field(default_factory=dict)
    incident_details: dict[int, dict[str, Any]] = field(default_factory=dict)
    actions: dict[int, dict[str, Any]] = field(default_factory=dict)
    generations: list[tuple[float, int]] = field(default_factory=list)  # (t, generation)
    job: dict[str, Any] | None = None

    def generation_at(self, t: float) -> int:
        gen = 0
        for seen_t, g in self.generations:
            if seen_t <= t:
                gen = g
        return gen


class Observer(Polling):
    """Polls incidents, actions and the job every `interval_s`; reports changes through
    `on_change(kind, target, text, ref=..., state=...)` where kind is a timeline kind, `ref`
    names the incident a detection is about and `state` is an incident's new state."""

    def __init__(
        self,
        client: CoordinatorClient,
        job_id: str,
        t0: float,
        on_change: Callable[..., None],
        interval_s: float = 0.25,
    ) -> None:
        super().__init__("demo-observer", interval_s, join_s=15)
        self.client, self.job_id, self.t0 = client, job_id, t0
        self.on_change = on_change
        self.seen = Seen()
        self.lock = threading.Lock()

    def tick(self) -> None:
        self.poll()

    def refresh_details(self, bundle_wait_s: float = BUNDLE_WAIT_S) -> None:
        """Fetch every incident's full document once more (their final state and actions),
        and again while one whose repair captured evidence has no sealed bundle yet (the
        coordinator seals it within a minute of the capture), `bundle_wait_s` at most."""
        pending = list(self.seen.incidents)
        deadline = time.monotonic() + bundle_wait_s
        while pending:
            for iid in pending:
                self.seen.incident_details[iid] = self.client.get(f"/v1/incidents/{iid}")
            details = self.seen.incident_details
            pending = [i for i in pending if captured(details[i]) and not details[i].get("bundle")]
            if not pending or time.monotonic() > deadline:
                return
            time.sleep(0.25)

    def poll(self) -> None:
        try:
            incidents = self.client.get("/v1/incidents?limit=10000")
            actions = self.client.get("/v1/actions?limit=10000")
            jobs = self.client.get("/v1/jobs")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return  # a slow coordinator poll is skipped, not fatal
        now = time.time() - self.t0
        with self.lock:
            self._incidents(incidents, now)
            self._actions(actions, now)
            self._job(jobs, now)

    def _incidents(self, rows: list[dict[str, Any]], now: float) -> None:
        for inc in rows:
            old = self.seen.incidents.get(inc["id"])
            if old is None:
                inc["seen_t"] = now
                detail = self.client.get(f"/v1/incidents/{inc['id']}")
                self.seen.incident_details[inc["id"]] = detail
                where = _where(detail)
                self.on_change(
                    "detect",
                    where,
                    f"incident #{inc['id']} {inc['fault']} on {where} "
                    f"-> playbook {inc.get('playbook') or 'none'}",
                    ref=f"incident:{inc['id']}",
                )
            else:
                inc["seen_t"] = old["seen_t"]
                if old["state"] != inc["state"]:
                    self.on_change(
                        "incident",
                        inc["target"],
                        f"incident #{inc['id']} is {inc['state']}",
                        state=inc["state"],
                    )
                    self.seen.incident_details[inc["id"]] = self.client.get(
                        f"/v1/incidents/{inc['id']}"
                    )
            self.seen.incidents[inc["id"]] = inc

    def _actions(self, rows: list[dict[str, Any]], now: float) -> None:
        for act in rows:
            old = self.seen.actions.get(act["id"])
            if old is None or old["state"] != act["state"]:
                target = f" {act['target']}" if act.get("target") else ""
                # a job's repair that took nodes out (the hang's culprit) names them
                nodes = (act.get("result") or {}).get("nodes") or []
                if nodes and act.get("target") not in nodes:
                    target = f" {','.join(nodes)} (for {act['target']})"
                self.on_change(
                    "action",
                    act.get("target"),
                    f"#{act.get('incident_id')} {act['action']}{target}: {act['state']}",
                )
            self.seen.actions[act["id"]] = act

    def _job(self, rows: list[dict[str, Any]], now: float) -> None:
        job = next((j for j in rows if j["id"] == self.job_id), None)
        if job is None:
            return
        gen = int(job["generation"])
        if not self.seen.generations or self.seen.generations[-1][1] != gen:
            self.seen.generations.append((now, gen))
            nodes = ", ".join((job.get("status") or {}).get("nodes", []))
            self.on_change("resume" if gen else "info", None, f"generation {gen} on {nodes}")
        self.seen.job = job


def _where(detail: dict[str, Any]) -> str:
    """What an incident is about: its node (and the ranks its evidence came from); a job's
    incident names the job and the ranks that reported it, not their nodes (a corrupt batch's
    spike is seen by the last stage's ranks, whose nodes are not at fault)."""
    events = detail.get("events", [])
    ranks = sorted({e["rank"] for e in events if e.get("rank") is not None})
    target = str(detail.get("target"))
    if target.startswith("job:"):
        return target + (f" (reported by rank {','.join(map(str, ranks))})" if ranks else "")
    nodes = sorted({e["node"] for e in events if e.get("node")})
    where = ",".join(nodes) or target
    return where + (f" (rank {','.join(map(str, ranks))})" if ranks else "")
