"""The gate before an evicted node returns: a hold-down of good health, then a validation burn-in.

`return_node` (actions/restore.py) moves the node to `validating` and asks this module, tick
after tick, where its gate stands:

1. hold-down: the coordinator's own record says the node's agent reported `healthy`, with no
   other verdict and no silence longer than `stale_s`, for `hold_down_s` up to now. An agent
   that is silent now is not healthy (the record is what arrived, never what was last said).
2. validation: the node held for it where the scheduler must (an effect: `hold_for_validation`
   of the eviction backend), then a `node.validate` command to that node's agent, carrying the
   baseline's figures and what the hold says the launch needs;
   the agent runs `sentinel burnin --validate` on the node and answers with a `node.validation`
   event, which only the node's own token may send. The command's id is derived from the step's
   key and the moment the node entered `validating`, so a coordinator that restarts finds the
   same command and answer, and a return asked again after a failure asks afresh.

Nothing here reads a scenario or an injector: the answer is what the node measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from sentinel.burnin.baseline import ValidationBaseline, load_validation_baseline
from sentinel.config import ValidationConfig
from sentinel.coordinator.core.rows import NewCommand
from sentinel.coordinator.core.store import StateStore
from sentinel.exitcodes import InputError
from sentinel.protocol import CommandKind, NodeValidationPayload, Verdict

NO_BASELINE = (
    "no validation baseline: a node returns only after a validation burn-in against the fleet's"
    " figures; record them on a healthy node with `sentinel burnin --validate --save-baseline"
    " FILE` and set coordinator.validation.baseline (or the step's `baseline`)"
)


def baseline_for(step_baseline: Path | None, cfg: ValidationConfig) -> ValidationBaseline:
    """The baseline a return validates against; InputError when there is none or it is bad."""
    path = step_baseline or cfg.baseline
    if path is None:
        raise InputError(NO_BASELINE)
    return load_validation_baseline(path)


def healthy_since(verdicts: list[tuple[float, str]], now: float, stale_s: float) -> float | None:
    """Since when the node has been healthy without a break, from (arrival, verdict) pairs
    oldest first; None when it is not healthy now (its last word is not `healthy`, or it has
    been silent for more than `stale_s`). A gap longer than `stale_s` is a break."""
    since: float | None = None
    last: float | None = None
    for at, verdict in verdicts:
        if verdict != Verdict.HEALTHY:
            since = None
        elif since is None or (last is not None and at - last > stale_s):
            since = at
        last = at
    if last is None or now - last > stale_s:
        return None
    return since


@dataclass(frozen=True)
class HoldDown:
    done: bool
    healthy_since: float | None
    left_s: float  # how much longer (the whole period when not healthy now)


def hold_down(store: StateStore, node: str, now: float, cfg: ValidationConfig) -> HoldDown:
    window = store.node_verdicts(node, now - cfg.hold_down_s - cfg.stale_s)
    since = healthy_since(window, now, cfg.stale_s)
    if since is None:
        return HoldDown(False, None, cfg.hold_down_s)
    left = max(0.0, since + cfg.hold_down_s - now)
    return HoldDown(left == 0.0, since, left)


def request_id(step_command_id: str, validating_since: float) -> str:
    """The `node.validate` command's id: one per entry into `validating`."""
    return f"{step_command_id}-validate-{round(validating_since * 1000)}"


def ask(
    store: StateStore,
    node: str,
    rid: str,
    baseline: ValidationBaseline,
    timeout_s: float,
    now: float,
    incident_id: int | None,
    launch: dict[str, str],
) -> float:
    """Queue the `node.validate` (idempotent by its id); when it was queued. `launch`: what the
    node's hold says its agent needs to launch the burn-in (a Slurm reservation)."""
    baseline_doc = baseline.model_dump(mode="json")
    args = {"request_id": rid, "baseline": baseline_doc, "timeout_s": timeout_s, "launch": launch}
    kind = CommandKind.NODE_VALIDATE.value
    store.insert_commands([NewCommand(rid, "node", node, kind, args, now, incident_id)])
    row = store.command(rid)
    return row.created_at if row is not None else now


def answer(store: StateStore, node: str, rid: str) -> NodeValidationPayload | None:
    """The node's answer; an unreadable one counts as a failed validation, never a pass."""
    ev = store.node_validation(node, rid)
    if ev is None:
        return None
    try:
        return NodeValidationPayload.model_validate(ev.payload)
    except ValidationError as e:
        return NodeValidationPayload(request_id=rid, passed=False, reason=f"unreadable: {e}")
