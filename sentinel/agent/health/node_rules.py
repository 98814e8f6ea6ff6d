"""Node-level rules: what no single GPU reading shows.

NVML not answering, GPUs missing from NVML, and the host faults the kernel log reports. Their
meaning (verdict, action, hold) is the catalog's; this module says when each raises and clears,
from one `NodeSignals` per sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sentinel.agent.nvml.deadline import Stall
from sentinel.faults.catalog import RULE_BY_NAME, RuleInfo

# Rules raised by a report (a kernel-log line, an unknown value) rather than by a level.
REPORTED_RULES = ("fs_read_only", "machine_check", "pcie_aer_fatal", "hung_task", "unknown_signal")
# Reported rules that never clear by themselves: a read-only root stays read-only.
STICKY_RULES = frozenset({"fs_read_only"})


@dataclass(frozen=True, slots=True)
class Report:
    """One host finding: a kernel-log line or an input the catalog cannot read."""

    rule: str
    detail: str


@dataclass(frozen=True, slots=True)
class NodeSignals:
    stall: Stall | None = None
    expected_gpus: int | None = None
    visible_gpus: int | None = None
    reports: tuple[Report, ...] = ()  # raised since the last evaluation


@dataclass(frozen=True, slots=True)
class NodeRule:
    info: RuleInfo
    raised: Callable[[NodeSignals], str | None]  # the detail when it raises, else None
    clears: Callable[[NodeSignals], bool]


def _missing(s: NodeSignals) -> str | None:
    if s.expected_gpus is None or s.visible_gpus is None or s.visible_gpus >= s.expected_gpus:
        return None
    return f"{s.visible_gpus} of {s.expected_gpus} expected GPUs answer NVML"


def _reported(rule: str) -> Callable[[NodeSignals], str | None]:
    def raised(s: NodeSignals) -> str | None:
        details = [r.detail for r in s.reports if r.rule == rule]
        if not details:
            return None
        more = f" (+{len(details) - 1} more)" if len(details) > 1 else ""
        return details[-1] + more

    return raised


def _clears_unless_sticky(rule: str) -> Callable[[NodeSignals], bool]:
    """A reported finding clears on its own unless the rule is sticky (a person clears it)."""
    sticky = rule in STICKY_RULES
    return lambda _s: not sticky


NODE_RULES: tuple[NodeRule, ...] = (
    NodeRule(
        RULE_BY_NAME["nvml_unresponsive"],
        lambda s: s.stall.describe() if s.stall is not None else None,
        lambda s: s.stall is None,
    ),
    NodeRule(RULE_BY_NAME["gpu_missing"], _missing, lambda s: _missing(s) is None),
    *(
        NodeRule(RULE_BY_NAME[name], _reported(name), _clears_unless_sticky(name))
        for name in REPORTED_RULES
    ),
)
