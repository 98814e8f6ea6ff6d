"""The demo's HTML report: one self-contained page (inline CSS and SVG, no script, no assets).

`write_report(out_dir, data)` writes `out_dir/report.html`. Each section says plainly when its
input is missing instead of failing, so a partial demo still leaves a readable page. The figures
are matplotlib's (the `demo` extra); each is a `<figure>` whose caption says in words what it
shows, which is also the chart's accessible description.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentinel.lab.demo.data import DemoData
from sentinel.lab.demo.readings import GOODPUT_PARTS, measured_links, natural_key, straggler_note

if TYPE_CHECKING:
    from sentinel.lab.demo.plot import Chart

CSS = """
:root { --ink:#1f2328; --muted:#57606a; --line:#d8dee4; --bg:#ffffff; --soft:#f6f8fa;
  --pass:#1a7f37; --fail:#cf222e; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin:0; background:var(--soft); color:var(--ink); line-height:1.5;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1100px; margin:0 auto; padding:24px 20px 48px; }
header.top { background:var(--bg); border:1px solid var(--line); border-radius:10px;
  padding:20px 24px; display:flex; gap:24px; align-items:center; flex-wrap:wrap; }
.verdict { font-size:34px; font-weight:800; letter-spacing:.04em; padding:6px 20px;
  border-radius:8px; color:#fff; text-transform:uppercase; }
.verdict-pass { background:var(--pass); } .verdict-fail { background:var(--fail); }
.verdict-other { background:var(--warn); }
header.top h1 { margin:0; font-size:22px; } header.top p { margin:4px 0 0; color:var(--muted); }
section { background:var(--bg); border:1px solid var(--line); border-radius:10px;
  padding:18px 24px; margin-top:18px; }
h2 { font-size:18px; margin:0 0 10px; } h3 { font-size:15px; margin:18px 0 6px; }
.lead { color:var(--muted); margin:0 0 12px; }
.scroll { overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-size:14px; }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:var(--soft); font-weight:600; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
.ok { color:var(--pass); font-weight:600; } .bad { color:var(--fail); font-weight:600; }
.na { color:var(--muted); font-style:italic; background:var(--soft); border-left:4px solid var(--line);
  padding:8px 12px; margin:8px 0; }
figure { margin:12px 0; }
svg.chart { display:block; max-width:100%; min-width:640px; height:auto; }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:13px;
  background:var(--soft); padding:2px 6px; border-radius:4px; word-break:break-all; }
.big { font-size:28px; font-weight:700; }
ul.read li { margin:4px 0; }
details summary { cursor:pointer; color:var(--muted); margin-top:8px; }
"""


def write_report(out_dir: Path, data: DemoData) -> Path:
    """Write `out_dir/report.html` (creating the directory) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.html"
    path.write_text(render_report(data), encoding="utf-8")
    return path


def render_report(data: DemoData) -> str:
    body = "\n".join(
        [
            _header(data),
            _what_happened(data.result),
            _loss(data),
            _ranks(data),
            _burnin(data.burnin),
            _timeline(data),
            _correctness(data.result),
            _goodput(data.result.get("time_account"), data.result.get("fleet_projection")),
            _how_to_read(),
        ]
    )
    title = f"Sentinel demo — {data.result.get('scenario', 'unnamed scenario')}"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        f"{body}\n</main>\n</body>\n</html>\n"
    )


# -- small HTML pieces -----------------------------------------------------------------------


def _section(ident: str, title: str, lead: str, *content: str) -> str:
    lead_html = f'<p class="lead">{esc(lead)}</p>' if lead else ""
    return f'<section id="{ident}">\n<h2>{esc(title)}</h2>\n{lead_html}\n{"".join(content)}\n</section>'


def esc(value: object) -> str:
    """Any value as HTML text or attribute content."""
    return escape(str(value), quote=True)


def _chart(draw: Callable[[], Chart]) -> str:
    """A figure with its caption. A chart keeps a legible minimum width; narrower screens
    scroll it sideways. Without matplotlib the page still says everything else."""
    try:
        made = draw()
    except ImportError as e:
        return not_available(f"this figure needs matplotlib ({e}): pip install 'sentinel[demo]'")
    return (
        f'<figure id="fig-{made.ident}"><div class="scroll">{made.svg}</div>'
        f"<figcaption>{esc(made.caption)}</figcaption></figure>"
    )


def _loss_chart(data: DemoData) -> Chart:
    from sentinel.lab.demo.figures import loss_chart

    return loss_chart(data.steps, data.reference_steps, data.result)


def _rank_chart(data: DemoData, field: str) -> Chart:
    from sentinel.lab.demo.rankmap import rank_heatmap

    finished = data.result.get("final_digest") is not None
    return rank_heatmap(
        data.ranks,
        data.generations,
        data.gpus_per_node,
        data.checkpoints,
        field,
        finished,
        data.steps,
    )


def _burnin_chart(report: dict[str, Any]) -> Chart:
    from sentinel.lab.demo.figures import burnin_heatmap

    return burnin_heatmap(report)


def _timeline_chart(data: DemoData) -> Chart:
    from sentinel.lab.demo.lanes import timeline_chart

    return timeline_chart(data.timeline, data.result)


def _goodput_chart(account: dict[str, Any]) -> Chart:
    from sentinel.lab.demo.figures import goodput_chart

    return goodput_chart(account)


def not_available(what: str) -> str:
    return f'<p class="na">Not available: {esc(what)}</p>'


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()
) -> str:
    """Cells are pre-escaped HTML; `numeric` columns are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _val(value: Any) -> str:
    return "—" if value is None or value == "" else esc(value)


def _secs(value: Any) -> str:
    return f"{float(value):.1f} s" if isinstance(value, int | float) else "—"


def _action(action: Any) -> str:
    if isinstance(action, dict):
        name = action.get("kind") or action.get("action") or action.get("name")
        target = action.get("target")
        if name:
            return f"{name} {target}" if target else str(name)
        return json.dumps(action, sort_keys=True)
    return str(action)


def _actions(actions: Any) -> str:
    items = [_action(a) for a in actions or []]
    return esc(" → ".join(items)) if items else "—"


# -- sections --------------------------------------------------------------------------------


def summary_line(data: DemoData) -> str:
    if data.summary:
        return data.summary
    r = data.result
    faults = r.get("faults") or []
    found = sum(1 for f in faults if f.get("detected"))
    false = len(r.get("false_incidents") or [])
    identical = r.get("bit_identical")
    tail = ""
    if isinstance(identical, bool):
        same = "bit-identical to" if identical else "different from"
        tail = f"; final parameters {same} the clean reference"
    return (
        f"{len(faults)} fault(s) injected, {found} detected; {false} false incident(s); "
        f"{r.get('completed_steps', '?')} steps completed{tail}."
    )


def _header(data: DemoData) -> str:
    verdict = str(data.result.get("verdict", "unknown"))
    kind = verdict.lower() if verdict.lower() in ("pass", "fail") else "other"
    return (
        '<header class="top">'
        f'<div class="verdict verdict-{kind}" id="verdict">{esc(verdict)}</div>'
        f"<div><h1>Sentinel demo · {esc(data.result.get('scenario', 'unnamed scenario'))}</h1>"
        f'<p id="summary">{esc(summary_line(data))}</p>{_problems(data.result)}</div></header>'
    )


def _problems(r: dict[str, Any]) -> str:
    """Why the drill failed, and what the demo warned before it started: on the first screen."""
    parts = []
    problems = r.get("problems") or []
    if problems:
        items = "".join(f"<li>{esc(p)}</li>" for p in problems)
        parts.append(
            f'<p class="bad"><b>Why it failed:</b></p><ul class="bad" id="problems">{items}</ul>'
        )
    settings = r.get("drill_settings") or {}
    if settings:
        hooks = ", ".join(f"{k} {v:g}" for k, v in (settings.get("hooks") or {}).items())
        parts.append(
            f'<p id="compression">Time compressed {esc(settings.get("compression"))}x for the '
            f"drill, the same for every drill: the hooks run at the shipped defaults divided by "
            f"it ({esc(hooks)}); agents sweep every {esc(settings.get('agent_interval_s'))} s, "
            "thresholds and playbooks are the shipped ones.</p>"
        )
    warnings = r.get("warnings") or []
    if warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
        parts.append(f'<p><b>Warned before the run:</b></p><ul id="warnings">{items}</ul>')
    return "".join(parts)


def _repaired(f: dict[str, Any]) -> str:
    if not f.get("detected"):
        return '<span class="bad">no</span>'
    if f.get("repaired", True):
        return '<span class="ok">yes</span>'
    return f'<span class="bad">no: {esc(f.get("repair_problem") or "")}</span>'


def _targets(f: dict[str, Any]) -> str:
    """Each time target the fault was held to, with its measured figure."""
    out = []
    for c in f.get("targets") or []:
        got = "—" if c.get("value") is None else f"{c['value']} {c.get('unit', 's')}"
        mark = '<span class="ok">met</span>' if c.get("met") else '<span class="bad">MISSED</span>'
        out.append(f"{mark} {esc(c.get('target'))} (limit {esc(c.get('limit'))}, got {esc(got)})")
    return "<br>".join(out) or "—"


def _what_happened(r: dict[str, Any]) -> str:
    faults = r.get("faults") or []
    rows = []
    for f in faults:
        found = (
            f'<span class="ok">step {_val(f.get("detected_step"))}</span>'
            if f.get("detected")
            else '<span class="bad">missed</span>'
        )
        rows.append(
            [
                _val(f.get("kind")),
                _val(f.get("target")),
                _val(f.get("injected_step")),
                found,
                _secs(f.get("time_to_detect_s")),
                _val(f.get("incident")),
                _actions(f.get("actions")),
                _secs(f.get("time_to_resume_s")),
                _repaired(f),
                _targets(f),
            ]
        )
    headers = ["Fault", "Target", "Injected at step", "Detected at step", "Time to detect"]
    headers += ["Incident", "Playbook actions", "Time to resume (after detection)"]
    headers += ["Repaired", "Time targets"]
    parts = [
        _table(headers, rows, numeric=(2, 4, 7))
        if rows
        else not_available("no faults were injected in this scenario.")
    ]
    incidents = r.get("incidents") or []
    parts.append("<h3>Incidents Sentinel opened</h3>")
    parts.append(
        _table(
            ["Incident", "Kind", "Target", "Detected at step", "Actions", "Resolution"],
            [
                [
                    _val(i.get("id")),
                    _val(i.get("kind")),
                    _val(i.get("target")),
                    _val(i.get("detected_step")),
                    _actions(i.get("actions")),
                    _val(i.get("resolution")),
                ]
                for i in incidents
            ],
            numeric=(3,),
        )
        if incidents
        else not_available("no incidents were opened.")
    )
    parts.append(_stages(incidents))
    false = r.get("false_incidents") or []
    parts.append("<h3>False incidents</h3>")
    if false:
        items = "".join(f"<li>{esc(_describe(x))}</li>" for x in false)
        parts.append(f'<ul class="bad" id="false-incidents">{items}</ul>')
    else:
        parts.append(
            '<p class="ok" id="false-incidents">None: every incident matched an injected fault.</p>'
        )
    evicted = r.get("evicted_nodes") or []
    parts.append(
        f"<p>Evicted nodes: {esc(', '.join(map(str, evicted))) if evicted else 'none'}.</p>"
    )
    parts += _returns(r.get("returns"))
    lead = (
        "One row per injected fault: where and when it struck, when Sentinel noticed, and how it "
        "was repaired. Every step is the training step in progress when the thing happened "
        "(the trainer's metrics line `step N` closes step N)."
    )
    return _section("what-happened", "What happened", lead, *parts)


def _returns(returns: dict[str, Any] | None) -> list[str]:
    """Validation before return (a scenario's `returns`): each return the operator asked for,
    whether the node's GPU was still damaged, and what the coordinator did, with the reason."""
    if returns is None:
        return []
    rows = [
        [
            _secs(a.get("asked_t")),
            "still damaged" if a.get("still_damaged") else "repaired",
            esc(a.get("outcome") or "no answer"),
            esc(a.get("reason") or ""),
            _secs(a.get("answered_t")),
        ]
        for a in returns.get("attempts", [])
    ]
    verdict = (
        '<p class="ok">Refused by validation while damaged, returned once repaired; no false'
        " return.</p>"
        if returns.get("passed")
        else f'<p class="bad">{esc(returns.get("problem"))}</p>'
    )
    head = ["asked at", "node's GPU", "outcome", "reason", "answered at"]
    return [
        f"<h3>Validation before return of {esc(returns.get('node'))}</h3>",
        _table(head, rows, numeric=(0, 4)) if rows else not_available("no return was asked."),
        verdict,
    ]


def _describe(item: Any) -> str:
    if isinstance(item, dict):
        return ", ".join(
            f"{k}: {_action(v) if isinstance(v, dict) else v}" for k, v in item.items()
        )
    return str(item)


def _loss(data: DemoData) -> str:
    lead = (
        "Each colour is one generation of the job (a restart starts a new one). Dashed, shaded "
        "parts were rolled back and trained again; the wide grey band is the clean reference run "
        "(a bit-identical run draws its line along the band's middle). "
        "Red lines mark injected faults, purple dashed lines the step an incident was detected."
    )
    if not [p for p in data.steps if p.loss == p.loss]:
        return _section("loss", "Loss curve", "", not_available("no training steps were recorded."))
    return _section(
        "loss",
        "Loss curve",
        lead,
        _chart(lambda: _loss_chart(data)),
    )


def _ranks(data: DemoData) -> str:
    if not data.ranks:
        return _section(
            "ranks",
            "Per-rank step time",
            "",
            not_available("no per-rank step times were recorded."),
        )
    lead = (
        "One row per rank in each generation of the gang, labelled with the node it actually "
        "ran on then; one column per step; brighter is slower (for MFU: lower). Hatched steps "
        "were trained, then lost to a rollback: the next generation's rows show them again. "
        "A red cell is the step each rank was in when its generation stopped (a hang or a crash "
        "never reports it). Dotted lines mark checkpoint saves: the step after a save carries "
        "its cost, which is not an incident."
    )
    parts = [_chart(lambda: _rank_chart(data, "step_s"))]
    note = straggler_note(data.ranks)
    if note:
        parts.append(f'<p id="straggler-note">{esc(note)}</p>')
    if any(s.mfu is not None for s in data.ranks):
        parts.append(_chart(lambda: _rank_chart(data, "mfu")))
    else:
        parts.append("<h3>Model FLOPs utilisation</h3>")
        parts.append(not_available("the ranks did not report MFU."))
    return _section("ranks", "Per-rank step time", lead, *parts)


def _burnin(report: dict[str, Any] | None) -> str:
    title = "Burn-in before launch"
    if not report:
        return _section("burnin", title, "", not_available("no burn-in ran before this job."))
    verdict = str(report.get("verdict", "unknown"))
    cls = "ok" if verdict == "pass" else "bad"
    parts = [
        f'<p>Burn-in verdict: <span class="{cls}">{esc(verdict)}</span>. Excluded nodes: {esc(", ".join(map(str, report.get("exclude") or [])) or "none")}.</p>'
    ]
    if measured_links(report):
        parts.append(_chart(lambda: _burnin_chart(report)))
    else:
        parts.append(not_available("the burn-in report has no measured link bandwidths."))
    nodes = report.get("nodes") or {}
    flagged = [(n, v) for n, v in nodes.items() if (v or {}).get("verdict", "pass") != "pass"]
    parts.append("<h3>Flagged nodes</h3>")
    if flagged:
        rows = [
            [
                esc(n),
                f'<span class="bad">{_val(v.get("verdict"))}</span>',
                esc("; ".join(map(str, v.get("reasons") or [])) or "—"),
            ]
            for n, v in sorted(flagged, key=lambda x: natural_key(x[0]))
        ]
        parts.append(_table(["Node", "Verdict", "Reasons"], rows))
    else:
        parts.append('<p class="ok">No node was flagged.</p>')
    extra = []
    if report.get("stragglers"):
        extra.append(f"straggler ranks {', '.join(map(str, report['stragglers']))}")
    mism = (report.get("sdc") or {}).get("mismatched_ranks") or []
    if mism:
        extra.append(f"SDC mismatch on ranks {', '.join(map(str, mism))}")
    if extra:
        parts.append(f"<p>Also found: {esc('; '.join(extra))}.</p>")
    colls = report.get("collectives") or []
    if colls:
        rows = [
            [
                _val(c.get("op")),
                _val(c.get("bytes")),
                _num(c.get("algbw_gbps")),
                _num(c.get("busbw_gbps")),
                '<span class="ok">yes</span>'
                if c.get("correct")
                else '<span class="bad">no</span>',
            ]
            for c in colls
        ]
        parts.append(
            "<details><summary>Collective bandwidth tests</summary>"
            + _table(
                ["Collective", "Bytes", "algbw GB/s", "busbw GB/s", "Correct"],
                rows,
                numeric=(1, 2, 3),
            )
            + "</details>"
        )
    lead = "Pairwise link bandwidth between nodes measured before launch. Dark cells are slow links; a red outline marks a link the burn-in failed."
    return _section("burnin", title, lead, *parts)


STAGE_HEADERS = {
    "detected": "Detected",
    "decided": "Decided",
    "drained": "Drained",
    "restart": "Restart ordered",
    "relaunched": "Relaunched",
    "rendezvoused": "Rendezvoused",
    "checkpoint_loaded": "Checkpoint loaded",
    "first_step": "First step",
}


def _stages(incidents: list[dict[str, Any]]) -> str:
    """Each relaunching repair's stages as the coordinator recorded them (seconds since the
    demo started), and its time from detection to the first step."""
    timed = [i for i in incidents if i.get("stages")]
    head = '<h3 id="repair-stages">Repair stages</h3>'
    if not incidents:
        return ""
    if not timed:
        return head + not_available("no repair relaunched the job, or none reported its launch.")
    rows = []
    for i in timed:
        at = i["stages"]
        total = (
            at["first_step"] - at["detected"] if {"first_step", "detected"} <= at.keys() else None
        )
        rows.append([_val(i.get("id")), *(_at(at.get(k)) for k in STAGE_HEADERS), _secs(total)])
    headers = ["Incident", *STAGE_HEADERS.values(), "Detection to first step"]
    lead = (
        "<p>When each stage of a repair that relaunched the job ended, as the coordinator "
        "recorded it (seconds since the demo started): its own steps, then the new gang's "
        "launch report.</p>"
    )
    return head + lead + _table(headers, rows, numeric=tuple(range(1, len(headers))))


def _at(value: Any) -> str:
    return f"{float(value):.1f}" if isinstance(value, int | float) else "—"


def _num(value: Any) -> str:
    return f"{float(value):.3g}" if isinstance(value, int | float) else "—"


def _timeline(data: DemoData) -> str:
    if not data.timeline:
        return _section(
            "timeline", "Incident timeline", "", not_available("no timeline was recorded.")
        )
    lead = (
        "Everything that happened, by time since the demo started, one lane per kind. Light bars "
        "show each fault's measured time to detect and time to resume. Labels that would overlap "
        "are left out of the chart: the table below has every entry in full, the caption every "
        "bar's time."
    )
    rows = [
        [f"{e.t:.1f} s", _val(e.step), esc(e.kind), _val(e.target), esc(e.text)]
        for e in sorted(data.timeline, key=lambda e: e.t)
    ]
    table = (
        "<details><summary>All timeline entries</summary>"
        + _table(["Time", "Step", "Kind", "Target", "What"], rows, numeric=(0, 1))
        + "</details>"
    )
    return _section(
        "timeline",
        "Incident timeline",
        lead,
        _chart(lambda: _timeline_chart(data)),
        table,
    )


def _correctness(r: dict[str, Any]) -> str:
    same = r.get("bit_identical")
    if same is None:
        return _section(
            "correctness",
            "Correctness",
            "",
            not_available("the run was not compared to a clean reference."),
        )
    verdict = (
        '<p class="big ok">Bit-identical to the clean reference</p>'
        if same
        else '<p class="big bad">Differs from the clean reference</p>'
    )
    digests = (
        f"<p>Final parameters digest: <code>{_val(r.get('final_digest'))}</code><br>"
        f"Clean reference digest: <code>{_val(r.get('reference_digest'))}</code></p>"
    )
    lead = "The demo trains the same model once more without faults (same configuration, same skipped batches) and compares the final parameters bit for bit."
    return _section("correctness", "Correctness", lead, verdict, digests)


def _goodput(account: dict[str, Any] | None, projection: dict[str, Any] | None) -> str:
    title = "Goodput"
    if not _accounted(account) and not projection:
        return _section(
            "goodput", title, "", not_available("time accounting was not recorded for this run.")
        )
    lead = (
        "The run's wall time, every second in one category: productive steps, steps lost to "
        "rollback, detection (standing still before a fault was found), repair (stop, "
        "relaunch, rendezvous, checkpoint load, build), checkpoint stalls, burn-in and start-up. "
        "The effective training time ratio is the productive share."
    )
    return _section("goodput", title, lead, _run_account(account), _fleet_projection(projection))


def _accounted(account: dict[str, Any] | None) -> bool:
    seconds = (account or {}).get("seconds") or {}
    return any(isinstance(v, int | float) and v > 0 for v in seconds.values())


def _run_account(account: dict[str, Any] | None) -> str:
    if account is None or not _accounted(account):
        return not_available("time accounting was not recorded for this run.")
    ratio = account.get("effective_ratio")
    shown = f"{100 * ratio:.1f}%" if isinstance(ratio, int | float) else "—"
    big = f'<p>Effective training time ratio: <span class="big" id="goodput-ratio">{esc(shown)}</span> of {_secs(account.get("wall_s"))}</p>'
    seconds = account["seconds"]
    rows = [[esc(label), _secs(seconds.get(key))] for key, label, _c in GOODPUT_PARTS]
    stages = account.get("repair_stages_s") or {}
    rows += [[esc(f"repair: {name.replace('_', ' ')}"), _secs(v)] for name, v in stages.items()]
    table = _table(["Category", "Seconds"], rows, numeric=(1,))
    return big + _chart(lambda: _goodput_chart(account)) + table


def _fleet_projection(projection: dict[str, Any] | None) -> str:
    """This drill's times on the reference fleet (`sentinel.lab.goodput.drill_projection`): the
    baseline turned into Sentinel one lever at a time, each row's gain over the row above."""
    heading = "<h3>At fleet scale: where the gain comes from</h3>"
    if not projection or not projection.get("decomposition"):
        return heading + not_available("the fleet projection was not recorded for this run.")
    p, rows = projection, projection["decomposition"]
    timed = ", ".join(p.get("drill_classes") or []) or "none: every time is the measurements'"
    lead = (
        f"The failures of {p['trace']} on {p['gpus']:,} GPUs for {p['days']:g} days (mean of "
        f"{p['runs']} seeded runs), with this drill's detection and resume times where it timed "
        f"a fault class ({timed}) and {p['measurements']} for the rest. From the baseline "
        "without Sentinel, one lever turned at a time on the same failures: each row is a "
        "full simulation, its gain what it adds to the row above; the last row is Sentinel's "
        "projection."
    )
    cells = [[esc(f"baseline (no Sentinel): {rows[0]['change']}"), _pct(rows[0]["ratio_mean"]), ""]]
    cells += [
        [esc(f"+ {r['lever']}: {r['change']}"), _pct(r["ratio_mean"]), _points(r["gain"])]
        for r in rows[1:]
    ]
    total = sum(r["gain"] for r in rows)
    cells.append(["<b>= Sentinel</b>", _pct(rows[-1]["ratio_mean"]), _points(total)])
    table = _table(["Step", "Effective training time", "Gain"], cells, numeric=(1, 2))
    command = f"<p>The same from the command line: <code>{esc(p['command'])}</code></p>"
    return f'{heading}<div id="goodput-decomposition"><p class="lead">{esc(lead)}</p>{table}{command}</div>'


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.2f}%"


def _points(gain: float) -> str:
    return f"{100 * gain:+.2f} points"


def _how_to_read() -> str:
    items = [
        "<b>Verdict</b>: pass when every injected fault was detected on the right node or rank and repaired (its playbook finished, training resumed, and the faulty hardware no longer trains), met its time targets, training finished, and there were no false incidents. A failed drill lists why at the top.",
        "<b>What happened</b>: the drill's own account of each fault next to what Sentinel saw. “Missed” in red means a fault went undetected.",
        "<b>Loss curve</b>: a healthy repair looks like a dashed stretch (the rolled-back steps) followed by a new colour retracing it and landing back on the grey reference line.",
        "<b>Per-rank step time</b>: compare rows within a generation; a uniformly brighter row is a straggler, a red cell where a generation's rows stop is a hang or crash, hatching marks work lost to a rollback.",
        "<b>Burn-in</b>: a slow node shows as a dark row and column; its links are outlined in red.",
        "<b>Timeline</b>: read left to right, fault → detection → actions → resume; the gaps are the time to detect and the time to repair.",
        "<b>Correctness</b>: identical digests mean the repaired run ended exactly where a run that never failed would have.",
        "Each figure's caption says in words what it shows. This page is self-contained: no script, no network.",
    ]
    return _section(
        "how-to-read",
        "How to read this page",
        "",
        '<ul class="read">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>",
    )
