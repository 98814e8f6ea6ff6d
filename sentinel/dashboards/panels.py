"""Small builders for Grafana dashboard JSON (schemaVersion 39).

Every panel gets a unit and thresholds; every query goes through one `${datasource}` variable so
a dashboard imports into any Grafana. Panels are laid out left to right, 24 columns wide, and a
`row()` starts a new band. The output is plain dicts, written sorted, so it is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39

# Threshold steps: (value or None for the base step, color).
Steps = Sequence[tuple[float | None, str]]
GOOD_LOW: Steps = ((None, "green"), (1, "red"))
NEUTRAL: Steps = ((None, "green"),)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class Layout:
    """Places panels on Grafana's 24-column grid and hands out panel ids."""

    x: int = 0
    y: int = 0
    row_height: int = 0
    next_id: int = 1

    def place(self, w: int, h: int) -> JSON:
        if self.x + w > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_height = max(self.row_height, h)
        return pos

    def new_row(self) -> JSON:
        self.y += self.row_height
        self.x, self.row_height = 0, 1
        return {"x": 0, "y": self.y, "w": 24, "h": 1}

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def thresholds(steps: Steps) -> JSON:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def targets(queries: Sequence[Query]) -> list[JSON]:
    out = []
    for i, q in enumerate(queries):
        t: JSON = {
            "datasource": DATASOURCE,
            "expr": q.expr,
            "legendFormat": q.legend or "__auto",
            "refId": chr(ord("A") + i),
        }
        if q.instant:
            t |= {"instant": True, "range": False}
        if q.table:
            t["format"] = "table"
        out.append(t)
    return out


def value_mappings(mapping: dict[int, tuple[str, str]]) -> list[JSON]:
    """Numbers shown as words (0 → healthy); each with its color."""
    options = {
        str(k): {"index": i, "text": text, "color": color}
        for i, (k, (text, color)) in enumerate(sorted(mapping.items()))
    }
    return [{"type": "value", "options": options}]


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    tags: list[str]
    variables: list[JSON] = field(default_factory=list)
    annotations: list[JSON] = field(default_factory=list)
    panels: list[JSON] = field(default_factory=list)
    layout: Layout = field(default_factory=Layout)
    links: list[JSON] = field(default_factory=list)

    def row(self, title: str) -> None:
        self.panels.append(
            {
                "type": "row",
                "id": self.layout.take_id(),
                "title": title,
                "collapsed": False,
                "gridPos": self.layout.new_row(),
                "panels": [],
            }
        )

    def add(
        self,
        kind: str,
        title: str,
        description: str,
        queries: Sequence[Query],
        unit: str,
        steps: Steps,
        w: int = 12,
        h: int = 8,
        options: JSON | None = None,
        mappings: list[JSON] | None = None,
        custom: JSON | None = None,
        transformations: list[JSON] | None = None,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> None:
        defaults: JSON = {"unit": unit, "thresholds": thresholds(steps), "mappings": mappings or []}
        if custom:
            defaults["custom"] = custom
        if min_value is not None:
            defaults["min"] = min_value
        if max_value is not None:
            defaults["max"] = max_value
        panel: JSON = {
            "type": kind,
            "id": self.layout.take_id(),
            "title": title,
            "description": description,
            "datasource": DATASOURCE,
            "gridPos": self.layout.place(w, h),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
            "targets": targets(queries),
        }
        if transformations:
            panel["transformations"] = transformations
        self.panels.append(panel)

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": sorted(self.tags),
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "editable": True,
            "graphTooltip": 1,
            "refresh": "30s",
            "time": {"from": "now-6h", "to": "now"},
            "timezone": "browser",
            "links": self.links,
            "annotations": {"list": [builtin_annotation(), *self.annotations]},
            "templating": {"list": [datasource_variable(), *self.variables]},
            "panels": self.panels,
        }


# Panel shapes ------------------------------------------------------------------------------


def timeseries_options(sort_desc: bool = True) -> JSON:
    return {
        "legend": {
            "displayMode": "table",
            "placement": "right",
            "calcs": ["lastNotNull", "max"],
            "sortBy": "Last *" if sort_desc else "Name",
            "sortDesc": sort_desc,
            "showLegend": True,
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }


def bargauge_options() -> JSON:
    return {
        "displayMode": "gradient",
        "orientation": "horizontal",
        "showUnfilled": True,
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }


def stat_options() -> JSON:
    return {
        "colorMode": "background",
        "graphMode": "none",
        "justifyMode": "auto",
        "textMode": "value",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }


def table_options(sort_field: str = "Value") -> JSON:
    return {"showHeader": True, "sortBy": [{"displayName": sort_field, "desc": True}]}


TABLE_TRANSFORM = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
TIMESERIES_CUSTOM: JSON = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
THRESHOLD_LINES: JSON = TIMESERIES_CUSTOM | {"thresholdsStyle": {"mode": "line"}}
TABLE_CUSTOM: JSON = {"cellOptions": {"type": "color-text"}, "align": "auto"}


# Template variables ------------------------------------------------------------------------


def datasource_variable() -> JSON:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
    }


def query_variable(name: str, label: str, query: str) -> JSON:
    """A multi-value variable; with All it is `.*`, so `label=~"$name"` matches everything."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "current": {},
        "hide": 0,
        "refresh": 2,
        "regex": "",
        "sort": 3,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
    }


def builtin_annotation() -> JSON:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def prometheus_annotation(name: str, expr: str, color: str, text: str) -> JSON:
    return {
        "name": name,
        "datasource": DATASOURCE,
        "enable": True,
        "expr": expr,
        "iconColor": color,
        "step": "60s",
        "titleFormat": name,
        "textFormat": text,
        "useValueForTime": False,
    }


def expressions(dashboard: JSON) -> Iterator[tuple[str, str]]:
    """(panel or annotation title, PromQL) for every query a dashboard runs."""
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for a in dashboard["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation: {a['name']}", a["expr"]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable: {v['name']}", v["definition"]
