"""How an action is declared (`BaseAction[Params]`, its name and dry-run note) and what the
declaration does for it: typed parameters, unknown keys refused, a dry run that stops at the
note. The actions' repair logic is tested through the engine in test_coordinator_logic.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from coord_util import ROOT, cfg, xid
from pydantic import ValidationError

from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core.actions import ACTIONS, ActionContext
from sentinel.coordinator.core.actions.base import ActionParams, BaseAction, StepResult, StepStatus
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.playbooks import load_playbooks
from sentinel.coordinator.core.rows import RunContext
from sentinel.coordinator.store import SqliteStore
from sentinel.protocol import EventBatch


class ProbeParams(ActionParams):
    times: int = 1


class Probe(BaseAction[ProbeParams], name="probe", dry_run="would probe"):
    """Counts the calls that reach `act`."""

    def __init__(self) -> None:
        self.acted: list[ProbeParams] = []

    def act(self, ctx: ActionContext, params: ProbeParams) -> StepResult:
        self.acted.append(params)
        return StepResult(StepStatus.DONE, {"times": params.times})


def context(tmp_path: Path, dry_run: bool) -> ActionContext:
    """A step's context on a real store holding one real incident (an XID on node-0)."""
    c = cfg(tmp_path)
    store = SqliteStore(tmp_path / "c.db")
    Ingestor(store, load_playbooks(ROOT / "playbooks"), c).ingest(
        EventBatch(events=[xid("node-0")]), 1000.0
    )
    incident = store.incident(1)
    assert incident is not None
    return ActionContext(
        store, c, make_backend(c), 1000.0, "run-1/0", "playbook", incident, RunContext(), dry_run
    )


def test_the_type_argument_is_the_params_model() -> None:
    assert Probe.name == "probe" and Probe.Params is ProbeParams
    assert {a.name for a in ACTIONS.values()} == set(ACTIONS)


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_every_action_refuses_an_unknown_parameter(name: str) -> None:
    with pytest.raises(ValidationError, match="extra"):
        ACTIONS[name].Params.model_validate({"no_such_key": 1})


def test_a_dry_run_stops_at_the_note(tmp_path: Path) -> None:
    probe = Probe()
    done = probe.run(context(tmp_path, dry_run=True), ProbeParams(times=2))
    assert done == StepResult(StepStatus.DONE, {"dry_run": "would probe"}) and not probe.acted
    done = probe.run(context(tmp_path / "live", dry_run=False), ProbeParams(times=2))
    assert done.detail == {"times": 2} and probe.acted == [ProbeParams(times=2)]


def test_an_action_without_a_params_model_is_refused() -> None:
    with pytest.raises(TypeError, match=r"BaseAction\[ParamsModel\]"):

        class Untyped(BaseAction, name="untyped"):  # type: ignore[type-arg]
            def act(self, ctx: ActionContext, params: ActionParams) -> StepResult:
                raise AssertionError("never declared")
