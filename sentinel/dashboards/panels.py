"""Grafana dashboards as data: a dashboard is a `Spec`, its panels one `Panel` row each in a
table, and `render` turns a spec into dashboard JSON (schemaVersion 39).

Why a table of our own rather than grafana-foundation-sdk: the SDK's Python builders are method
chains, a dozen calls per panel, so a dashboard reads as code again; its package is generated per
Grafana release and pins its schema to it. Here a panel is one row a reviewer reads at a glance
(kind, title, description, queries, unit, thresholds, size), the shared shapes (legend tables,
stat colouring, table transforms) are the kind's defaults below, and the output is plain JSON
that any Grafana imports, checked by the tests against a real Prometheus.

Every panel gets a unit and thresholds; every query goes through one `${datasource}` variable so
a dashboard imports into any Grafana. Panels are laid out left to right, 24 columns wide, and a
`Row` starts a new band. The output is plain dicts, written sorted, so it is reproducible.
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
BLUE: Steps = ((None, "blue"),)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass(frozen=True)
class Row:
    """Starts a new band of panels under a title."""

    title: str


@dataclass(frozen=True)
class Panel:
    """One panel. `options`, `custom` and `transformations` left as None take the kind's
    defaults (KIND_DEFAULTS); an empty value means none."""

    kind: str
    title: str
    description: str
    queries: Sequence[Query]
    unit: str = "none"
    steps: Steps = NEUTRAL
    w: int = 12
    h: int = 8
    options: JSON | None = None
    custom: JSON | None = None
    transformations: list[JSON] | None = None
    mappings: list[JSON] = field(default_factory=list)
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Spec:
    uid: str
    title: str
    description: str
    tags: list[str]
    panels: Sequence[Row | Panel]
    variables: list[JSON] = field(default_factory=list)
    annotations: list[JSON] = field(default_factory=list)


# Shared panel shapes -------------------------------------------------------------------------


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


REDUCE_LAST: JSON = {"calcs": ["lastNotNull"], "fields": "", "values": False}
BARGAUGE: JSON = {
    "displayMode": "gradient",
    "orientation": "horizontal",
    "showUnfilled": True,
    "reduceOptions": REDUCE_LAST,
}
STAT: JSON = {
    "colorMode": "background",
    "graphMode": "none",
    "justifyMode": "auto",
    "textMode": "value",
    "reduceOptions": REDUCE_LAST,
}


def table_options(sort_field: str = "Value") -> JSON:
    return {"showHeader": True, "sortBy": [{"displayName": sort_field, "desc": True}]}


TABLE_TRANSFORM = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
TIMESERIES_CUSTOM: JSON = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
THRESHOLD_LINES: JSON = TIMESERIES_CUSTOM | {"thresholdsStyle": {"mode": "line"}}
STACKED: JSON = TIMESERIES_CUSTOM | {"stacking": {"mode": "normal", "group": "A"}}
BARS: JSON = TIMESERIES_CUSTOM | {"drawStyle": "bars", "fillOpacity": 80}
TABLE_CUSTOM: JSON = {"cellOptions": {"type": "color-text"}, "align": "auto"}

# kind -> (options, custom, transformations) a panel of that kind gets unless it says otherwise.
KIND_DEFAULTS: dict[str, tuple[JSON, JSON, list[JSON]]] = {
    "stat": (STAT, {}, []),
    "timeseries": (timeseries_options(), TIMESERIES_CUSTOM, []),
    "table": (table_options(), TABLE_CUSTOM, TABLE_TRANSFORM),
    "bargauge": (BARGAUGE, {}, []),
}


def value_mappings(mapping: dict[int, tuple[str, str]]) -> list[JSON]:
    """Numbers shown as words (0 → healthy); each with its color."""
    options = {
        str(k): {"index": i, "text": text, "color": color}
        for i, (k, (text, color)) in enumerate(sorted(mapping.items()))
    }
    return [{"type": "value", "options": options}]


# Rendering ---------------------------------------------------------------------------------


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


def render_row(row: Row, layout: Layout) -> JSON:
    pos = layout.new_row()
    return {
        "type": "row",
        "id": layout.take_id(),
        "title": row.title,
        "collapsed": False,
        "gridPos": pos,
        "panels": [],
    }


def render_panel(p: Panel, layout: Layout) -> JSON:
    options, custom, transformations = KIND_DEFAULTS.get(p.kind, ({}, {}, []))
    custom = custom if p.custom is None else p.custom
    transformations = transformations if p.transformations is None else p.transformations
    defaults: JSON = {"unit": p.unit, "thresholds": thresholds(p.steps), "mappings": p.mappings}
    defaults |= {"custom": custom} if custom else {}
    defaults |= {k: v for k, v in (("min", p.min), ("max", p.max)) if v is not None}
    panel: JSON = {
        "type": p.kind,
        "id": layout.take_id(),
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": layout.place(p.w, p.h),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options if p.options is None else p.options,
        "targets": targets(p.queries),
    }
    return panel | ({"transformations": transformations} if transformations else {})


def render(spec: Spec) -> JSON:
    layout = Layout()
    panels = [
        render_row(p, layout) if isinstance(p, Row) else render_panel(p, layout)
        for p in spec.panels
    ]
    return {
        "uid": spec.uid,
        "title": spec.title,
        "description": spec.description,
        "tags": sorted(spec.tags),
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "links": [],
        "annotations": {"list": [builtin_annotation(), *spec.annotations]},
        "templating": {"list": [datasource_variable(), *spec.variables]},
        "panels": panels,
    }


# Template variables and annotations --------------------------------------------------------


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
