"""Alert rules and scrape config through Prometheus' own tool: `promtool check rules`,
`promtool test rules` (every rule has firing and silent cases), `promtool check config`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from system_deps import require_command

from sentinel.agent.export.dcgm import BY_LEGACY

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"


def alert_rules() -> list[dict]:
    return [
        r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]
    ]


def promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    promtool = require_command("promtool", "prometheus")
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", "alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in r.stdout


def test_promtool_unit_tests_pass() -> None:
    r = promtool("test", "rules", "alerts_test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_catches_a_broken_expectation(tmp_path: Path) -> None:
    """The unit tests can fail: flip one expected alert label and promtool must say so."""
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    text = (PROM / "alerts_test.yml").read_text().replace('xid: "79"', 'xid: "48"', 1)
    (tmp_path / "alerts_test.yml").write_text(text)
    r = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert r.returncode != 0
    assert "SentinelFatalXid" in r.stdout + r.stderr


def test_every_rule_is_unit_tested_both_ways() -> None:
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for t in tests:
        for case in t["alert_rule_test"]:
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names == firing, names ^ firing
    assert names == silent, names ^ silent


def test_every_rule_has_severity_summary_and_runbook_section() -> None:
    runbooks = (PROM / "runbooks.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (\w+)$", runbooks, re.M)}
    for r in alert_rules():
        assert r["labels"]["severity"] in ("page", "ticket"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        url = r["annotations"]["runbook_url"]
        assert url.endswith("runbooks.md#" + r["alert"].lower()), r["alert"]
        assert r["alert"].lower() in anchors, r["alert"]


def test_scrape_config_is_valid(tmp_path: Path) -> None:
    """As shipped, except the coordinator token file, which promtool requires to exist."""
    token = tmp_path / "coordinator.token"
    token.write_text("snt_example\n")
    config = yaml.safe_load((PROM / "scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"sentinel-agent", "sentinel-coordinator"}
    assert jobs["sentinel-agent"]["honor_labels"] is True
    jobs["sentinel-coordinator"]["authorization"]["credentials_file"] = str(token)
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(config))
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    r = promtool("check", "config", "scrape.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_deployment_page_lists_every_alert_the_rules_file_holds() -> None:
    import runpy

    table = runpy.run_path(str(ROOT / "scripts" / "alert_table.py"))["markdown_alerts"]()
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert table in page, (
        "docs/deployment.md: regenerate its alert table: python scripts/alert_table.py"
    )
    listed = re.findall(r"^\| `(Sentinel\w+)` \|", page, re.M)
    assert listed == [r["alert"] for r in alert_rules() if "alert" in r]


def test_every_rule_on_a_dcgm_series_reads_both_namings() -> None:
    """A rule that reads a dcgm-exporter series by its legacy name reads DCGM 4.7's too
    (dcgm-exporter 4.9, or an agent with `dcgm_names: dcgm-4.7`), so it does not go silent
    when an exporter is upgraded."""
    for rule in alert_rules():
        for legacy, field in BY_LEGACY.items():
            if re.search(rf"\b{legacy}\b", rule["expr"]) and field.current != legacy:
                assert re.search(rf"\b{field.current}\b", rule["expr"]), (rule["alert"], legacy)
