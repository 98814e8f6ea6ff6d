"""The committed Grafana dashboards: reproducible from the builder, importable anywhere, and every
panel carrying a unit, thresholds and queries through the one datasource variable."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from sentinel.agent.export.dcgm import BY_LEGACY
from sentinel.dashboards import SPECS, build_all, load_dir, render
from sentinel.dashboards.panels import expressions

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"
BUILT = build_all()


def test_committed_json_equals_builder_output() -> None:
    committed = {p.stem: p.read_text() for p in DASHBOARD_DIR.glob("*.json")}
    assert sorted(committed) == sorted(SPECS), "run `python -m sentinel.dashboards`"
    for name, dashboard in BUILT.items():
        assert committed[name] == render(dashboard), (
            f"dashboards/{name}.json is stale: run `python -m sentinel.dashboards`"
        )
    assert load_dir(DASHBOARD_DIR) == json.loads(json.dumps(BUILT))


def test_uids_unique_and_stable() -> None:
    uids = [d["uid"] for d in BUILT.values()]
    assert len(set(uids)) == len(uids)
    assert all(re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_one_datasource_variable_and_every_query_uses_it(name: str) -> None:
    d = BUILT[name]
    assert d["schemaVersion"] == 39
    variables = d["templating"]["list"]
    assert [v["name"] for v in variables if v["type"] == "datasource"] == ["datasource"]
    assert variables[0]["query"] == "prometheus"
    text = json.dumps(d)
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {d["uid"]}
    assert uids <= {"${datasource}", "-- Grafana --"}, uids


@pytest.mark.parametrize("name", sorted(SPECS))
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


@pytest.mark.parametrize("name", sorted(SPECS))
def test_template_variables_are_used_and_defined(name: str) -> None:
    d = BUILT[name]
    defined = {v["name"] for v in d["templating"]["list"]}
    used = set()
    for _, expr in expressions(d):
        # `$1` is label_replace's regex group: Grafana leaves a name it does not know as it is.
        used |= set(re.findall(r"\$([A-Za-z_]\w*)", expr))
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


def _function_lengths(paths: list[Path]) -> dict[str, int]:
    out = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                out[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_dashboards_are_data_no_builder_function_over_40_lines() -> None:
    lengths = _function_lengths(sorted((ROOT / "sentinel" / "dashboards").glob("*.py")))
    assert {k: n for k, n in lengths.items() if n > 40} == {}


def test_no_function_anywhere_over_120_lines() -> None:
    paths = sorted([*(ROOT / "sentinel").rglob("*.py"), *(ROOT / "trainer_hooks").rglob("*.py")])
    assert {k: n for k, n in _function_lengths(paths).items() if n > 120} == {}


def test_per_gpu_series_are_aggregated_for_a_fleet() -> None:
    """A time series of a per-GPU or per-node metric draws at most topk/bottomk lines, plus
    fleet aggregates: an all-nodes view of thousands of GPUs stays readable."""
    per_gpu = re.compile(r"sentinel_(gpu|host)_|DCGM_FI_DEV_")
    for name, d in BUILT.items():
        for p in d["panels"]:
            if p["type"] not in ("timeseries", "state-timeline"):
                continue
            for t in p["targets"]:
                if per_gpu.search(t["expr"]):
                    assert re.match(
                        r"(topk|bottomk|quantile|avg|sum|max|min|count)\b", t["expr"]
                    ), (
                        name,
                        p["title"],
                        t["expr"],
                    )


def test_training_run_has_goodput_restarts_checkpoint_and_a_job_selector() -> None:
    d = BUILT["training-run"]
    titles = {p["title"] for p in d["panels"]}
    for t in ("Goodput (last 10 minutes)", "Restarts from a checkpoint (time range)"):
        assert t in titles
    assert "Steps lost to rollbacks" in titles
    # The checkpoint row has panels reading the re-exported rank.checkpoint series.
    checkpoints = [e for t, e in expressions(d) if "since the last checkpoint" in t]
    assert len(checkpoints) == 2
    assert all("sentinel_rank_last_checkpoint_" in e for e in checkpoints)
    job = next(v for v in d["templating"]["list"] if v["name"] == "job")
    assert job["definition"] == "label_values(sentinel_gpu_job_info, job)"
    joined = [e for _, e in expressions(d) if "sentinel_gpu_job_info" in e]
    assert len(joined) >= 4


def test_every_dcgm_query_reads_both_namings() -> None:
    """A panel on a dcgm-exporter series answers under dcgm-exporter's legacy naming and
    DCGM 4.7's (4.9's; `promql()`), so upgrading an exporter leaves no panel empty."""
    for name, d in BUILT.items():
        for title, expr in expressions(d):
            for legacy, field in BY_LEGACY.items():
                if re.search(rf"\b{legacy}\b", expr) and field.current != legacy:
                    assert re.search(rf"\b{field.current}\b", expr), (name, title, legacy)
