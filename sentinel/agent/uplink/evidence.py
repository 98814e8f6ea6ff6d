"""The node's part of an incident's evidence bundle: gathered and uploaded on `node.evidence`.

Before a destructive repair (a GPU reset, an eviction, a teardown) the coordinator asks the
agents of the incident's nodes what their node knew (coordinator/core/actions/evidence.py): a
reset clears the volatile ECC counters and the driver's state, a reboot the kernel's ring
buffer, and the agent's own memory of XIDs and verdicts goes with its restart. The agent writes
one JSON document, `node-evidence.json`, and uploads it as a file of the step's check, as the
flight-recorder dumps travel (`PUT /v1/fr/{check}/{node}/node-evidence.json`).

Everything comes from what the agent already holds: the last sweep's readings, the monitor's
XID record, the current verdict, the kernel-log tail, the last fingerprint sent, the registered
ranks. NVML is not called: its calls belong to the sweep thread, and a driver wedged there (the
moment evidence matters most) would wedge the gathering too. So it takes milliseconds on the
event loop. A part that cannot be gathered is named in `missing` with why; it never costs the
others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from sentinel.agent.fingerprint import FingerprintReporter
from sentinel.agent.health.kmsg import KernelLog
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.ranks.registry import RankRegistry
from sentinel.agent.ranks.watch import describe, proc_stat
from sentinel.failover import Coordinators, Unreachable, request

log = logging.getLogger("sentinel.agent.uplink.evidence")

FORMAT = "sentinel-node-evidence/1"
FILE_NAME = "node-evidence.json"
# A check id the coordinator takes in an upload's path (coordinator/core/fr_dumps.py): checked
# here too, so a bad one is refused in the command's acknowledgement, not lost in an upload.
_CHECK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")


def check_id_problem(value: object) -> str | None:
    """Why `value` cannot be a `node.evidence` command's check id, or None."""
    if isinstance(value, str) and _CHECK_ID.fullmatch(value) and ".." not in value:
        return None
    return f"node.evidence needs args.check_id, a name such as chk-1 (got {str(value)[:60]!r})"


class Missing(Exception):
    """A part the agent cannot give, with why (it goes to the document's `missing`)."""


class EvidenceGatherer:
    def __init__(
        self,
        node_id: str,
        monitor: NodeMonitor,
        kernel_log: KernelLog | None,
        ranks: RankRegistry | None,
        fingerprints: FingerprintReporter | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id, self.monitor, self.kernel_log = node_id, monitor, kernel_log
        self.ranks, self.fingerprints, self.clock = ranks, fingerprints, clock

    def gather(self, check_id: str) -> dict[str, Any]:
        """The evidence document (see docs/agent.md); never raises for a part that fails."""
        taken_at = self.clock()
        doc: dict[str, Any] = {
            "format": FORMAT,
            "node": self.node_id,
            "taken_at": taken_at,
            "check_id": check_id,
            "swept_at": self.monitor.last_sweep_ts or None,  # when the readings were read
        }
        parts: dict[str, Callable[[], Any]] = {
            "gpus": self._gpus,
            "xids": lambda: self._xids(taken_at),
            "verdicts": self._verdicts,
            "kernel_log": self._kernel_log,
            "fingerprint": self._fingerprint,
            "ranks": self._ranks,
        }
        missing: list[dict[str, str]] = []
        for name, part in parts.items():
            try:
                doc[name] = part()
            except Missing as e:
                doc[name] = None
                missing.append({"part": name, "why": str(e)})
            except Exception as e:  # a bug in one part: the others still go
                log.exception("gathering the node evidence's %s failed", name)
                doc[name] = None
                missing.append({"part": name, "why": f"{type(e).__name__}: {e}"})
        doc["missing"] = missing
        return doc

    async def upload(
        self, session: aiohttp.ClientSession, coordinators: Coordinators, check_id: str
    ) -> int:
        """Gather and upload the document; the bytes the coordinator took (0 when it took
        none). Failures are logged, never raised: this runs as a background task."""
        try:
            start = time.perf_counter()
            body = json.dumps(self.gather(check_id), default=str).encode()
            took = time.perf_counter() - start
            path = f"/v1/fr/{check_id}/{self.node_id}/{FILE_NAME}"
            headers = {"Content-Type": "application/json"}
            reply = await request(session, coordinators, "PUT", path, data=body, headers=headers)
        except Unreachable as e:
            log.error("cannot upload the node evidence for %s: %s", check_id, e)
            return 0
        except Exception:
            log.exception("uploading the node evidence for %s failed", check_id)
            return 0
        if reply.status != 200:
            log.error(
                "coordinator refused the node evidence for %s: %s %s",
                check_id,
                reply.status,
                reply.error(),
            )
            return 0
        log.info(
            "uploaded the node evidence for %s: %d bytes, gathered in %.3f s",
            check_id,
            len(body),
            took,
            extra={"bytes": len(body), "gather_s": round(took, 4)},
        )
        return len(body)

    # ---- the parts ---------------------------------------------------------------------------

    def _gpus(self) -> list[dict[str, Any]]:
        snap = self.monitor.snapshot
        if snap is None:
            raise Missing("no collection sweep has finished since the agent started")
        return [dataclasses.asdict(r) for r in snap.readings]

    def _xids(self, taken_at: float) -> dict[str, Any]:
        h = self.monitor.xid_history()
        return {
            "window_s": self.monitor.evaluator.thresholds.xid_window_s,
            # inside the window: each (gpu, xid) judged, with the wall-clock time of each arrival
            "recent": [
                {
                    "gpu": r.outcome.gpu,
                    "uuid": r.outcome.uuid,
                    "xid": r.outcome.xid,
                    "name": r.outcome.name,
                    "verdict": r.outcome.verdict.value,
                    "action": r.outcome.action.value,
                    "escalated": r.outcome.escalated,
                    "seen_at": [round(taken_at - age, 3) for age in r.ages_s],
                }
                for r in h.recent
            ],
            # since the agent started: how often each XID came, and each GPU's last
            "counts": [
                {"gpu": gpu, "xid": xid, "count": n} for (gpu, xid), n in sorted(h.counts.items())
            ],
            "last": {str(gpu): xid for gpu, xid in sorted(h.last.items())},
            "sources": h.sources,
        }

    def _verdicts(self) -> list[dict[str, Any]]:
        """The current verdict: the agent keeps no history of them (each change went to the
        coordinator as a `node.health` event, which the incident's timeline holds)."""
        snap = self.monitor.snapshot
        if snap is None:
            raise Missing("no verdict yet: no collection sweep has finished")
        health = snap.health
        return [
            {
                "at": snap.ts,
                "verdict": health.verdict.value,
                "action": health.action.value,
                "findings": [f.model_dump(mode="json") for f in health.findings],
                "gpus": [
                    {
                        "gpu": g.gpu,
                        "uuid": g.uuid,
                        "verdict": g.verdict.value,
                        "action": g.action.value,
                        "findings": [f.model_dump(mode="json") for f in g.findings],
                    }
                    for g in health.gpus
                ],
                "nvml_stall": snap.stall.describe() if snap.stall is not None else None,
            }
        ]

    def _kernel_log(self) -> dict[str, Any]:
        kl = self.kernel_log
        if kl is None:
            raise Missing("the agent does not read the kernel log (agent.kmsg: off, or sim)")
        if not kl.recent and kl.problem is not None:
            raise Missing(kl.problem)
        return {"path": str(kl.path), "lines": list(kl.recent), "problem": kl.problem}

    def _fingerprint(self) -> dict[str, str]:
        if self.fingerprints is None:
            raise Missing("the agent reads no fingerprint (it reports to no coordinator)")
        sent = self.fingerprints.sent
        if sent is None:
            raise Missing("the fingerprint has not been read yet")
        return dict(sent)

    def _ranks(self) -> list[dict[str, Any]]:
        """The ranks whose process the agent knows: those registered with their beacon, as
        the trainer hooks register (registry.py), each with its process's state now."""
        if self.ranks is None:
            raise Missing("the agent has no rank socket (agent.rank_socket is not set)")
        return [
            {
                "job": w.reg.job,
                "rank": w.reg.rank,
                "gpu": w.reg.gpu,
                "pid": w.peer.pid,
                "state": describe(proc_stat(w.peer.pid)),
            }
            for w in sorted(self.ranks.watched(), key=lambda w: (w.reg.job, w.reg.rank))
        ]
