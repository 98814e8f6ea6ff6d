"""`sentinel dashboards burnin-textfile`: a burn-in report as the sentinel_burnin_* series the
burn-in dashboard reads, parsed back with Prometheus' own text parser."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from burnin_sample import SAMPLE_REPORT
from prometheus_client.parser import text_string_to_metric_families


def run(sentinel_cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sentinel_cmd, "dashboards", "burnin-textfile", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_report_becomes_dashboard_series(sentinel_cmd: list[str], tmp_path: Path) -> None:
    report = tmp_path / "burnin.json"
    report.write_text(json.dumps(SAMPLE_REPORT))
    out = tmp_path / "sentinel_burnin.prom"
    r = run(sentinel_cmd, str(report), "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = samples(out.read_text())
    assert s[("sentinel_burnin_verdict", (("verdict", "fail"),))] == 1
    assert s[("sentinel_burnin_verdict", (("verdict", "pass"),))] == 0
    assert s[("sentinel_burnin_last_run_timestamp_seconds", ())] == report.stat().st_mtime
    assert s[("sentinel_burnin_node_verdict", (("node", "node-1"), ("verdict", "fail")))] == 1
    assert s[("sentinel_burnin_node_verdict", (("node", "node-0"), ("verdict", "fail")))] == 0
    assert ("sentinel_burnin_node_reason", (("node", "node-1"), ("reason", "rank 3 slow"))) in s
    link = ("sentinel_burnin_link_bandwidth_bytes_per_second", (("a", "node-0"), ("b", "node-1")))
    assert s[link] == 0.25e9
    assert s[("sentinel_burnin_link_ok", (("a", "node-0"), ("b", "node-1")))] == 0
    key = (("op", "all_reduce"), ("size_bytes", str(1 << 24)))
    assert s[("sentinel_burnin_collective_busbw_bytes_per_second", key)] == 1.65e9
    wrong = (("op", "all_gather"), ("size_bytes", str(1 << 24)))
    assert s[("sentinel_burnin_collective_correct", wrong)] == 0
    assert s[("sentinel_burnin_straggler", (("rank", "3"),))] == 1
    assert s[("sentinel_burnin_straggler_slowdown_ratio", (("rank", "3"),))] == 1.3
    assert s[("sentinel_burnin_sdc_mismatch", (("rank", "2"),))] == 1
    assert list(tmp_path.glob(".sentinel_burnin.prom.*")) == []  # the temporary file is gone

    r = run(sentinel_cmd, str(report))  # stdout
    assert r.returncode == 0 and samples(r.stdout) == s


def test_bad_reports_exit_2_and_leave_the_old_file(sentinel_cmd: list[str], tmp_path: Path) -> None:
    out = tmp_path / "sentinel_burnin.prom"
    out.write_text("# previous run\n")
    bad = tmp_path / "bad.json"
    for content, expected in (
        ("{", "Expecting"),
        (json.dumps({"verdict": "pass"}), "not a burn-in report: KeyError"),
        (json.dumps(SAMPLE_REPORT | {"links": [{"a": "x"}]}), "not a burn-in report"),
    ):
        bad.write_text(content)
        r = run(sentinel_cmd, str(bad), "--out", str(out))
        assert r.returncode == 2 and expected in r.stderr, r.stderr
        assert out.read_text() == "# previous run\n"
    r = run(sentinel_cmd, str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "missing.json" in r.stderr
    bad.write_text(json.dumps(SAMPLE_REPORT))
    r = run(sentinel_cmd, str(bad), "--out", str(tmp_path / "nope" / "x.prom"))
    assert r.returncode == 2 and "does not exist" in r.stderr
