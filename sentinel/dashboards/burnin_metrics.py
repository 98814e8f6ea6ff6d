"""A burn-in report (`sentinel burnin --json`) as Prometheus text for node_exporter's textfile
collector, which is how the burn-in dashboard sees it: burn-in is a one-shot command with no
server to scrape, so its last result is left in a file the node's exporter serves.

Reads the report's contract keys (verdict, nodes, collectives, links, stragglers, sdc) and, when
present, `straggler_detail` for each rank's GEMM time over the median.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

GB = 1e9


class ReportError(ValueError):
    """The report lacks a contract key or has one of the wrong shape."""


class BurninReportCollector(Collector):
    def __init__(self, report: dict[str, Any], finished_at: float) -> None:
        self.report = report
        self.finished_at = finished_at

    def collect(self) -> Iterator[Metric]:
        r = self.report
        try:
            yield from self._summary(r)
            yield from self._links(r["links"])
            yield from self._collectives(r["collectives"])
            yield from self._ranks(r)
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"not a burn-in report: {type(e).__name__}: {e}") from None

    def _summary(self, r: dict[str, Any]) -> Iterator[Metric]:
        verdict = gauge("sentinel_burnin_verdict", "1 for the burn-in's verdict.", ["verdict"])
        for v in ("pass", "fail"):
            verdict.add_metric([v], int(r["verdict"] == v))
        when = gauge("sentinel_burnin_last_run_timestamp_seconds", "When the burn-in ended.", [])
        when.add_metric([], self.finished_at)
        nodes = gauge(
            "sentinel_burnin_node_verdict", "1 for each node's verdict.", ["node", "verdict"]
        )
        reasons = gauge("sentinel_burnin_node_reason", "Why a node failed.", ["node", "reason"])
        for node, row in r["nodes"].items():
            for v in ("pass", "fail"):
                nodes.add_metric([node, v], int(row["verdict"] == v))
            for reason in row["reasons"]:
                reasons.add_metric([node, str(reason)[:200]], 1)
        yield from (verdict, when, nodes, reasons)

    def _links(self, links: list[dict[str, Any]]) -> Iterator[Metric]:
        bw = gauge(
            "sentinel_burnin_link_bandwidth_bytes_per_second",
            "Measured bandwidth of each pairwise link test.",
            ["a", "b"],
        )
        ok = gauge("sentinel_burnin_link_ok", "1 when the link passed.", ["a", "b"])
        for link in links:
            bw.add_metric([link["a"], link["b"]], float(link["gbps"]) * GB)
            ok.add_metric([link["a"], link["b"]], int(link["verdict"] == "pass"))
        yield from (bw, ok)

    def _collectives(self, rows: list[dict[str, Any]]) -> Iterator[Metric]:
        labels = ["op", "size_bytes"]
        busbw = gauge("sentinel_burnin_collective_busbw_bytes_per_second", "Bus bandwidth.", labels)
        algbw = gauge(
            "sentinel_burnin_collective_algbw_bytes_per_second", "Algorithm bandwidth.", labels
        )
        correct = gauge(
            "sentinel_burnin_collective_correct", "1 when the result was exact.", labels
        )
        for c in rows:
            lv = [c["op"], str(int(c["bytes"]))]
            busbw.add_metric(lv, float(c["busbw_gbps"]) * GB)
            algbw.add_metric(lv, float(c["algbw_gbps"]) * GB)
            correct.add_metric(lv, int(bool(c["correct"])))
        yield from (busbw, algbw, correct)

    def _ranks(self, r: dict[str, Any]) -> Iterator[Metric]:
        flagged = gauge("sentinel_burnin_straggler", "1 for each rank flagged slow.", ["rank"])
        for rank in r["stragglers"]:
            flagged.add_metric([str(int(rank))], 1)
        slowdown = gauge(
            "sentinel_burnin_straggler_slowdown_ratio",
            "Each rank's GEMM time over the gang's median.",
            ["rank"],
        )
        detail = r.get("straggler_detail") or {}
        median_ms = (detail.get("median_gemm_s") or 0) * 1e3
        for rank, row in (detail.get("ranks") or {}).items():
            if median_ms > 0 and "gemm_ms" in row:
                slowdown.add_metric([str(rank)], float(row["gemm_ms"]) / median_ms)
        sdc = gauge(
            "sentinel_burnin_sdc_mismatch", "1 for each rank whose recompute differed.", ["rank"]
        )
        for rank in r["sdc"]["mismatched_ranks"]:
            sdc.add_metric([str(int(rank))], 1)
        yield from (flagged, slowdown, sdc)


def gauge(name: str, help_: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, labels=labels)


def exposition(report: dict[str, Any], finished_at: float) -> bytes:
    registry = CollectorRegistry()
    registry.register(BurninReportCollector(report, finished_at))
    return generate_latest(registry)


def write_textfile(path: Path, body: bytes) -> None:
    """Atomically (write, then rename), so the exporter never serves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
