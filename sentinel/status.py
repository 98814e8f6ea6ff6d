"""`sentinel status`: the fleet, jobs, open incidents and their playbook runs, read from a
coordinator's HTTP API (the same reads an operator's token may make), for a person on one
screen or as one JSON document. Given several coordinator URLs (replicas), it asks the first
that answers (sentinel/failover.py) and says which one did."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sentinel.failover import Coordinators, Reply, Unreachable, fetch

# The incident states an operator still has to look at (the coordinator's ACTIVE_STATES).
OPEN_STATES = ("open", "acting", "escalated", "mitigated")
MAX_INCIDENTS = 20  # the open incidents fetched in detail (their runs and steps)


class StatusError(Exception):
    """The coordinator could not be asked; `bad_input` when it refused the request itself."""

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


class Client:
    def __init__(
        self, urls: str | Sequence[str], token: str | None, timeout_s: float = 10.0
    ) -> None:
        self.coordinators = Coordinators(urls)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s

    @property
    def url(self) -> str:
        """The coordinator answering now (the first listed until one fails)."""
        return self.coordinators.current

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def call(
        self,
        method: str,
        path: str,
        bad_input: tuple[int, ...] = (401, 403),
        body: dict[str, Any] | None = None,
    ) -> Any:
        """`method path`'s JSON answer (`body` sent as JSON). StatusError when it fails;
        `bad_input` when the coordinator answered one of those statuses (the caller's request
        itself is wrong)."""
        reply = self._fetch(method, path, body)
        if not reply.ok:
            raise StatusError(
                f"{reply.url}{path}: {reply.status} {reply.error()}",
                bad_input=reply.status in bad_input,
            )
        try:
            return reply.json()
        except ValueError:
            raise StatusError(f"{reply.url}{path}: not JSON: {reply.text()[:200]}") from None

    def download(self, path: str, bad_input: tuple[int, ...] = (401, 403)) -> bytes:
        """`GET path`'s bytes (an archive, not JSON); StatusError as `call`."""
        reply = self._fetch("GET", path)
        if not reply.ok:
            raise StatusError(
                f"{reply.url}{path}: {reply.status} {reply.error()}",
                bad_input=reply.status in bad_input,
            )
        return reply.body

    def _fetch(self, method: str, path: str, body: dict[str, Any] | None = None) -> Reply:
        data = json.dumps(body).encode() if body is not None else b"" if method == "POST" else None
        headers = self.headers | ({"Content-Type": "application/json"} if body is not None else {})
        args = (self.coordinators, path, headers, self.timeout_s, method, data)
        try:
            return fetch(*args)
        except Unreachable as e:
            if not 0 < e.retry_in_s <= self.timeout_s:
                raise StatusError(str(e)) from None
            time.sleep(e.retry_in_s)  # every replica answered 503: ask once more, when told
        try:
            return fetch(*args)
        except Unreachable as e:
            raise StatusError(str(e)) from None


def gather(client: Client, now: float | None = None) -> dict[str, Any]:
    """One JSON document: fleet counts and the nodes needing a look, jobs, open incidents with
    their playbook runs and steps."""
    now = time.time() if now is None else now
    nodes = client.get("/v1/nodes")
    jobs = client.get("/v1/jobs")
    incidents = [i for s in OPEN_STATES for i in client.get(f"/v1/incidents?state={s}")]
    incidents.sort(key=lambda i: i["id"])
    detailed = [client.get(f"/v1/incidents/{i['id']}") for i in incidents[-MAX_INCIDENTS:]]
    drift = client.get("/v1/fleet/drift")
    return {
        "coordinator": client.url,
        "at": now,
        "fleet": {
            "nodes": len(nodes),
            "by_state": dict(Counter(n["state"] for n in nodes)),
            "by_verdict": dict(Counter(n.get("verdict") or "unknown" for n in nodes)),
            # the nodes of each NVLink domain (an NVL72 rack's): a fault there may take them all
            "nvlink_domains": dict(
                Counter(n["nvlink_domain"] for n in nodes if n.get("nvlink_domain"))
            ),
        },
        "attention": [
            n for n in nodes if n["state"] != "active" or n.get("verdict") not in (None, "healthy")
        ],
        "jobs": [_job(j, now) for j in jobs],
        "incidents": [_incident(i, now) for i in detailed],
        "incidents_open": len(incidents),
        # nodes whose configuration differs from the fleet's majority, and in which fields
        "drift": {
            "nodes": drift["nodes"],
            "drifted": {
                d["node"]: [x["field"] for x in d["differences"]] for d in drift["drifted"]
            },
        },
    }


def _job(j: dict[str, Any], now: float) -> dict[str, Any]:
    status = j.get("status") or {}
    beat = j.get("last_heartbeat")
    return {
        "id": j["id"],
        "state": j["state"],
        "generation": j["generation"],
        "heartbeat_age_s": None if beat is None else round(now - beat, 1),
        "nodes": status.get("nodes", []),
        "spares": status.get("spares", []),
    }


def _incident(i: dict[str, Any], now: float) -> dict[str, Any]:
    runs = [
        {
            "id": r["id"],
            "playbook": r["playbook"],
            "status": r["status"],
            "step": r["step_index"],
            "steps": [
                {"action": a["action"], "state": a["state"], "target": a.get("target")}
                for a in i.get("actions", [])
                if a.get("run_id") == r["id"]
            ],
        }
        for r in i.get("runs", [])
    ]
    keys = ("id", "fault", "target", "job", "state", "playbook", "acknowledged_by")
    age = {"age_s": round(now - i["opened_at"], 1)}
    return {k: i.get(k) for k in keys} | age | {"runs": runs, "stages": i.get("stages", [])}


# --- for a person -----------------------------------------------------------------------------


def render(doc: dict[str, Any], console: Console) -> None:
    console.print(Group(_header(doc), _jobs(doc), _incidents(doc), _attention(doc)))


def _header(doc: dict[str, Any]) -> Text:
    f = doc["fleet"]
    states = ", ".join(f"{n} {s}" for s, n in sorted(f["by_state"].items())) or "none"
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(f["by_verdict"].items())) or "none"
    text = Text(f"Sentinel coordinator {doc['coordinator']}\n", style="bold")
    text.append(f"fleet: {f['nodes']} nodes ({states}); verdicts: {verdicts}\n", style="")
    if f.get("nvlink_domains"):  # each by its cluster's first digits and its clique
        sizes = [
            f"{d[:8]}/{d.rsplit('/', 1)[-1]}: {n}" for d, n in sorted(f["nvlink_domains"].items())
        ]
        text.append(f"NVLink domains: {len(sizes)} (nodes in each: {_names(sizes, 4)})\n", style="")
    drift = doc["drift"]
    if drift["drifted"]:
        told = [f"{n} ({_names(fields, 3)})" for n, fields in drift["drifted"].items()]
        text.append(f"configuration drift: {_names(told, 4)}\n", style="red")
    elif drift["nodes"]:
        text.append(f"configuration: {drift['nodes']} nodes alike\n", style="")
    text.append(
        f"open incidents: {doc['incidents_open']}",
        style="red" if doc["incidents_open"] else "green",
    )
    return text


def _jobs(doc: dict[str, Any]) -> Table:
    t = Table(title="jobs", title_justify="left", expand=False)
    for col in ("job", "state", "generation", "heartbeat", "nodes", "spares"):
        t.add_column(col)
    for j in doc["jobs"]:
        age = "-" if j["heartbeat_age_s"] is None else f"{j['heartbeat_age_s']:.0f}s ago"
        t.add_row(
            j["id"], j["state"], str(j["generation"]), age, _names(j["nodes"]), _names(j["spares"])
        )
    return t


def _incidents(doc: dict[str, Any]) -> Table:
    t = Table(title="open incidents and their playbook runs", title_justify="left")
    for col in ("id", "fault", "target", "state", "age", "playbook run", "to first step"):
        t.add_column(col)
    for i in doc["incidents"]:
        run = i["runs"][-1] if i["runs"] else None
        steps = " > ".join(f"{s['action']}:{s['state']}" for s in run["steps"]) if run else ""
        how = f"{run['playbook']} {run['status']} {steps}".strip() if run else i["playbook"] or "-"
        age = f"{i['age_s']:.0f}s"
        t.add_row(str(i["id"]), i["fault"], i["target"], i["state"], age, how, _to_first_step(i))
    return t


def _to_first_step(i: dict[str, Any]) -> str:
    """Its last relaunch's time from detection to the new gang's first step, with the
    rendezvous and checkpoint load in it (the recorded stages), or "-"."""
    if not i.get("stages"):
        return "-"
    s = i["stages"][-1]
    total = s["first_step_at"] - s["detected_at"]
    rdzv = s["rendezvoused_at"] - s["relaunched_at"]
    load = s["checkpoint_loaded_at"] - s["rendezvoused_at"]
    return f"{total:.1f}s (rendezvous {rdzv:.1f}s, load {load:.1f}s)"


def _attention(doc: dict[str, Any]) -> Table:
    t = Table(title="nodes needing a look", title_justify="left")
    for col in ("node", "state", "verdict", "reason"):
        t.add_column(col)
    for n in doc["attention"][:10]:
        t.add_row(n["name"], n["state"], n.get("verdict") or "-", n.get("reason") or "")
    if len(doc["attention"]) > 10:
        t.add_row("...", f"{len(doc['attention']) - 10} more", "", "")
    return t


def _names(names: list[str], most: int = 6) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" +{len(names) - most}" if len(names) > most else "")
