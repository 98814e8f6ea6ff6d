"""One fault schedule repaired three ways, side by side: checkpoint restart, warm restart, live.

The schedule (`SCHEDULE`, written to OUT/schedule.yaml): three data-parallel replicas of TP2
(3 nodes x 2 GPUs, dp 3, 3 spares, the demo's tiny model), 210 steps, a checkpoint every 20,
and three node faults whose GPU stops answering (`stalls: true`: the rank on it blocks in its
step, so its peers learn of it only in a collective that never completes, unless Sentinel ends
the rank first): a double-bit ECC error on node-1 at step 50, XID 79 (fallen off the bus) on
node-2 at step 110, another ECC error on node-0 at step 170. Each way is one
`sentinel demo --scenario OUT/schedule.yaml --recovery WAY --out OUT/WAY` run (a subprocess,
one after the other; its output in OUT/WAY.log):

- `restart`: today's checkpoint restart, every rank a new process (`--ranks cold`);
- `warm_restart`: every rank stops, surviving rank processes stay alive and reload in process;
- `live`: only the struck replica leaves, the others keep stepping, a warm spare heals from a
  live peer;
- `live_no_detection`: the live path with Sentinel's detection off (the coordinator in shadow
  mode, SENTINEL_COORDINATOR__DRY_RUN=true: its playbooks only count what they would do), so
  nothing ends the struck replica and nobody swaps a spare in: the survivors see the fault
  only when their cross-replica collective times out (the trainer's shipped `--ft-timeout`,
  30 s) and the lighthouse leaves the stuck replica, which still heartbeats, out after its
  join timeout (5 s), as with torchft on its own. torchft's lighthouse forms a quorum only of
  more than half of the replicas that heartbeat, and a stuck replica still does: once half of
  them are stuck, no quorum forms and training stops for good (the demo gives up after its
  no-progress limit). The demo's verdict for it is FAIL (faults not repaired); that is the
  point, not an error.

Per way, from its result.json and its step lines (the trainer's metrics.jsonl, followed while
the run goes: a replica's line carries its commit time, a gang's line is stamped when it
appears, within 0.1 s):
- steps completed against seconds since the first committed step (a table, and
  OUT/recovery.png: one line per way, each fault's strike marked);
- `wall_s`: the training wall time, from the first committed step to the last; `steps`: the
  steps completed;
- `stall_s` (one per repair, result.json's `survivor_stall_s`: no step committed, from the last
  step before the repair to the first after it); for `live_no_detection`, which has no repair,
  per fault from the step lines: the longest time between two committed steps from its strike
  (the commit of its `at_step`: the struck rank blocks in the next step) until the next
  fault's, null when no step committed after it (`stall_s_lines` is that measure for every way);
- `join_s` (per repair: the command to the first step at full width), `checkpoint_reads` and
  `survivors_restarted` (totals over the repairs), `ledger_exact`, `final_loss`.
Then the difference per fault between the survivors' stall without detection and with it:
Sentinel's contribution.

    python benchmarks/recovery.py [--out DIR] [--ways restart,warm_restart,live,live_no_detection]

About 15 minutes on the shared 2-core machine (the clean reference runs are cached after
the first). Exit 0 when every way ran to a result (a missed
target is reported, not an exit code), 1 when one did not. Last line: JSON, one object per way
under its name, with the load average over the run; `sentinel goodput --recovery-bench FILE`
reads the live way's stall and join from it.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.lab.sim.inject import MetricsTail, Polling  # noqa: E402
from sentinel.lighthouse import SETTINGS as LIGHTHOUSE  # noqa: E402
from sentinel.scenario import Scenario  # noqa: E402
from trainer_hooks.reference.config import FT_TIMEOUT_ENV, FT_TIMEOUT_S  # noqa: E402

WAYS = ("restart", "warm_restart", "live", "live_no_detection")
SHADOW = "live_no_detection"  # the live path with the coordinator in shadow mode
# The targets for the live path (docs/recovery.md).
LIVE_STALL_S, LIVE_JOIN_S = 5.0, 15.0
RUN_LIMIT_S = 3600.0  # a way's whole run, its clean reference run included

SCHEDULE: dict[str, Any] = {
    "description": (
        "benchmarks/recovery.py's schedule: three replicas of TP2, three node faults whose GPU "
        "stops answering (its rank blocks in its step), each in another replica, 60 steps apart."
    ),
    "fleet": {"nodes": 3, "gpus_per_node": 2, "spares": 3},
    "trainer": {"tp": 2, "pp": 1, "dp": 3, "steps": 210, "checkpoint_every": 20, "seed": 7},
    "faults": [
        {"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 50, "stalls": True},
        {"kind": "xid", "node": "node-2", "gpu": 1, "xid": 79, "at_step": 110, "stalls": True},
        {"kind": "ecc_dbe", "node": "node-0", "gpu": 1, "at_step": 170, "stalls": True},
    ],
}


@dataclass(frozen=True)
class Commit:
    """A committed step: `t` seconds since its way's run started."""

    t: float
    step: int


def fault_label(fault: dict[str, Any]) -> str:
    kind = f"xid {fault['xid']}" if fault["kind"] == "xid" else fault["kind"]
    return f"{kind} {fault['node']} gpu {fault['gpu']} @{fault['at_step']}"


def strike_times(commits: Sequence[Commit], at_steps: Sequence[int]) -> list[float | None]:
    """When each fault struck: the first commit of its `at_step` (the struck rank blocks in
    the step after it); None for a fault the run never reached."""
    return [next((c.t for c in commits if c.step == at), None) for at in at_steps]


def stalls_after(commits: Sequence[Commit], strikes: Sequence[float | None]) -> list[float | None]:
    """Per fault, the longest time between two consecutive committed steps from its strike
    until the next fault's (or the run's end): how long the survivors waited. None when the run
    never reached the fault or no step committed after it."""
    times = sorted(c.t for c in commits)
    out: list[float | None] = []
    for i, struck in enumerate(strikes):
        end = min((s for s in strikes[i + 1 :] if s is not None), default=float("inf"))
        gaps = [
            b - a
            for a, b in itertools.pairwise(times)
            if struck is not None and b > struck and a < end
        ]
        out.append(round(max(gaps), 2) if gaps else None)
    return out


def step_at(commits: Sequence[Commit], t: float) -> int | None:
    """The step last committed at `t` (a rollback's replay shows as the step going back)."""
    done = [c for c in commits if c.t <= t]
    return max(done, key=lambda c: c.t).step if done else None


def since_first(commits: Sequence[Commit]) -> list[Commit]:
    """The commits in time order, `t` from the first committed step (training started)."""
    ordered = sorted(commits, key=lambda c: c.t)
    return [Commit(c.t - ordered[0].t, c.step) for c in ordered]


def _range(values: Sequence[float]) -> list[float]:
    """[lowest, highest] of the 1-minute load average samples ([] when none were taken)."""
    return [round(min(values), 2), round(max(values), 2)] if values else []


def _max(values: Sequence[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def way_figures(
    way: str,
    result: dict[str, Any] | None,
    commits: Sequence[Commit],
    faults: Sequence[dict[str, Any]],
    ended_s: float | None = None,
) -> dict[str, Any]:
    """One way's figures for the JSON line (the module's docstring says what each means); the
    per-fault lists follow the schedule's faults, a fault's repairs found by its incident.
    `ended_s`: when the run ended, on the commits' clock; a run that stopped short says how long
    it went on without a step (`idle_at_end_s`)."""
    result = result or {}
    timeline = since_first(commits)
    strikes = strike_times(timeline, [f["at_step"] for f in faults])
    lines = stalls_after(timeline, strikes)
    repairs = list(result.get("repairs") or [])
    entries = [*(result.get("faults") or []), *[{}] * len(faults)][: len(faults)]
    incidents = [e.get("incident") for e in entries]
    mine = [[r for r in repairs if i is not None and r.get("incident") == i] for i in incidents]
    stall = (
        lines if way == SHADOW else [_max([r.get("survivor_stall_s") for r in rs]) for rs in mine]
    )
    join = [_max([r.get("join_s") for r in rs]) for rs in mine]
    steps = int(result.get("completed_steps") or max((c.step for c in commits), default=0))
    finished = steps >= int(SCHEDULE["trainer"]["steps"])
    idle = ended_s - max(c.t for c in commits) if ended_s and commits and not finished else None
    return {
        "wall_s": round(timeline[-1].t, 2) if timeline else 0.0,
        "steps": steps,
        "finished": finished,
        "idle_at_end_s": None if idle is None else round(idle, 1),
        "stall_s_max": _max(
            stall if way == SHADOW else [r.get("survivor_stall_s") for r in repairs]
        ),
        "join_s_max": _max([r.get("join_s") for r in repairs]),
        "checkpoint_reads": sum(int(r.get("checkpoint_reads") or 0) for r in repairs),
        "survivors_restarted": sum(int(r.get("survivors_restarted") or 0) for r in repairs),
        "ledger_exact": bool(result.get("ledger_exact")),
        "tokens": result.get("tokens"),  # expected, consumed, duplicated, skipped
        "final_loss": result.get("final_loss"),
        "reference_final_loss": result.get("reference_final_loss"),
        "stall_s": stall,
        "join_s": join,
        "stall_s_lines": lines,
        "strike_s": [None if s is None else round(s, 2) for s in strikes],
        "detect_s": [e.get("time_to_detect_s") for e in entries],
        "paths": [rs[0].get("path") if rs else None for rs in mine],
        "repairs": len(repairs),
        "verdict": result.get("verdict"),
        "problems": list(result.get("problems") or []),
    }


def live_misses(live: dict[str, Any]) -> list[str]:
    """The live way's figures against the issue's targets."""
    out = []
    if live["stall_s_max"] is None or live["stall_s_max"] > LIVE_STALL_S:
        out.append(f"survivors' stall {live['stall_s_max']} s (target <= {LIVE_STALL_S:g} s)")
    if live["join_s_max"] is None or live["join_s_max"] > LIVE_JOIN_S:
        out.append(f"spare join {live['join_s_max']} s (target <= {LIVE_JOIN_S:g} s)")
    if live["survivors_restarted"]:
        out.append(f"{live['survivors_restarted']} survivor processes restarted (target 0)")
    if live["checkpoint_reads"]:
        out.append(f"{live['checkpoint_reads']} checkpoint reads (target 0)")
    if not live["ledger_exact"]:
        out.append("the token ledger is not exact")
    return out


def contribution(
    with_detection: Sequence[float | None], without: Sequence[float | None]
) -> list[float | None]:
    """Per fault, the survivors' stall without Sentinel's detection minus with it; None where
    either run has no figure (the run without detection never resumed, or never got there)."""
    return [
        None if a is None or b is None else round(b - a, 2)
        for a, b in zip(with_detection, without, strict=False)
    ]


def summary(
    figures: dict[str, dict[str, Any]], load: Sequence[float], ft_timeout_s: float
) -> dict[str, Any]:
    """The last line: one object per way, the load average's range over the run, the date."""
    out: dict[str, Any] = dict(figures)
    if "live" in figures:
        out["live_targets_missed"] = live_misses(figures["live"])
    if "live" in figures and SHADOW in figures:
        out["detection_saves_s"] = contribution(
            figures["live"]["stall_s"], figures[SHADOW]["stall_s"]
        )
    return out | {
        "schedule": SCHEDULE,
        "ft_timeout_s": ft_timeout_s,
        "lighthouse_join_timeout_s": LIGHTHOUSE["join_timeout_ms"] / 1000,
        "load_avg": _range(load),
        "date": datetime.date.today().isoformat(),
    }


# --- printing ---------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in header], *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def progress_rows(
    timelines: dict[str, list[Commit]], rows: int = 14
) -> tuple[list[str], list[list[object]]]:
    """Steps completed against seconds since each way's first step, every few seconds."""
    span = max((tl[-1].t for tl in timelines.values() if tl), default=0.0)
    every = next((s for s in (5, 10, 15, 20, 30, 60, 120, 300) if span / s <= rows), 600)
    header = ["seconds", *timelines]
    out: list[list[object]] = []
    t = 0.0
    while True:
        out.append([f"{t:g}", *(step_at(tl, t) for tl in timelines.values())])
        if t >= span:
            return header, out
        t += every


def fault_rows(
    figures: dict[str, dict[str, Any]], faults: Sequence[dict[str, Any]]
) -> list[list[object]]:
    rows: list[list[object]] = []
    for way, f in figures.items():
        for i, fault in enumerate(faults):
            rows.append(
                [
                    way,
                    fault_label(fault),
                    f["detect_s"][i],
                    f["stall_s"][i],
                    f["stall_s_lines"][i],
                    f["join_s"][i],
                    f["paths"][i],
                ]
            )
    return rows


def way_rows(figures: dict[str, dict[str, Any]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for way, f in figures.items():
        loss = f["final_loss"]
        rows.append(
            [
                way,
                f["wall_s"],
                f["steps"],
                f["stall_s_max"],
                f["join_s_max"],
                f["checkpoint_reads"],
                f["survivors_restarted"],
                "exact" if f["ledger_exact"] else "NOT EXACT",
                None if loss is None else f"{loss:.6f}",
                f["verdict"],
                "-".join(f"{x:g}" for x in f.get("load_avg", [])),
            ]
        )
    return rows


WAY_HEADER = [
    "way",
    "wall_s",
    "steps",
    "stall_max_s",
    "join_max_s",
    "ckpt_reads",
    "survivors_restarted",
    "ledger",
    "final_loss",
    "demo",
    "load",
]
FAULT_HEADER = ["way", "fault", "detect_s", "stall_s", "stall_lines_s", "join_s", "path"]


def plot(
    timelines: dict[str, list[Commit]],
    strikes: dict[str, list[float | None]],
    at_steps: Sequence[int],
    stopped: set[str],
    path: Path,
) -> None:
    """Step against seconds since the first step, one line per way, each strike marked; a way
    in `stopped` did not finish, and says where it stopped."""
    import matplotlib

    from sentinel.lab.demo.plot import INK, PALETTE, STYLE, new_figure

    with matplotlib.rc_context(STYLE):
        fig = new_figure(8.0, 4.5)
        ax = fig.add_subplot()
        for i, (way, tl) in enumerate(timelines.items()):
            colour = PALETTE[i % len(PALETTE)]
            ax.plot(
                [c.t for c in tl],
                [c.step for c in tl],
                color=colour,
                label=way,
                linewidth=1.4,
                drawstyle="steps-post",
            )
            hits = [(t, at) for t, at in zip(strikes[way], at_steps, strict=True) if t is not None]
            ax.plot(
                [t for t, _ in hits],
                [at for _, at in hits],
                linestyle="none",
                marker="x",
                markersize=8,
                markeredgewidth=2,
                color=colour,
            )
            if way in stopped and tl:
                ax.annotate(
                    f"stopped at step {tl[-1].step}",
                    (tl[-1].t, tl[-1].step),
                    xytext=(6, -12),
                    textcoords="offset points",
                    color=colour,
                )
        ax.plot([], [], linestyle="none", marker="x", color=INK, label="fault strikes")
        ax.set_xlabel("seconds since the first committed step")
        ax.set_ylabel("step")
        ax.set_title("One fault schedule, three ways to repair it")
        ax.grid(True, axis="y")
        ax.legend(loc="lower right")
        fig.savefig(path, format="png", dpi=150)


# --- running ----------------------------------------------------------------------------------


class Follow(Polling):
    """Follows a way's metrics file while it runs, and samples the load average."""

    def __init__(self, metrics: Path, t0: float) -> None:
        super().__init__("recovery-follow", 0.1, join_s=10)
        self.tail = MetricsTail(metrics, t0)
        self.commits: list[Commit] = []
        self.load: list[float] = []
        self._sampled = 0.0

    def tick(self) -> None:
        self.commits += [Commit(line.t, line.step) for line in self.tail.poll()]
        if time.monotonic() - self._sampled >= 5.0:
            self._sampled = time.monotonic()
            self.load.append(os.getloadavg()[0])


@dataclass
class WayRun:
    way: str
    exit_code: int
    elapsed_s: float
    result: dict[str, Any] | None
    commits: list[Commit] = field(default_factory=list)
    load: list[float] = field(default_factory=list)


def run_way(way: str, schedule: Path, out: Path) -> WayRun:
    """`sentinel demo` on the schedule for one way, its step lines followed as it trains."""
    run_dir = out / way
    argv = [
        sys.executable,
        "-m",
        "sentinel",
        "demo",
        "--scenario",
        str(schedule),
        "--recovery",
        "live" if way == SHADOW else way,
        "--out",
        str(run_dir),
    ]
    env = dict(os.environ)
    if way == SHADOW:
        env["SENTINEL_COORDINATOR__DRY_RUN"] = "true"
    t0 = time.time()
    follow = Follow(run_dir / "run" / "metrics.jsonl", t0)
    follow.start()
    with (out / f"{way}.log").open("w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            code = proc.wait(timeout=RUN_LIMIT_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.send_signal(signal.SIGTERM)  # the demo unwinds and stops what it started
            code = proc.wait(timeout=120)
    follow.stop()
    if follow.error is not None:
        raise follow.error
    # The step lines as followed (seconds since the run started, step): kept beside the run.
    rows = [[round(c.t, 3), c.step] for c in follow.commits]
    (out / f"{way}.commits.json").write_text(json.dumps(rows) + "\n")
    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return WayRun(way, code, time.time() - t0, result, follow.commits, follow.load)


def report(runs: dict[str, WayRun], out: Path, ft_timeout_s: float) -> dict[str, Any]:
    faults = SCHEDULE["faults"]
    at_steps = [f["at_step"] for f in faults]
    figures = {
        w: way_figures(w, r.result, r.commits, faults, r.elapsed_s) | {"load_avg": _range(r.load)}
        for w, r in runs.items()
    }
    timelines = {w: since_first(r.commits) for w, r in runs.items()}
    header, rows = progress_rows(timelines)
    print("\nsteps completed against seconds since each way's first committed step")
    print("\n".join(table(header, rows)))
    print(
        "\nper fault (seconds; stall_s: result.json's repair, stall_lines_s: from the step lines)"
    )
    print("\n".join(table(FAULT_HEADER, fault_rows(figures, faults))))
    print("\nper way")
    print("\n".join(table(WAY_HEADER, way_rows(figures))))
    load = [x for r in runs.values() for x in r.load]
    line = summary(figures, load, ft_timeout_s)
    if "detection_saves_s" in line:
        saved = ", ".join("-" if s is None else f"{s:g} s" for s in line["detection_saves_s"])
        print(
            f"\nSentinel's detection: survivors' stall without it minus with it, per fault: {saved}"
        )
        off = figures[SHADOW]
        print(
            f"  ({SHADOW}: stalls {off['stall_s']}, {off['steps']} of "
            f"{SCHEDULE['trainer']['steps']} steps; torchft timeout {ft_timeout_s:g} s)"
        )
        if not off["finished"]:
            print(
                f"  {SHADOW} stopped at step {off['steps']}: no step committed in the run's last "
                f"{off['idle_at_end_s']} s"
            )
    for miss in line.get("live_targets_missed", []):
        print(f"live: target missed: {miss}")
    try:
        strikes = {w: strike_times(tl, at_steps) for w, tl in timelines.items()}
        stopped = {w for w, f in figures.items() if not f["finished"]}
        plot(timelines, strikes, at_steps, stopped, out / "recovery.png")
        print(f"plot: {out / 'recovery.png'}")
    except ImportError as e:  # matplotlib is the `demo` extra
        print(f"no plot: {e}")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / f"recovery-{stamp}")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"a subset of {', '.join(WAYS)}")
    args = ap.parse_args(argv)
    ways = args.ways.split(",")
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        ap.error(f"no way named {', '.join(unknown)}; there are: {', '.join(WAYS)}")
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"--out {args.out} is not empty")
    args.out.mkdir(parents=True, exist_ok=True)
    schedule = args.out / "schedule.yaml"
    Scenario.model_validate(SCHEDULE)  # a bad schedule fails here, not four runs later
    schedule.write_text(yaml.safe_dump(SCHEDULE, sort_keys=False))
    # The trainer's shipped torchft timeout; torchft's own variable, set here, reaches the ranks
    # and wins (as it does inside torchft's Manager).
    ft_timeout_s = float(os.environ.get(FT_TIMEOUT_ENV["timeout"], FT_TIMEOUT_S))
    print(
        f"schedule {schedule}; torchft timeout {ft_timeout_s:g} s; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: dict[str, WayRun] = {}
    for way in ways:
        run = run_way(way, schedule, args.out)
        runs[way] = run
        verdict = (run.result or {}).get("verdict", "no result")
        print(
            f"{way}: {len(run.commits)} step lines, demo {verdict} (exit {run.exit_code}) in "
            f"{run.elapsed_s:.0f} s; log {args.out / f'{way}.log'}",
            flush=True,
        )
    line = report(runs, args.out, ft_timeout_s)
    print(json.dumps(line))
    return 0 if all(r.result is not None for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
