"""The drill report: after the run, match each injected fault to the incident that caught it.

Detection never reads the scenario; only this after-the-fact report does, to grade it. A fault
counts as detected when an incident of a matching class names the node the fault struck (for a
rank fault: the node hosting that rank when it struck) or the rank itself. Incidents that no
fault explains are false incidents.

A fault counts as repaired only when its incident's playbook finished, training resumed after
it, and, for a fault of the hardware, the struck node trained in no generation launched after
the detection. A poison crash (`recurs: true`) cannot be repaired by a restart: it counts as
handled when the restart budget stopped the job (its last incident escalated by `resume`) and
no node was evicted for it; the run then ends early, with no final model to compare. Each
fault's time targets are checked, not only printed (`TARGETS`).

Every step field (`injected_step`, `detected_step`, a timeline entry's step) names the same
thing: the training step in progress when it happened, numbered as the trainer reports it
(the metrics line `step N` closes step N). See `step_in_progress`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sentinel.coordinator.core.actions.evidence import EvidenceParams
from sentinel.coordinator.core.stages import MILESTONES, segments
from sentinel.faults.repairs import KIND_FAULTS
from sentinel.lab.demo.observe import captured
from sentinel.scenario import (
    NODE_FAULTS,
    PRELAUNCH_FAULTS,
    RANK_FAULTS,
    CorruptBatchFault,
    Scenario,
)

NODE_PREFIXES = ("node-", "spare-")
# Strike times come from file mtimes and metrics lines; allow for their granularity.
STRIKE_SLACK_S = 1.0
# Incident classes (playbook `incident.fault`) that correctly explain each fault kind.
EXPLAINS = KIND_FAULTS
# Faults of the hardware: repaired only once the node they struck no longer trains.
HARDWARE_FAULTS = frozenset({"ecc_dbe", "xid", "thermal", "sdc", "straggler"})
# Faults detected from a training step's own numbers: detected at the step that produced them.
AT_THEIR_STEP = frozenset({"corrupt_batch"})
# Event kinds whose `step` is the step they measured.
STEP_EVIDENCE = frozenset({"rank.anomaly", "rank.sdc"})
# Resumed within this long of detection, for every fault repaired during training.
RESUME_TARGET_S = 60.0
WARM_RESUME_TARGET_S = 5.0
# A live repair: the survivors' stall (no step completes) and the spare's join (from the
# decision to the job's first step at full width).
LIVE_STALL_TARGET_S = 5.0
LIVE_JOIN_TARGET_S = 15.0
# A hang is detected within the watchdog's timeout plus this much.
HANG_SLACK_S = 10.0
# The evidence step's own deadlines, as shipped: the ranks' part, then the whole bundle.
CAPTURE_S = float(EvidenceParams.model_fields["timeout_s"].default)
BUNDLE_S = float(EvidenceParams.model_fields["bundle_s"].default)
# A run repaired live ends within this much (relative) of the clean run's final loss: the
# same samples in each step, their gradients summed in another order while a replica was
# missing (a few fp32 ulps a step; one step on other samples moves it ~1e-2).
LOSS_TOLERANCE = 1e-4
# Repairs after which the run ends bit-identical to a clean run only if the reference replays
# them too (a learning-rate scale window: the drill passes it to the reference when there is one);
# every other repair is rollback-and-resume, possibly skipping batches the reference skips too.
CHANGES_NUMERICS = frozenset({"lr_scale"})


@dataclass(frozen=True)
class Strike:
    """When and where a fault struck: demo time, training step, node (and rank) it hit."""

    t: float | None
    step: int | None
    node: str | None
    rank: int | None = None


@dataclass(frozen=True)
class Generation:
    """One launch of the gang: demo time of the launch, its number and the nodes it ran on;
    `stopped_t`, the demo time its gang was gone (the supervisor's teardown), None for one it
    did not stop. `launched`: the nodes whose ranks it started, where fewer than `nodes` (a
    live repair's rejoining replicas; their peers ran on)."""

    t: float
    number: int
    nodes: tuple[str, ...]
    stopped_t: float | None = None
    launched: tuple[str, ...] | None = None

    @property
    def started_on(self) -> tuple[str, ...]:
        return self.nodes if self.launched is None else self.launched


@dataclass(frozen=True)
class Timing:
    """The settings the time targets are judged against (the drill's, after its time scale)."""

    agent_interval_s: float = 1.0
    hang_timeout_s: float = 60.0
    resume_s: float = RESUME_TARGET_S
    # A repair whose rank processes stay warm (warm restart, live) resumes within this long of
    # detection: 5 s on the local fleet, 10 s on the Slurm cluster.
    warm_resume_s: float = WARM_RESUME_TARGET_S


@dataclass
class Evidence:
    """Everything the drill recorded, in demo seconds (`t0` converts coordinator epochs)."""

    scenario: Scenario
    t0: float
    incidents: list[dict[str, Any]]  # /v1/incidents/{id} documents
    strikes: dict[int, Strike]  # by index in scenario.faults
    steps: list[tuple[float, int, int]]  # (t, step, generation) of each metrics line
    completed_steps: int
    final_digest: str | None
    reference_digest: str | None
    burnin_exclude: list[str] = field(default_factory=list)
    # The reference replayed the learning-rate scale windows the repairs set (see drill.py).
    reference_has_lr_scale: bool = False
    generations: list[Generation] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    # The operator's returns of the scenario's `returns` drill (demo/returns.py).
    returns: dict[str, Any] | None = None
    # What each restart cost (demo/repairs.py): path, stall, join, checkpoint reads, survivors
    # restarted.
    repairs: list[dict[str, Any]] = field(default_factory=list)
    # The run's last step's loss and the reference's at that step.
    final_loss: float | None = None
    reference_final_loss: float | None = None
    # The token ledger's verdict (the trainer's checker, `python -m
    # trainer_hooks.reference.ledger OUT --json`); None when the run kept no ledger.
    tokens: dict[str, Any] | None = None


def incident_nodes(inc: dict[str, Any]) -> set[str]:
    nodes = {e["node"] for e in inc.get("events", []) if e.get("node")}
    target = str(inc.get("target", ""))
    return nodes | ({target} if target.startswith(NODE_PREFIXES) else set())


def incident_ranks(inc: dict[str, Any]) -> set[int]:
    return {int(e["rank"]) for e in inc.get("events", []) if e.get("rank") is not None}


def evicted(inc: dict[str, Any]) -> list[str]:
    """Nodes the incident's playbook evicted (what the `evict_node` action reports it did)."""
    return sorted(
        {
            str(n)
            for a in inc.get("actions", [])
            if a["action"] == "evict_node" and a["state"] == "done"
            for n in (a.get("result") or {}).get("nodes", [])
        }
    )


def blamed_nodes(inc: dict[str, Any]) -> set[str]:
    """The nodes an incident holds responsible: those it evicted, else those its evidence
    came from."""
    return set(evicted(inc)) or incident_nodes(inc)


def incident_target(inc: dict[str, Any]) -> str:
    """The evicted node, else a node name when the evidence points at one node, a rank when at
    one rank."""
    if len(evicted(inc)) == 1:
        return evicted(inc)[0]
    nodes, ranks = incident_nodes(inc), incident_ranks(inc)
    if len(ranks) == 1 and inc.get("fault") not in ("gpu_hardware", "thermal", "straggler"):
        return f"rank-{next(iter(ranks))}"
    if len(nodes) == 1:
        return next(iter(nodes))
    return str(inc.get("target"))


def fault_target(fault: Any) -> str:
    if isinstance(fault, CorruptBatchFault):
        return f"batch-{fault.batch}"
    if isinstance(fault, RANK_FAULTS):
        return f"rank-{fault.rank}"
    return str(fault.node)


def step_in_progress(steps: list[tuple[float, int, int]], t: float) -> int:
    """The step being trained at demo time `t`: one past the last step reported by then."""
    before = [s for (st, s, _g) in steps if st <= t]
    return (before[-1] if before else 0) + 1


def detected_step(inc: dict[str, Any], ev: Evidence) -> int:
    """The step whose own numbers gave the incident away, when its first evidence is a step's
    measurement (a loss anomaly, an SDC digest; the hooks number steps from 0 as the trainer's
    loop does, so hooks step s is the trainer's step s + 1); otherwise the step in progress
    when the incident opened (a hang's report names the last step that finished, not the one
    that hung)."""
    first = inc.get("first_step")
    events = inc.get("events") or []
    if first is not None and events and events[0].get("kind") in STEP_EVIDENCE:
        return int(first) + 1
    return step_in_progress(ev.steps, inc["opened_at"] - ev.t0)


def resumed_at(steps: list[tuple[float, int, int]], t: float) -> float | None:
    """Demo time of the first step reported by a later generation than the one running at t."""
    gen = max((g for (st, _s, g) in steps if st <= t), default=0)
    later = [st for (st, _s, g) in steps if st > t and g > gen]
    return min(later) if later else None


def attributed(fault: Any, strike: Strike | None, inc: dict[str, Any], t0: float) -> bool:
    if inc.get("fault") not in EXPLAINS.get(fault.kind, frozenset()):
        return False
    if strike is None or strike.t is None:
        return False  # it never struck: nothing can have detected it
    if inc["opened_at"] - t0 < strike.t - STRIKE_SLACK_S:
        return False  # opened before the fault struck: something else
    if isinstance(fault, CorruptBatchFault):
        return True  # the data, not a node: any rank may be the one that sees it
    if isinstance(fault, NODE_FAULTS):
        return fault.node in blamed_nodes(inc)
    if evicted(inc):  # the repair took a node out: it must be the one the fault struck
        return strike.node in evicted(inc)
    if fault.rank in incident_ranks(inc):
        return True
    return strike.node is not None and strike.node in incident_nodes(inc)


def playbook_runs(inc: dict[str, Any]) -> list[dict[str, Any]]:
    """The incident's playbook runs, without the steps a person asked for on it (`manual`: an
    operator's return of the node, which is graded on its own)."""
    return [r for r in inc.get("runs", []) if r.get("playbook") != "manual"]


def playbook_actions(inc: dict[str, Any]) -> list[dict[str, Any]]:
    manual = {r.get("id") for r in inc.get("runs", []) if r.get("playbook") == "manual"}
    return [a for a in inc.get("actions", []) if a.get("run_id") not in manual]


def _actions(inc: dict[str, Any]) -> list[str]:
    """Action names, with the nodes an eviction took out."""
    names = []
    for a in playbook_actions(inc):
        nodes = (a.get("result") or {}).get("nodes") if a["action"] == "evict_node" else None
        names.append(a["action"] + (":" + ",".join(map(str, nodes)) if nodes else ""))
    return names


def _resolution(inc: dict[str, Any]) -> str:
    runs = playbook_runs(inc)
    status = runs[-1]["status"] if runs else "no playbook"
    return f"{inc.get('state')} (playbook {inc.get('playbook') or 'none'}: {status})"


def _failed_step_reason(inc: dict[str, Any]) -> str | None:
    """Why a playbook stopped short: the reason its escalated or failed action gave."""
    for a in playbook_actions(inc):
        if a.get("state") in ("escalated", "failed"):
            why = (a.get("result") or {}).get("reason") or (a.get("result") or {}).get("error")
            return f"{a['action']} {a['state']}" + (f": {why}" if why else "")
    return None


def expects_stop(fault: Any) -> bool:
    """A fault no restart cures: the drill expects the restart budget to stop the job."""
    return fault.kind == "crash" and bool(getattr(fault, "recurs", False))


def stop_problem(incidents: list[dict[str, Any]]) -> str | None:
    """None when a poison crash's incidents ended as they should (the restart budget stopped
    the job, no node evicted for it), else why not."""
    if not incidents:
        return "not detected"
    taken = sorted({n for i in incidents for n in evicted(i)})
    if taken:
        return f"evicted {', '.join(taken)} for a crash that follows the step, not the node"
    last = incidents[-1]
    spent = [
        a
        for a in last.get("actions", [])
        if a["action"] == "resume"
        and a["state"] == "escalated"
        and "restart budget spent" in str((a.get("result") or {}).get("error", ""))
    ]
    if last.get("state") != "escalated" or not spent:
        return f"the restart budget did not stop the job (last incident: {_resolution(last)})"
    return None


def repair_problem(
    fault: Any, strike: Strike | None, inc: dict[str, Any] | None, ev: Evidence
) -> str | None:
    """None when the fault was repaired, else why not (one line a person can act on)."""
    if inc is None:
        return "not detected"
    runs = playbook_runs(inc)
    status = runs[-1]["status"] if runs else None
    if status != "done":
        why = _failed_step_reason(inc)
        return f"playbook {inc.get('playbook') or 'none'} {status or 'never ran'}" + (
            f" ({why})" if why else ""
        )
    detect_t = inc["opened_at"] - ev.t0
    if resumed_at(ev.steps, detect_t) is None:
        return "training never resumed after the repair"
    node = strike.node if strike else None
    if fault.kind in HARDWARE_FAULTS and node:
        # From the node's drain on (its detection where none is recorded): a repair that waits
        # for a checkpoint first keeps training on the node, and a restart another incident's
        # repair makes meanwhile rightly takes it along; one the supervisor took before the
        # drain could not (it launches on the nodes it was given, and this repair's own
        # restart follows it).
        drained = recorded_stages(inc).get("drained")
        since = detect_t if drained is None else max(detect_t, drained - ev.t0)
        ordered = {r["generation"]: r["at"] for r in ev.repairs}
        still = [
            g.number
            for g in ev.generations
            if g.t > since and node in g.started_on and ordered.get(g.number, since) >= since
        ]
        if still:
            gens = ", ".join(map(str, still))
            return f"{node} still trained after the repair (generation {gens})"
    return None


def evidence_of(inc: dict[str, Any]) -> dict[str, Any] | None:
    """What the incident's repair kept before it destroyed anything (`core/bundle.py`): the
    seconds to capture the ranks' part, to seal the bundle, and what the bundle lacks; None
    when its repair captured nothing (no destructive step)."""
    if not captured(inc):
        return None
    bundle = inc.get("bundle") or {}
    return {
        "capture_s": bundle.get("capture_s"),
        "seal_s": bundle.get("seal_s"),
        "missing": sorted(bundle.get("missing") or {}) if bundle else ["the bundle"],
        "sha256": bundle.get("sha256"),
    }


def time_checks(fault: Any, entry: dict[str, Any], timing: Timing) -> list[dict[str, Any]]:
    """The fault's time targets, each with its limit, its measured figure and whether it held."""
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float | None, limit: float, unit: str = "s") -> None:
        met = value is not None and value <= limit
        checks.append({"target": name, "limit": limit, "value": value, "unit": unit, "met": met})

    ttd = entry["time_to_detect_s"]
    if isinstance(fault, NODE_FAULTS):
        check("detected within one agent interval", ttd, timing.agent_interval_s)
    if fault.kind == "hang":
        check(
            "detected within the watchdog timeout + 10 s", ttd, timing.hang_timeout_s + HANG_SLACK_S
        )
    if fault.kind in AT_THEIR_STEP:
        late = (
            entry["detected_step"] - entry["injected_step"]
            if entry["detected_step"] is not None and entry["injected_step"] is not None
            else None
        )
        check("detected at its step", late, 0, unit="steps late")
    if entry.get("repair_path") in ("warm_restart", "live"):
        limit = timing.warm_resume_s
        check(f"resumed within {limit:g} s of detection", entry["time_to_resume_s"], limit)
    else:
        check("resumed within 60 s of detection", entry["time_to_resume_s"], timing.resume_s)
    kept = entry.get("evidence")
    if kept is not None:  # a destructive repair keeps the evidence first, whole
        whole = not kept["missing"]
        check(f"evidence captured within {CAPTURE_S:g} s", kept["capture_s"], CAPTURE_S)
        check(
            f"evidence bundle whole and sealed within {BUNDLE_S:g} s",
            kept["seal_s"] if whole else None,
            BUNDLE_S,
        )
    return checks


def build_result(ev: Evidence) -> dict[str, Any]:
    incidents = sorted(ev.incidents, key=lambda i: i["opened_at"])
    explained: set[int] = set()
    faults = []
    for index, fault in enumerate(ev.scenario.faults):
        strike = ev.strikes.get(index)
        if isinstance(fault, PRELAUNCH_FAULTS):
            faults.append(_burnin_fault(fault, ev))
            continue
        mine = [i for i in incidents if attributed(fault, strike, i, ev.t0)]
        entry = _fault_entry(fault, strike, mine[0] if mine else None, ev)
        if expects_stop(fault):
            entry["repair_problem"] = stop_problem(mine)
            entry["repaired"] = entry["repair_problem"] is None
            entry["expected"] = "stopped by the restart budget"
        faults.append(entry)
        explained |= {i["id"] for i in mine}
    false = [i for i in incidents if i["id"] not in explained]
    evicted_nodes = sorted({n for i in incidents for n in evicted(i)})
    bit_identical = ev.final_digest is not None and ev.final_digest == ev.reference_digest
    must_match = ev.reference_has_lr_scale or not any(
        set(_kinds(i)) & CHANGES_NUMERICS for i in incidents
    )
    stops = any(expects_stop(f) for f in ev.scenario.faults)
    must_match = must_match and not stops  # stopped early: no final model to compare
    # A live repair changes the order of the gradient sums while a replica is missing: the
    # final loss must be within LOSS_TOLERANCE of the reference's instead (docs/recovery.md).
    live = any(r["path"] == "live" for r in ev.repairs)
    loss_ok = _within(ev.final_loss, ev.reference_final_loss, LOSS_TOLERANCE)
    same = bit_identical if not live else loss_ok
    must_match = must_match and not (live and stops)
    completed = stops or (
        ev.completed_steps >= ev.scenario.trainer.steps and ev.final_digest is not None
    )
    problems = _problems(faults, false, completed, ev, same or not must_match, live)
    if ev.tokens is not None and not ev.tokens["exact"] and completed and not stops:
        problems.append(f"the token ledger is not exact: {'; '.join(ev.tokens['problems'])}")
    returns = grade_returns(ev.returns) if ev.scenario.returns is not None else None
    if returns is not None and returns["problem"]:
        problems.append(f"validation before return of {returns['node']}: {returns['problem']}")
    return {
        "verdict": "fail" if problems else "pass",
        "problems": problems,
        "scenario": ev.scenario.name,
        "completed_steps": ev.completed_steps,
        "incidents": [_incident_entry(i, ev) for i in incidents],
        "faults": faults,
        "false_incidents": [_incident_entry(i, ev) for i in false],
        "evicted_nodes": evicted_nodes,
        "burnin_excluded": ev.burnin_exclude,
        "final_digest": ev.final_digest,
        "reference_digest": ev.reference_digest,
        "bit_identical": bit_identical,
        "bit_identity_required": must_match and not live,
        "final_loss": ev.final_loss,
        "reference_final_loss": ev.reference_final_loss,
        "loss_tolerance": LOSS_TOLERANCE if live else None,
        # None where the reference could not replay the run (several learning-rate windows)
        "final_loss_within_tolerance": loss_ok if live and must_match else None,
        "repairs": ev.repairs,
        "tokens": _tokens(ev.tokens),
        "ledger_exact": None if ev.tokens is None else bool(ev.tokens["exact"]),
        **({"returns": returns} if returns is not None else {}),
    }


def grade_returns(record: dict[str, Any] | None) -> dict[str, Any]:
    """The returns drill (a scenario's `returns`): the operator's first return, asked while the
    node's GPU was still damaged, must have been refused by its validation, with the reason; the
    second, after the repair, must have returned it; no return of a damaged node (a false
    return). `problem` says what happened otherwise."""
    record = record or {}
    attempts = list(record.get("attempts") or [])
    damaged = [a for a in attempts if a.get("still_damaged")]
    repaired = [a for a in attempts if not a.get("still_damaged")]
    false_return = any(a.get("outcome") == "returned" for a in damaged)
    refused = (
        bool(damaged)
        and damaged[0].get("outcome") == "refused"
        and ("failed validation" in str(damaged[0].get("reason")))
    )
    returned = bool(repaired) and repaired[0].get("outcome") == "returned"
    problem = None
    if not attempts:
        problem = "the operator never asked (the node was not seen evicted)"
    elif false_return:
        problem = "FALSE RETURN: the node was returned while its GPU was still damaged"
    elif not refused:
        problem = "the return of the damaged node was not refused by validation" + _what(damaged)
    elif not returned:
        problem = "the repaired node was not returned" + _what(repaired)
    return {
        "node": record.get("node"),
        "damage": record.get("damage", []),
        "incident": record.get("incident"),
        "attempts": attempts,
        "refused_while_damaged": refused,
        "refused_reason": damaged[0].get("reason") if damaged else None,
        "returned_after_repair": returned,
        "false_return": false_return,
        "passed": problem is None,
        "problem": problem,
    }


def _what(attempts: list[dict[str, Any]]) -> str:
    """What the first of `attempts` came to, for a problem line."""
    if not attempts:
        return " (never asked)"
    got, why = attempts[0].get("outcome") or "no answer", attempts[0].get("reason")
    return f" ({got}: {why})" if why else f" ({got})"


def _within(value: float | None, reference: float | None, tolerance: float) -> bool:
    if value is None or reference is None:
        return False
    return abs(value - reference) <= tolerance * max(abs(reference), 1e-12)


def _tokens(ledger: dict[str, Any] | None) -> dict[str, int] | None:
    if ledger is None:
        return None
    return {k: int(ledger[k]) for k in ("expected", "consumed", "duplicated", "skipped")}


def _problems(
    faults: list[dict[str, Any]],
    false: list[dict[str, Any]],
    completed: bool,
    ev: Evidence,
    digest_ok: bool,
    live: bool = False,
) -> list[str]:
    """Every reason the drill fails, most important first, one line each."""
    out = []
    for f in faults:
        where = f"{f['kind']} on {f['target']}"
        if not f["detected"]:
            out.append(f"{where}: not detected")
        elif not f["repaired"]:
            out.append(f"{where}: not repaired: {f['repair_problem']}")
        for c in f["targets"]:
            if not c["met"]:
                got = "none" if c["value"] is None else f"{c['value']} {c['unit']}"
                out.append(
                    f"{where}: missed '{c['target']}' (limit {c['limit']} {c['unit']}, got {got})"
                )
    struck = [
        (strike.t, str(ev.scenario.faults[i].kind))
        for i, strike in ev.strikes.items()
        if strike.t is not None
    ]
    out += _repair_problems(ev.repairs, struck)
    out += [f"false incident #{i['id']} {i['fault']} on {incident_target(i)}" for i in false]
    if not completed:
        out.append(
            f"training did not complete ({ev.completed_steps} of {ev.scenario.trainer.steps} steps)"
        )
    elif not digest_ok and live:
        out.append(
            f"the final loss {ev.final_loss} is not within {LOSS_TOLERANCE:g} (relative) of "
            f"the clean reference run's {ev.reference_final_loss}"
        )
    elif not digest_ok:
        out.append("the final model is not bit-identical to the clean reference run")
    return out


def _kinds(inc: dict[str, Any]) -> list[str]:
    return [a["action"] for a in inc.get("actions", [])]


def recorded_stages(inc: dict[str, Any]) -> dict[str, float | None]:
    """The coordinator's recorded timeline of the incident's last relaunching repair (epochs by
    milestone; empty when no repair of it relaunched the job, or its report never came)."""
    rows = inc.get("stages") or []
    return {m: rows[-1].get(f"{m}_at") for m in MILESTONES} if rows else {}


def _incident_entry(inc: dict[str, Any], ev: Evidence) -> dict[str, Any]:
    at = recorded_stages(inc)
    return {
        "id": inc["id"],
        "kind": inc["fault"],
        "target": incident_target(inc),
        "detected_step": detected_step(inc, ev),
        "actions": _actions(inc),
        "resolution": _resolution(inc),
        # when each stage of its repair ended, in demo seconds (`coordinator/stages.py`)
        "stages": {m: round(t - ev.t0, 2) for m, t in at.items() if t is not None},
    }


def _fault_entry(
    fault: Any, strike: Strike | None, inc: dict[str, Any] | None, ev: Evidence
) -> dict[str, Any]:
    detect_t = inc["opened_at"] - ev.t0 if inc is not None else None
    resume_t = resumed_at(ev.steps, detect_t) if detect_t is not None else None
    problem = repair_problem(fault, strike, inc, ev)
    entry: dict[str, Any] = {
        "kind": fault.kind,
        "target": fault_target(fault),
        "struck_node": strike.node if strike else None,
        "injected_step": strike.step if strike else None,
        "detected": inc is not None,
        "detected_step": _incident_entry(inc, ev)["detected_step"] if inc else None,
        "incident": inc["id"] if inc else None,
        "actions": _actions(inc) if inc else [],
        "time_to_detect_s": _round(detect_t - strike.t)
        if detect_t is not None and strike is not None and strike.t is not None
        else None,
        "time_to_resume_s": _round(resume_t - detect_t)
        if resume_t is not None and detect_t is not None
        else None,
        "repaired": problem is None,
        "repair_problem": problem,
        # the coordinator's recorded repair, segment by segment (`coordinator/stages.py`)
        "repair_stages_s": segments(recorded_stages(inc)) if inc else {},
        "repair_path": _path_of(inc, ev) if inc else None,
        "evidence": evidence_of(inc) if inc else None,
    }
    entry["targets"] = time_checks(fault, entry, ev.timing)
    return entry


def _burnin_fault(fault: Any, ev: Evidence) -> dict[str, Any]:
    caught = fault.node in ev.burnin_exclude
    return {
        "kind": fault.kind,
        "target": fault.node,
        "struck_node": fault.node,
        "injected_step": None,
        "detected": caught,
        "detected_step": None,
        "incident": None,
        "actions": ["burnin.exclude"] if caught else [],
        "time_to_detect_s": None,
        "time_to_resume_s": None,
        "repaired": caught,  # kept out of the job before it started
        "repair_problem": None if caught else "burn-in did not exclude the node",
        "repair_stages_s": {},
        "targets": [],
    }


def _path_of(inc: dict[str, Any], ev: Evidence) -> str | None:
    """The path of the incident's last restart (repairs.py), if it restarted the job."""
    paths = [r["path"] for r in ev.repairs if r["incident"] == inc["id"]]
    return paths[-1] if paths else None


def _repair_problems(repairs: list[dict[str, Any]], struck: list[tuple[float, str]]) -> list[str]:
    """A live repair held to its targets: the survivors' stall, the spare's join, no
    checkpoint read and no survivor restarted. A join that another fault cut short (it struck
    the job before the join's target ran out: the replica the spare heals from, hung or
    stopped, cannot send) is not this repair's miss; the entry says which fault
    (`join_cut_short_by`)."""
    out = []
    for r in repairs:
        if r["path"] != "live":
            continue
        where = f"live repair of incident #{r['incident']}"
        stall, join = r["survivor_stall_s"], r["join_s"]
        if stall is None or stall > LIVE_STALL_TARGET_S:
            out.append(f"{where}: survivors stalled {stall} s (target {LIVE_STALL_TARGET_S:g} s)")
        cut = [kind for t, kind in struck if r["at"] < t < r["at"] + LIVE_JOIN_TARGET_S]
        if (join is None or join > LIVE_JOIN_TARGET_S) and cut:
            r["join_cut_short_by"] = cut[0]
        elif join is None or join > LIVE_JOIN_TARGET_S:
            out.append(f"{where}: the spare joined in {join} s (target {LIVE_JOIN_TARGET_S:g} s)")
        if r["checkpoint_reads"]:
            out.append(f"{where}: {r['checkpoint_reads']} checkpoint read(s)")
        if r["survivors_restarted"]:
            out.append(f"{where}: restarted {r['survivors_restarted']} survivor process(es)")
    return out


def _round(x: float) -> float:
    return round(max(0.0, x), 2)


def goodput_input(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """`sentinel goodput --from-demo` input: median measured seconds per fault kind."""
    out: dict[str, dict[str, float]] = {"time_to_detect_s": {}, "time_to_resume_s": {}}
    for key in out:
        by_kind: dict[str, list[float]] = {}
        for f in result["faults"]:
            if f.get(key) is not None:
                by_kind.setdefault(f["kind"], []).append(float(f[key]))
        out[key] = {k: sorted(v)[len(v) // 2] for k, v in by_kind.items()}
    return out
