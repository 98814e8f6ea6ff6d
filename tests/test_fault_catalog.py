"""One meaning per fault: every catalog XID leads to the same response in the agent's verdict
and in the shipped playbook its event triggers.

The agent side is the real path on simulated GPUs (a fault file, the health evaluator, the node
monitor building the `node.health` event that carries the XID); the coordinator side is the shipped playbooks' own
trigger clauses, taken in priority order as ingest takes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.sim import SimulatedGpus, inject
from sentinel.config import HealthThresholds
from sentinel.coordinator.core.correlation import compile_clause, compile_condition, event_doc
from sentinel.coordinator.core.playbooks import (
    Condition,
    Playbook,
    PlaybookError,
    default_playbooks_dir,
    load_playbooks,
)
from sentinel.faults.catalog import CATALOG, RULES, asks, describe, escalated_action, markdown_rules
from sentinel.protocol import Action, Event, EventKind

BOOKS = load_playbooks(default_playbooks_dir())
NODE_OUT = {Action.RESET_GPU, Action.REBOOT_NODE, Action.DRAIN_AND_INSPECT}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _classify(ev: Event) -> Playbook | None:
    """The first playbook (by priority) one of whose trigger clauses `ev` matches."""
    doc = event_doc(ev)
    return next(
        (b for b in BOOKS if any(ev.kind in c.kinds and compile_clause(c)(doc) for c in b.trigger)),
        None,
    )


def _response(book: Playbook | None) -> str:
    """What a playbook does, in the catalog's terms."""
    if book is None:
        return "nothing"
    steps = {s.action for s in book.steps}
    if "evict_node" in steps:
        return "node out"
    if {"rollback", "resume"} <= steps:
        return "restart job"
    return "notify"


def _expected(action: Action) -> str:
    if action in NODE_OUT:
        return "node out"
    return "restart job" if action is Action.RESTART_JOB else "nothing"


def _xid_events(tmp_path: Path, code: int, times: int) -> list[Event]:
    """The health events the agent emits when the driver reports `code` `times` times (each
    carrying the XID)."""
    clock = Clock()
    faults = tmp_path / f"faults-{code}.jsonl"
    gpus = SimulatedGpus(2, faults_file=faults, clock=clock)
    monitor = NodeMonitor("node-0", gpus, None, HealthEvaluator(HealthThresholds(), clock), clock)
    out = []
    for _ in range(times):
        inject(faults, {"kind": "xid", "gpu": 1, "xid": code})
        _, events = monitor.collect()
        out += [e for e in events if e.kind is EventKind.NODE_HEALTH and e.payload.xids]
        clock.now += 60
    return out


@pytest.mark.parametrize("code", [info.code for info in CATALOG])
def test_every_xid_means_the_same_to_agent_and_playbooks(tmp_path: Path, code: int) -> None:
    info = describe(code)
    (first,) = _xid_events(tmp_path, code, 1)
    assert [x.action for x in first.payload.xids] == [info.action.value]  # the agent's verdict
    assert _response(_classify(first)) == _expected(info.action), info


@pytest.mark.parametrize("code", [info.code for info in CATALOG if info.escalates])
def test_a_repeated_xid_escalates_in_both_places(tmp_path: Path, code: int) -> None:
    last = _xid_events(tmp_path, code, HealthThresholds().xid_escalate_after)[-1]
    assert [x.action for x in last.payload.xids] == [escalated_action(code).value]
    assert escalated_action(code).value == "drain_and_inspect"
    assert _response(_classify(last)) == "node out"


def test_xid_94_restarts_the_job_and_keeps_the_node(tmp_path: Path) -> None:
    (event,) = _xid_events(tmp_path, 94, 1)
    book = _classify(event)
    assert book is not None and book.name == "gpu_job_fault"
    assert "evict_node" not in {s.action for s in book.steps}


def test_asks_reads_codes_findings_and_rules() -> None:
    assert asks(79) is Action.REBOOT_NODE
    assert asks("xid_94") is Action.RESTART_JOB
    assert asks("gpu_temp_unhealthy") is Action.DRAIN_AND_INSPECT
    assert asks("no_such_rule") is None and asks(True) is None
    assert all(asks(r.name) is r.action for r in RULES)


def test_asks_condition_rejects_what_the_catalog_does_not_know() -> None:
    with pytest.raises(ValueError, match="catalog actions"):
        Condition(field="payload.xids.*.xid", op="asks", value=["evict_everything"])
    cond = Condition(field="payload.findings.*.rule", op="asks", value=["reboot_node"])
    holds = compile_condition(cond)
    assert holds({"payload": {"findings": [{"rule": "gpu_lost"}]}})
    assert not holds({"payload": {"findings": [{"rule": "gpu_temp_degraded"}]}})


def test_a_playbook_with_an_unknown_action_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nincident: {fault: x, scope: node}\ntrigger:\n  - kinds: [node.health]\n"
        "    when:\n      - {field: payload.xids.*.xid, op: asks, value: [explode]}\n"
        "steps:\n  - {action: evidence}\n  - {action: resume}\n"
    )
    with pytest.raises(PlaybookError, match=r"bad.yaml:6"):
        load_playbooks(tmp_path)


@pytest.mark.parametrize("page", ["README.md", "docs/agent.md"])
def test_the_docs_show_the_rule_table_the_catalog_holds(page: str) -> None:
    text = (Path(__file__).resolve().parent.parent / page).read_text()
    assert markdown_rules() in text, (
        f"{page}: regenerate its rule table: python -m sentinel.faults.catalog"
    )
    rows = [line for line in text.splitlines() if line.startswith("| `") and line.count("|") == 8]
    assert {row.split("|")[1].strip(" `") for row in rows} == {r.name for r in RULES}
    assert len(rows) == len(RULES)  # no rule listed twice, none the catalog lacks


def test_every_playbooks_fault_class_has_a_repair_path(tmp_path: Path) -> None:
    """One meaning per fault for its repair too: each incident class a shipped playbook opens
    is in the repair table, and a fault that may have reached every replica never takes the
    live path."""
    from sentinel.coordinator.core.playbooks import default_playbooks_dir, load_playbooks
    from sentinel.faults.repairs import KIND_FAULTS, REPAIR_BY_FAULT, Recovery, allowed_for_kind

    classes = {pb.incident.fault for pb in load_playbooks(default_playbooks_dir())}
    assert classes <= set(REPAIR_BY_FAULT), classes - set(REPAIR_BY_FAULT)
    assert {f for fs in KIND_FAULTS.values() for f in fs} <= classes
    for fault in ("sdc", "loss_spike", "nan_loss", "collective_hang"):
        assert Recovery.LIVE not in REPAIR_BY_FAULT[fault].allowed
    for info in REPAIR_BY_FAULT.values():
        assert info.path in info.allowed
    assert allowed_for_kind("link_degraded") == (frozenset(Recovery), "")
    assert Recovery.LIVE in allowed_for_kind("ecc_dbe")[0]


def test_the_recovery_page_shows_the_repair_table_the_catalog_holds() -> None:
    from sentinel.faults.repairs import markdown_repairs

    page = (Path(__file__).resolve().parent.parent / "docs" / "recovery.md").read_text()
    assert markdown_repairs() in page


def test_a_condition_of_alternatives_holds_when_one_does() -> None:
    xid = {"field": "payload.xids.*.xid", "op": "asks", "value": ["reboot_node"]}
    lost = {"field": "payload.gpus.*.findings.*.rule", "op": "in", "value": ["gpu_lost"]}
    cond = Condition.model_validate({"any": [xid, lost]})
    holds = compile_condition(cond)
    assert holds({"payload": {"xids": [{"xid": 79}]}})
    assert holds({"payload": {"gpus": [{"findings": [{"rule": "gpu_lost"}]}]}})
    assert not holds({"payload": {"xids": [{"xid": 94}], "gpus": []}})
    for bad in ({}, {"field": "payload.verdict", "any": [{"field": "kind"}]}):
        with pytest.raises(ValueError, match="names a field, or lists `any` conditions"):
            Condition.model_validate(bad)


def test_a_healthy_health_event_tries_no_playbook() -> None:
    """The shipped playbooks' health clauses share a gate on the node's verdict: a healthy
    node's event is stored and tries none (the ingest fast path)."""
    from sentinel.config import CoordinatorConfig
    from sentinel.coordinator.core.correlation import Correlator
    from sentinel.protocol import EventBatch, NodeHealthPayload, Source, Verdict, make_event

    correlator = Correlator(None, BOOKS, CoordinatorConfig())  # type: ignore[arg-type]
    healthy = NodeHealthPayload(verdict=Verdict.HEALTHY, action=Action.NONE)
    event = make_event(EventKind.NODE_HEALTH, Source(node="node-0"), healthy)
    assert correlator.passive(EventBatch(events=[event]))
    assert _classify(event) is None


def test_a_straggler_means_the_same_to_the_hooks_and_the_playbook() -> None:
    """One pair of thresholds (`catalog.STRAGGLER`): the hooks name a rank at `named`, the
    shipped playbook acts at `acted_on`, and nothing else says otherwise."""
    from sentinel.faults.catalog import STRAGGLER
    from trainer_hooks.config import HooksConfig

    assert HooksConfig().straggler_threshold == STRAGGLER.named < STRAGGLER.acted_on
    (playbook,) = [p for p in load_playbooks(default_playbooks_dir()) if p.name == "straggler"]
    conditions = [c for clause in playbook.trigger for c in clause.when]
    assert [(c.field, c.op, c.value) for c in conditions] == [
        ("payload.slowdown", "ge", STRAGGLER.acted_on)
    ]
