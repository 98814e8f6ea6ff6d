"""Health: readings, XIDs and node signals in; a verdict and recommended action per GPU and node.

Every rule goes through the same raise / clear / hold machine (`holds.Holds`) with the catalog's
hold and the rule's own clear condition (`rules.RULES` per GPU, `node_rules.NODE_RULES` per
node). PCIe replays, NVLink errors and corrected ECC errors are judged as rates (`rates`), and
each GPU is compared with its peers (`outliers`). XIDs are judged by the fault catalog
(`sentinel.faults.catalog`) and are stateful: the evaluator remembers each (gpu, xid) for
`xid_window_s`, keeps the GPU's verdict for that long after the last occurrence, and escalates
to drain_and_inspect when the same fault repeats `xid_escalate_after` times within the window.
An XID or recovery-action value the catalog does not know is counted (`unknown`) and raises
`unknown_signal`: never healthy. Pure logic: no I/O, and the clock is injected.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from sentinel.agent.health.holds import Holds
from sentinel.agent.health.node_rules import NODE_RULES, NodeRule, NodeSignals, Report
from sentinel.agent.health.outliers import PeerOutliers
from sentinel.agent.health.rates import CounterRates
from sentinel.agent.health.rules import (
    RULES,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    GpuRule,
    GpuView,
)
from sentinel.agent.nvml.readings import GpuReading, XidEvent
from sentinel.config import HealthThresholds
from sentinel.faults.catalog import RECOVERY_ACTIONS, describe, is_known_xid
from sentinel.protocol import ACTION_SEVERITY, VERDICT_SEVERITY, Action, Finding, Verdict

__all__ = [
    "RULES",
    "THROTTLE_HW_SLOWDOWN",
    "THROTTLE_HW_THERMAL",
    "THROTTLE_SW_THERMAL",
    "GpuHealth",
    "HealthEvaluator",
    "NodeHealth",
    "judge",
]

_H, _U = Verdict.HEALTHY, Verdict.UNHEALTHY


def _finding(rule: GpuRule, view: GpuView) -> Finding:
    i = rule.info
    return Finding(rule=i.name, verdict=i.verdict, action=i.action, detail=rule.detail(view))


def _never() -> bool:
    return False


def judge(reading: GpuReading, thresholds: HealthThresholds) -> tuple[Finding, ...]:
    """The findings of every rule that raises on one reading alone (no history, no holds)."""
    view = GpuView(reading, thresholds)
    return tuple(_finding(rule, view) for rule in RULES if rule.raises(view))


@dataclass(frozen=True, slots=True)
class XidOutcome:
    gpu: int
    uuid: str | None
    xid: int
    name: str
    verdict: Verdict
    action: Action
    repeats_in_window: int
    escalated: bool = False  # repeated often enough to recommend hardware inspection


@dataclass(frozen=True, slots=True)
class RecentXid:
    """One (gpu, xid) the evaluator still remembers: its latest judgement and how long ago each
    occurrence inside `xid_window_s` arrived, oldest first."""

    outcome: XidOutcome
    ages_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    gpu: int
    uuid: str | None
    verdict: Verdict
    action: Action
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class NodeHealth:
    verdict: Verdict
    action: Action
    gpus: tuple[GpuHealth, ...]
    findings: tuple[Finding, ...]  # every GPU's findings (detail prefixed with the GPU), node's
    xids: tuple[XidOutcome, ...]  # the XIDs of this evaluation, judged
    node_findings: tuple[Finding, ...] = ()  # the node-level rules' findings alone

    @property
    def unhealthy_gpus(self) -> list[int]:
        return [g.gpu for g in self.gpus if g.verdict is Verdict.UNHEALTHY]


def worst_verdict(findings: Iterable[Finding]) -> Verdict:
    return max((f.verdict for f in findings), key=VERDICT_SEVERITY.__getitem__, default=_H)


def strongest_action(findings: Iterable[Finding]) -> Action:
    return max((f.action for f in findings), key=ACTION_SEVERITY.__getitem__, default=Action.NONE)


class HealthEvaluator:
    """Judges one sweep at a time, remembering holds, rates, peers and XIDs across sweeps."""

    def __init__(
        self, thresholds: HealthThresholds, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._seen: dict[tuple[int, int], deque[float]] = {}  # (gpu, xid) -> arrival times
        self._last: dict[tuple[int, int], XidOutcome] = {}  # (gpu, xid) -> latest judgement
        self._base: dict[int, tuple[Finding, ...]] = {}  # per GPU, before XIDs
        self._uuids: dict[int, str | None] = {}
        self._unknown_recovery: set[tuple[int, int]] = set()
        self._reports: list[Report] = []  # unknown values found while judging GPUs
        self.unknown: Counter[str] = Counter()  # inputs the catalog cannot read, by kind
        self.thresholds = thresholds

    @property
    def thresholds(self) -> HealthThresholds:
        return self._thresholds

    @thresholds.setter
    def thresholds(self, thresholds: HealthThresholds) -> None:
        """A config reload: holds and XID memory stay, the new limits apply from the next sweep;
        rates restart when their window changes."""
        old = getattr(self, "_thresholds", None)
        self._thresholds = thresholds
        self._holds = getattr(self, "_holds", None) or Holds()
        self._holds.overrides = dict(thresholds.hold_s)
        if old is None or old.rate_window_s != thresholds.rate_window_s:
            self._rates = CounterRates(thresholds.rate_window_s)
        self._outliers = PeerOutliers(thresholds.outlier_z, thresholds.outlier_polls)

    def evaluate(
        self,
        readings: Sequence[GpuReading],
        xids: Sequence[XidEvent],
        node: NodeSignals | None = None,
    ) -> NodeHealth:
        now = self._clock()
        self._base = self._judge_gpus(readings, now)
        self._uuids.update({r.index: r.uuid for r in readings})
        return self._compose(node or NodeSignals(), xids, now)

    def recompose(self, node: NodeSignals, xids: Sequence[XidEvent] = ()) -> NodeHealth:
        """The node's health from the last GPU judgement, new XIDs and new node signals: for
        when NVML is stuck and no sweep can finish, yet the node's verdict must move."""
        return self._compose(node, xids, self._clock())

    def _compose(self, node: NodeSignals, xids: Sequence[XidEvent], now: float) -> NodeHealth:
        self._expire(now)
        outcomes = tuple(self._record(event, now) for event in xids)
        self._uuids.update({o.gpu: o.uuid for o in outcomes if o.uuid is not None})
        by_gpu = dict(self._base)
        for (gpu, _), outcome in sorted(self._last.items()):
            finding = self._xid_finding(outcome)
            if finding is not None:
                by_gpu[gpu] = (*by_gpu.get(gpu, ()), finding)
        gpus = tuple(
            GpuHealth(gpu, self._uuids.get(gpu), worst_verdict(fs), strongest_action(fs), fs)
            for gpu, fs in sorted(by_gpu.items())
        )
        reports = (*node.reports, *self._reports)
        self._reports = []
        signals = NodeSignals(node.stall, node.expected_gpus, node.visible_gpus, reports)
        node_findings = tuple(
            f for rule in NODE_RULES if (f := self._node_step(rule, signals, now)) is not None
        )
        findings = (
            *(
                f.model_copy(update={"detail": f"gpu {g.gpu}: {f.detail}"})
                for g in gpus
                for f in g.findings
            ),
            *node_findings,
        )
        return NodeHealth(
            worst_verdict(findings),
            strongest_action(findings),
            gpus,
            findings,
            outcomes,
            node_findings,
        )

    def _node_step(self, rule: NodeRule, s: NodeSignals, now: float) -> Finding | None:
        info, detail = rule.info, rule.raised(s)
        raised = (
            None
            if detail is None
            else Finding(rule=info.name, verdict=info.verdict, action=info.action, detail=detail)
        )
        return self._holds.step("node", info, raised, lambda: rule.clears(s), now)

    # ---- GPUs -------------------------------------------------------------------------------

    def _judge_gpus(
        self, readings: Sequence[GpuReading], now: float
    ) -> dict[int, tuple[Finding, ...]]:
        views = [self._view(r, now) for r in readings]
        errors = {
            v.r.index: sum(x for x in (v.sbe_rate, v.pcie_rate, v.nvlink_rate) if x is not None)
            for v in views
            if not v.r.lost
        }
        peers = self._outliers.update(readings, errors)
        out: dict[int, tuple[Finding, ...]] = {}
        for view in views:
            why, quiet = peers.get(view.r.index, (None, True))
            view = GpuView(
                view.r, view.t, view.pcie_rate, view.nvlink_rate, view.sbe_rate, why, quiet
            )
            out[view.r.index] = self._gpu_findings(view, now)
            self._note_unknown_recovery(view.r)
        return out

    def _view(self, r: GpuReading, now: float) -> GpuView:
        rates, gpu = self._rates, r.index
        nvlink = None
        if r.nvlink_crc_errors is not None or r.nvlink_replay_errors is not None:
            nvlink = (r.nvlink_crc_errors or 0) + (r.nvlink_replay_errors or 0)
        return GpuView(
            r,
            self._thresholds,
            pcie_rate=rates.update(gpu, "pcie", r.pcie_replay_count, now),
            nvlink_rate=rates.update(gpu, "nvlink", nvlink, now),
            sbe_rate=rates.update(gpu, "sbe", r.ecc_sbe_volatile, now),
        )

    def _gpu_findings(self, view: GpuView, now: float) -> tuple[Finding, ...]:
        """Every rule's finding for one GPU; a quiet rule with nothing held costs one check."""
        holds, gpu, out = self._holds, view.r.index, []
        for rule in RULES:
            if rule.raises(view):
                found = holds.step(gpu, rule.info, _finding(rule, view), _never, now)
            elif holds.holding(gpu, rule.info.name):
                found = holds.step(gpu, rule.info, None, partial(rule.cleared, view), now)
            else:
                continue
            if found is not None:
                out.append(found)
        return tuple(out)

    def _note_unknown_recovery(self, r: GpuReading) -> None:
        value = r.recovery_action
        if value is None or value in RECOVERY_ACTIONS:
            return
        if (r.index, value) not in self._unknown_recovery:  # counted once per GPU and value
            self._unknown_recovery.add((r.index, value))
            self.unknown["recovery_action"] += 1
        self._reports.append(
            Report("unknown_signal", f"gpu {r.index}: unknown recovery action value {value}")
        )

    # ---- XIDs -------------------------------------------------------------------------------

    def _record(self, event: XidEvent, now: float) -> XidOutcome:
        key = (event.gpu, event.xid)
        seen = self._seen.setdefault(key, deque())
        seen.append(now)
        info = describe(event.xid)
        if not is_known_xid(event.xid):
            self.unknown["xid"] += 1
            self._reports.append(
                Report("unknown_signal", f"gpu {event.gpu}: Xid {event.xid} is not in the catalog")
            )
        escalate = info.escalates and len(seen) >= self._thresholds.xid_escalate_after
        outcome = XidOutcome(
            gpu=event.gpu,
            uuid=event.uuid,
            xid=event.xid,
            name=info.name,
            verdict=_U if escalate else info.verdict,
            action=Action.DRAIN_AND_INSPECT if escalate else info.action,
            repeats_in_window=len(seen),
            escalated=escalate,
        )
        self._last[key] = outcome
        return outcome

    def recent_xids(self) -> list[RecentXid]:
        """The XIDs inside the window, by GPU and XID: the history an incident's node evidence
        carries (agent/uplink/evidence.py). Ages, not times: the clock is the evaluator's own."""
        now = self._clock()
        horizon, out = now - self._thresholds.xid_window_s, []
        for key, seen in sorted(self._seen.items()):
            ages = tuple(round(now - t, 3) for t in seen if t > horizon)
            if ages and key in self._last:
                out.append(RecentXid(self._last[key], ages))
        return out

    def _expire(self, now: float) -> None:
        horizon = now - self._thresholds.xid_window_s
        for key in list(self._seen):
            seen = self._seen[key]
            while seen and seen[0] <= horizon:
                seen.popleft()
            if not seen:
                del self._seen[key]
                del self._last[key]

    def _xid_finding(self, o: XidOutcome) -> Finding | None:
        if o.verdict is _H and o.action is Action.NONE:
            return None
        window = self._thresholds.xid_window_s
        detail = f"Xid {o.xid} ({o.name}) seen {o.repeats_in_window}x in {window:g} s"
        if o.escalated:
            detail += ": repeated, escalated to hardware inspection"
        return Finding(rule=f"xid_{o.xid}", verdict=o.verdict, action=o.action, detail=detail)
