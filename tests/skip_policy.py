"""A pytest plugin: lists every skip with its reason at the end of a run, and in CI (CI=true)
fails any skipped test, since CI installs every real component the suite needs."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped in CI, where every real component is installed: {_reason(report)}"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if not skipped:
        return
    by_reason: dict[str, list[str]] = defaultdict(list)
    for r in skipped:
        by_reason[_reason(r)].append(r.nodeid)
    terminalreporter.section(f"{len(skipped)} skipped, and why")
    for reason, nodeids in sorted(by_reason.items()):
        terminalreporter.write_line(f"{reason} ({len(nodeids)}):")
        for nodeid in nodeids:
            terminalreporter.write_line(f"    {nodeid}")
