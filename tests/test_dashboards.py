"""The committed Grafana dashboards: reproducible from the builder, importable anywhere, and every
panel carrying a unit, thresholds and queries through the one datasource variable."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sentinel.dashboards import BUILDERS, build_all, load_dir, render
from sentinel.dashboards.panels import expressions

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"
BUILT = build_all()


def test_committed_json_equals_builder_output() -> None:
    committed = {p.stem: p.read_text() for p in DASHBOARD_DIR.glob("*.json")}
    assert sorted(committed) == sorted(BUILDERS), "run `python -m sentinel.dashboards`"
    for name, dashboard in BUILT.items():
        assert committed[name] == render(dashboard), (
            f"dashboards/{name}.json is stale: run `python -m sentinel.dashboards`"
        )
    assert load_dir(DASHBOARD_DIR) == json.loads(json.dumps(BUILT))


def test_uids_unique_and_stable() -> None:
    uids = [d["uid"] for d in BUILT.values()]
    assert len(set(uids)) == len(uids)
    assert all(re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_one_datasource_variable_and_every_query_uses_it(name: str) -> None:
    d = BUILT[name]
    assert d["schemaVersion"] == 39
    variables = d["templating"]["list"]
    assert [v["name"] for v in variables if v["type"] == "datasource"] == ["datasource"]
    assert variables[0]["query"] == "prometheus"
    text = json.dumps(d)
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {d["uid"]}
    assert uids <= {"${datasource}", "-- Grafana --"}, uids


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_panel_has_unit_thresholds_and_a_query(name: str) -> None:
    d = BUILT[name]
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert panels
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)
    for p in panels:
        defaults = p["fieldConfig"]["defaults"]
        assert defaults["unit"], p["title"]
        assert defaults["thresholds"]["steps"][0]["value"] is None, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        assert p["description"], p["title"]
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_template_variables_are_used_and_defined(name: str) -> None:
    d = BUILT[name]
    defined = {v["name"] for v in d["templating"]["list"]}
    used = set()
    for _, expr in expressions(d):
        used |= set(re.findall(r"\$(\w+)", expr))
    used -= {"__rate_interval", "__range", "labels", "value"}
    assert used <= defined, used - defined
    assert defined - {"datasource"} <= used, "a variable no query uses"


def test_fleet_health_covers_what_operators_look_at() -> None:
    exprs = " ".join(e for _, e in expressions(BUILT["fleet-health"]))
    for metric in (
        "sentinel_gpu_temperature_celsius",
        "sentinel_gpu_power_watts",
        "sentinel_gpu_sm_clock_hertz",
        "sentinel_gpu_utilization_ratio",
        "sentinel_gpu_framebuffer_used_bytes",
        "sentinel_gpu_ecc_errors_total",
        "sentinel_gpu_xid_errors_total",
        "sentinel_gpu_remapped_rows_total",
        "sentinel_gpu_throttle_active",
        "sentinel_node_health_verdict",
        "sentinel_gpu_recommended_action",
        "DCGM_FI_DEV_GPU_TEMP",
    ):
        assert metric in exprs, metric
    assert "topk(" in exprs and "sort_desc(" in exprs
