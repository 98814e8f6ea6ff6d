"""Playbooks: declarative trigger -> ordered steps -> guards, validated before use.

```yaml
name: gpu_hardware_fault
description: A GPU node lost a GPU for good; replace it and resume.
priority: 100                  # the highest-priority matching playbook classifies an event
incident: {fault: gpu_hardware, scope: node}    # correlation: one incident per fault + node
trigger:                       # any clause matching opens (or joins) the incident
  - kinds: [node.health]
    when:                      # an XID whose catalog action is one of these
      - {field: payload.xids.*.xid, op: asks, value: [reset_gpu, reboot_node]}
    min_count: 1               # this many matching events from the same node ...
    window_s: 0                # ... within this window (0: within the event retention)
steps:                         # run in order; each step's state is persisted
  - {action: evidence}         # before a step that destroys it (evict, teardown, resume)
  - {action: evict_node, params: {reason: "GPU hardware fault"}}
  - {action: resume}
guards: {cooldown_s: 600, require_approval: false, dry_run: false}
stage_targets_s: {evict_node: 120, first_step: 60}   # optional: seconds each stage should take
```
Condition fields are dotted paths into the event (`payload.verdict`, `source.node`); `*` walks a
list (`payload.findings.*.rule`) and the condition holds when any element satisfies it. A
condition `{any: [...]}` holds when one of its conditions does (a clause's own conditions must
all hold). The `asks` op reads the fault catalog (`sentinel.faults.catalog`): it holds when the
XID code or rule name at the field asks for one of the listed actions, so a playbook follows
the catalog's meaning of a fault instead of repeating a list of codes.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from sentinel.coordinator.core.actions import ACTIONS
from sentinel.coordinator.core.clearance import Clearance
from sentinel.coordinator.core.event_paths import resolves
from sentinel.coordinator.core.stages import LAUNCH_STAGES
from sentinel.exitcodes import InputError
from sentinel.inputs import parse_yaml, read_text
from sentinel.protocol import EVENT_TYPES, Action, EventKind

if TYPE_CHECKING:
    from sentinel.config import CoordinatorConfig
    from sentinel.coordinator.core.store import StateStore


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Op = Literal["eq", "ne", "in", "not_in", "gt", "ge", "lt", "le", "contains", "exists", "asks"]


class Condition(_Strict):
    field: str = Field(default="", pattern=r"^((payload|source|kind)(\.[A-Za-z0-9_*]+)*)?$")
    op: Op = "eq"
    value: Any = None
    any: list[Condition] = Field(default_factory=list)  # instead of a field: one of these holds

    @model_validator(mode="after")
    def _value_fits_op(self) -> Condition:
        if bool(self.field) == bool(self.any):
            raise ValueError("a condition names a field, or lists `any` conditions")
        if self.op in ("in", "not_in") and not isinstance(self.value, list):
            raise ValueError(f"op {self.op!r} needs a list value")
        if self.op in ("gt", "ge", "lt", "le") and not isinstance(self.value, int | float):
            raise ValueError(f"op {self.op!r} needs a number value")
        if self.op == "asks":
            known = {a.value for a in Action}
            if not isinstance(self.value, list) or not set(self.value) <= known:
                raise ValueError(f"op 'asks' needs a list of catalog actions: {sorted(known)}")
        return self


class TriggerClause(_Strict):
    kinds: list[EventKind] = Field(min_length=1)
    when: list[Condition] = Field(default_factory=list)
    min_count: int = Field(default=1, ge=1)
    window_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _fields_exist(self) -> TriggerClause:
        """A condition's field is in the events it is asked of (a misspelt one would never
        hold, and the playbook never fire)."""
        for field in _fields(self.when):
            if not any(resolves(EVENT_TYPES[k], field.split(".")) for k in self.kinds):
                kinds = ", ".join(k.value for k in self.kinds)
                raise ValueError(f"{field} is not a field of {kinds} events")
        return self


def _fields(conditions: list[Condition]) -> list[str]:
    return [f for c in conditions for f in ([c.field] if c.field else _fields(c.any))]


class IncidentSpec(_Strict):
    fault: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    scope: Literal["node", "job"]
    # Rank events from a node with this incident active are its symptoms, not new incidents.
    absorbs_symptoms: bool = False


class Step(_Strict):
    action: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("action")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in ACTIONS:
            raise ValueError(f"unknown action {name!r}; known: {', '.join(sorted(ACTIONS))}")
        return name

    @field_validator("params")
    @classmethod
    def _params_fit(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Checked by the action's own model: its errors point into `params` (and the line)."""
        action = info.data.get("action")
        if action in ACTIONS:
            ACTIONS[action].Params.model_validate(params)
        return params


class Guards(_Strict):
    cooldown_s: float | None = Field(default=None, ge=0)  # None: coordinator default
    require_approval: bool = False
    dry_run: bool = False


class PlaybookMode(StrEnum):
    """An operator's switch of a playbook (`sentinel playbooks shadow|act NAME`), over its
    guards' `dry_run` and the coordinator's: a shadow playbook's runs decide and record every
    step and carry out none."""

    SHADOW = "shadow"
    ACTING = "acting"


class Playbook(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""
    priority: int = 0
    incident: IncidentSpec
    trigger: list[TriggerClause] = Field(min_length=1)
    steps: list[Step] = Field(min_length=1)
    guards: Guards = Guards()
    # Seconds each of its repair's stages should take at most (`/metrics` exports them and
    # counts the repairs past them): a stage it does not have is an error, not a silent no-op.
    stage_targets_s: dict[str, PositiveSeconds] = Field(default_factory=dict)
    # Set by the coordinator from the corpus's scores (`gate`); None: not gated (a replay).
    _clearance: Clearance | None = PrivateAttr(default=None)

    @field_validator("steps")
    @classmethod
    def _evidence_first(cls, steps: list[Step]) -> list[Step]:
        """What a repair destroys is captured before it: an `evidence` step comes before the
        first step that ends rank processes or takes a node (`BaseAction.destroys_evidence`)."""
        for index, step in enumerate(steps):
            if step.action == "evidence":
                break
            if ACTIONS[step.action].destroys_evidence:
                raise ValueError(
                    f"step {index + 1} ({step.action}) destroys the ranks' flight recorders and"
                    " stacks or the node's state: put an `evidence` step before it"
                )
        return steps

    @field_validator("stage_targets_s")
    @classmethod
    def _known_stages(cls, targets: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        steps: list[Step] | None = info.data.get("steps")
        if steps is None:
            return targets  # the steps' own errors are reported
        known = _stages_of(steps)
        errors = [
            _error(
                name,
                value,
                "unknown stage '{stage}'; this playbook's stages: {known}",
                stage=name,
                known=", ".join(known),
            )
            for name, value in targets.items()
            if name not in known
        ]
        parts = sum(targets.get(s, 0.0) for s in ("rendezvous", "checkpoint_load"))
        whole = targets.get("first_step")
        if whole is not None and parts > whole:
            errors.append(
                _error(
                    "first_step",
                    whole,
                    "can never be met: the restart to its first step"
                    " spans rendezvous and checkpoint_load, whose targets add up to {parts} s",
                    parts=f"{parts:g}",
                )
            )
        if errors:
            raise ValidationError.from_exception_data("stage_targets_s", errors)
        return targets

    def stage_names(self) -> list[str]:
        """Its repair's stages after the decision: its steps' actions, in order, once each."""
        return list(dict.fromkeys(step.action for step in self.steps))

    def all_stages(self) -> list[str]:
        """Every stage `/metrics` observes for it: `decide`, its steps' actions, `bundle` when
        it captures evidence, and when it resumes the job, the relaunch's (`rendezvous`,
        `checkpoint_load`, `first_step`)."""
        return _stages_of(self.steps)

    def runs_dry(self, store: StateStore, cfg: CoordinatorConfig) -> bool:
        """Whether a run of it opened now is a shadow (dry) run."""
        return self.mode(store.playbook_mode(self.name), cfg)[0] is PlaybookMode.SHADOW

    def mode(self, switched: str | None, cfg: CoordinatorConfig) -> tuple[PlaybookMode, str]:
        """Its mode and what set it: the operator's switch (`switched`, None where none was
        made), else its guards' dry_run, else the coordinator's."""
        if switched is not None:
            return PlaybookMode(switched), "switched by an operator"
        if self.guards.dry_run:
            return PlaybookMode.SHADOW, "its guards.dry_run"
        if cfg.dry_run:
            return PlaybookMode.SHADOW, "the coordinator's dry_run"
        if self._clearance is not None and not self._clearance.acts:
            return PlaybookMode.SHADOW, self._clearance.why
        return PlaybookMode.ACTING, "the default"

    def gate(self, clearance: Clearance) -> None:
        """Hold its runs to the corpus's measurement (an operator's switch still overrides)."""
        self._clearance = clearance

    @property
    def clearance(self) -> Clearance | None:
        return self._clearance


PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _error(name: str, value: Any, message: str, **ctx: str) -> InitErrorDetails:
    """An error at `stage_targets_s.<name>`, so that its line is the stage's own."""
    return InitErrorDetails(
        type=PydanticCustomError("stage_target", message, ctx), loc=(name,), input=value
    )


def _stages_of(steps: list[Step]) -> list[str]:
    actions = list(dict.fromkeys(step.action for step in steps))
    sealed = ["bundle"] if "evidence" in actions else []  # sealed beside the repair
    relaunch = list(LAUNCH_STAGES) if "resume" in actions else []
    return ["decide", *actions, *sealed, *relaunch]


class PlaybookError(ValueError):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic error location (the deepest one found)."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            if match is None:
                key = next((k for k, _ in node.value if k.value == str(part)), None)
                return key.start_mark.line + 1 if key is not None else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def load_playbook(path: Path, baseline: Path | None = None) -> Playbook:
    """One playbook, validated; `baseline`: the coordinator's validation baseline, if any."""
    try:
        text = read_text(path)
        doc = parse_yaml(text, str(path))
    except InputError as e:
        raise PlaybookError([str(e)]) from None
    tree = yaml.compose(text)
    if not isinstance(doc, dict):
        raise PlaybookError([f"{path}:1: a playbook is a mapping (name, incident, trigger, ...)"])
    try:
        book = Playbook.model_validate(doc)
    except ValidationError as e:
        errors = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            field = ".".join(str(p) for p in loc) or "(playbook)"
            line = _line_of(tree, loc)
            errors.append(f"{path}:{line}: {field}: {err['msg']}")
        raise PlaybookError(errors) from None
    errors = [
        f"{path}:{_line_of(tree, loc)}: {msg}" for loc, msg in _baseline_errors(book, baseline)
    ]
    if errors:
        raise PlaybookError(errors)
    return book


def _baseline_errors(
    book: Playbook, baseline: Path | None
) -> list[tuple[tuple[int | str, ...], str]]:
    """A step that validates a node (`return_node`) needs a baseline to judge it by: its own
    `baseline` or the coordinator's; a named one must be readable."""
    from sentinel.burnin.baseline import load_validation_baseline
    from sentinel.exitcodes import InputError

    out: list[tuple[tuple[int | str, ...], str]] = []
    for i, step in enumerate(book.steps):
        if step.action != "return_node":
            continue
        own = step.params.get("baseline")
        if own is None and baseline is None:
            loc: tuple[int | str, ...] = ("steps", i, "action")
            out.append(
                (
                    loc,
                    f"steps.{i}: return_node validates the node before its return,"
                    " against no baseline: set its params.baseline or"
                    " coordinator.validation.baseline (`sentinel burnin --validate"
                    " --save-baseline FILE` records one)",
                )
            )
            continue
        try:
            load_validation_baseline(Path(own) if own is not None else baseline)  # type: ignore[arg-type]
        except InputError as e:
            where = ("steps", i, "params", "baseline") if own is not None else ("steps", i)
            out.append((where, f"steps.{i}: {e}"))
    return out


def load_playbooks(directory: Path, baseline: Path | None = None) -> list[Playbook]:
    """Every `*.yaml`/`*.yml` in DIR, all validated; PlaybookError lists every problem.
    `baseline`: the coordinator's validation baseline (`coordinator.validation.baseline`)."""
    if not directory.is_dir():
        raise PlaybookError([f"{directory}: not a directory"])
    books: list[Playbook] = []
    errors: list[str] = []
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not files:
        errors.append(f"{directory}: no playbooks (*.yaml) found")
    seen: dict[str, Path] = {}
    for path in files:
        try:
            book = load_playbook(path, baseline)
        except PlaybookError as e:
            errors.extend(e.errors)
            continue
        if book.name in seen:
            errors.append(f"{path}:1: name: {book.name!r} is also defined in {seen[book.name]}")
        seen[book.name] = path
        books.append(book)
    if errors:
        raise PlaybookError(errors)
    return sorted(books, key=lambda b: (-b.priority, b.name))


def default_playbooks_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "playbooks"
