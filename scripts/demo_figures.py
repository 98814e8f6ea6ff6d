"""The scenario table of docs/demo.md, generated from one results file per shipped scenario.

    python scripts/demo_figures.py run [SCENARIO ...]   # run each drill as shipped; keep its file
    python scripts/demo_figures.py table [--check]      # write the table; --check: fail if stale

`run` runs `python -m sentinel demo --scenario NAME` (the shipped scenario at full length, the
shipped settings) one scenario after the other, and keeps what the table shows in
docs/figures/demo/NAME.json with the date, the commit and the load average before and after.
`table` renders the table between the markers in docs/demo.md from those files alone;
tests/test_docs.py fails when the page and the files disagree, so a figure in the table is
always one a command wrote.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures" / "demo"
PAGE = ROOT / "docs" / "demo.md"
RUNS = ("sentinel", "trainer_hooks", "scenarios", "playbooks", "pyproject.toml")
START, END = "<!-- demo-figures:start -->", "<!-- demo-figures:end -->"
TIMES, DASH = "\u00d7", "\u2013"  # as the page writes them: 2\u00d72, 0.9\u20131.2
HEADER = [
    "| scenario | fleet, parallelism, steps | faults (path) | detect | resume | verdict, run | "
    "measured |",
    "|---|---|---|---|---|---|---|",
]


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD")
    # "-dirty" when what a drill runs differs from the commit (the page being edited does not)
    changed = git("status", "--porcelain", "--", *RUNS)
    return sha + ("-dirty" if changed else "")


def _fleet(scenario: Any) -> str:
    f, t = scenario.fleet, scenario.trainer
    parallel = f" {TIMES} ".join(
        f"{k.upper()}{v}" for k, v in (("tp", t.tp), ("pp", t.pp), ("dp", t.dp))
    )
    replicas = f", {t.dp} replicas (torchft)" if scenario.runs_replicas else ""
    return f"{f.nodes}{TIMES}{f.gpus_per_node} +{f.spares}, {parallel}{replicas}, {t.steps} steps"


def figures_of(name: str, result: dict[str, Any], load: tuple[float, float]) -> dict[str, Any]:
    """What the table shows of one drill's result.json, with where and when it was measured."""
    from sentinel.scenario import load_scenario

    faults = [
        {
            "kind": f["kind"],
            "target": f["target"],
            "detected": f["detected"],
            "detect_s": f.get("time_to_detect_s"),
            "resume_s": f.get("time_to_resume_s"),
            "path": f.get("repair_path"),
        }
        for f in result["faults"]
    ]
    return {
        "scenario": name,
        "command": f"python -m sentinel demo --scenario {name}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "load_average": {"before": load[0], "after": load[1]},
        "fleet": _fleet(load_scenario(name)),
        "verdict": result["verdict"],
        "run_wall_s": result["time_account"]["wall_s"],
        "faults": faults,
        "false_incidents": len(result.get("false_incidents") or []),
        "ledger_exact": result.get("ledger_exact"),
        "bit_identical": result.get("bit_identical"),
    }


def run(names: list[str]) -> int:
    from sentinel.scenario import shipped_scenarios

    FIGURES.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names or shipped_scenarios():
        with tempfile.TemporaryDirectory(prefix=f"figures-{name}-") as tmp:
            out = Path(tmp)
            before = os.getloadavg()[0]
            argv = [sys.executable, "-m", "sentinel", "demo", "--scenario", name]
            argv += ["--out", str(out / "run"), "--json", str(out / "result.json")]
            t0 = time.monotonic()
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            after = os.getloadavg()[0]
            if not (out / "result.json").exists():
                print(f"{name}: no result (exit {done.returncode}): {done.stderr[-400:]}")
                failed += 1
                continue
            result = json.loads((out / "result.json").read_text())
        doc = figures_of(name, result, (round(before, 2), round(after, 2)))
        (FIGURES / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{name}: {doc['verdict']} in {time.monotonic() - t0:.0f} s (load {before:.1f})")
        failed += doc["verdict"] != "pass"
    return 1 if failed else 0


def _seconds(values: list[float | None]) -> str:
    shown = [f"{v:g} s" if v is not None else DASH for v in values]
    return " / ".join(shown) if shown else DASH


def row(doc: dict[str, Any]) -> str:
    faults = doc["faults"]
    kinds = (
        ", ".join(f"{f['kind']} ({f['path']})" if f["path"] else f["kind"] for f in faults)
        or "none"
    )
    verdict = doc["verdict"].upper()
    if doc["false_incidents"]:
        verdict += f", {doc['false_incidents']} false incident(s)"
    if doc["ledger_exact"]:
        verdict += ", ledger exact"
    if doc["bit_identical"]:
        verdict += ", bit-identical"
    load = doc["load_average"]
    measured = (
        f"{doc['date'][:10]}, {doc['commit']}, load {load['before']:g}{DASH}{load['after']:g}"
    )
    cells = [
        f"`{doc['scenario']}`",
        doc["fleet"],
        kinds,
        _seconds([f["detect_s"] for f in faults if f["detected"]]),
        _seconds([f["resume_s"] for f in faults if f["resume_s"] is not None]),
        f"{verdict}; {doc['run_wall_s']:.0f} s",
        measured,
    ]
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    docs = [json.loads(p.read_text()) for p in sorted(FIGURES.glob("*.json"))]
    return "\n".join([*HEADER, *(row(d) for d in docs)])


def render(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run drills and keep their figures")
    r.add_argument("scenarios", nargs="*", help="shipped scenario names (default: all)")
    t = sub.add_parser("table", help="write the table into docs/demo.md")
    t.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    ns = p.parse_args(argv)
    if ns.cmd == "run":
        return run(ns.scenarios)
    page = PAGE.read_text()
    fresh = render(page)
    if ns.check:
        if fresh != page:
            print("docs/demo.md's scenario table differs from docs/figures/demo/*.json")
            return 1
        return 0
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
