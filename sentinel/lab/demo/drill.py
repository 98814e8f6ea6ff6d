"""One drill end to end: run the demo, grade it against a clean reference, write its outputs
(`result.json`, `goodput.json` for `sentinel goodput --from-demo`, `report.html`)."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sentinel.coordinator.core.playbooks import default_playbooks_dir, load_playbooks
from sentinel.exitcodes import InputError
from sentinel.lab.demo.account import time_account
from sentinel.lab.demo.data import DemoData, RankSample, StepPoint, TimelineEntry
from sentinel.lab.demo.feasibility import repair_warnings
from sentinel.lab.demo.quick import quick, summary
from sentinel.lab.demo.reference import reference_run
from sentinel.lab.demo.repairs import repair_costs, restarts
from sentinel.lab.demo.result import (
    Evidence,
    Generation,
    build_result,
    goodput_input,
)
from sentinel.lab.demo.run import (
    AGENT_INTERVAL_S,
    DRILL_COMPRESSION,
    HANG_FLOOR_S,
    Demo,
    drill_hooks,
    trainer_args,
    write_scenario,
)
from sentinel.lab.demo.slurm import SlurmDemo, add_slurm_facts
from sentinel.lab.goodput.drill_projection import drill_projection
from sentinel.lab.sim.inject import CheckpointSave, MetricsTail
from sentinel.scenario import Scenario


def skip_list(incidents: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The batch ranges the playbooks chose to skip (their `skip_batches` actions)."""
    out = set()
    for inc in incidents:
        for a in inc.get("actions", []):
            skip = (a.get("result") or {}).get("skip")
            if a["action"] == "skip_batches" and a["state"] == "done" and skip:
                out.add((int(skip[0]), int(skip[1])))
    return sorted(out)


def _log_records(supervisor_log: Path) -> Iterator[dict[str, Any]]:
    """The supervisor's JSON log records (anything else in the file is passed over)."""
    lines = supervisor_log.read_text().splitlines() if supervisor_log.exists() else []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def generations(supervisor_log: Path, t0: float) -> list[Generation]:
    """Each gang generation the supervisor launched: when (demo seconds), on which nodes, and
    when its gang was gone (its teardown's record), if it was stopped."""
    records = list(_log_records(supervisor_log))
    stopped = {
        int(rec["teardown"]["generation"]): float(rec["ts"]) - t0
        for rec in records
        if isinstance(rec.get("teardown"), dict) and "generation" in rec["teardown"]
    }
    return [
        Generation(
            t=float(rec["ts"]) - t0,
            number=int(rec["generation"]),
            nodes=tuple(rec["nodes"]),
            stopped_t=stopped.get(int(rec["generation"])),
            launched=tuple(rec["launched"]) if isinstance(rec.get("launched"), list) else None,
        )
        for rec in records
        if "generation" in rec and isinstance(rec.get("nodes"), list)
    ]


def lr_windows(supervisor_log: Path) -> list[str]:
    """The learning-rate scale windows the restarts applied, as `FACTOR:STEPS@FROM`: each
    generation the supervisor launched with `--lr-scale F:N` scales from the step it resumed at
    (its `--resume-from` checkpoint's step; 0 when it started over)."""
    out: list[str] = []
    for rec in _log_records(supervisor_log):
        argv = rec.get("argv")
        if not isinstance(argv, list) or "--lr-scale" not in argv:
            continue
        scale = str(argv[argv.index("--lr-scale") + 1])
        start = 0
        if "--resume-from" in argv:
            m = re.search(r"step[-_]?(\d+)", Path(str(argv[argv.index("--resume-from") + 1])).name)
            start = int(m.group(1)) if m else 0
        out.append(f"{scale}@{start}")
    return out


def run_drill(
    scenario: Scenario,
    out: Path,
    *,
    shorten: bool,
    echo: Callable[[str], None],
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float | None = None,
    stall_s: float = 240.0,
    fleet: str = "local",
) -> dict[str, Any]:
    full = scenario
    if scenario.returns is not None and fleet != "local":
        raise InputError("a scenario with returns (validation before return) runs on --fleet local")
    if any(f.kind == "config_drift" for f in scenario.faults) and fleet != "local":
        raise InputError("a scenario with config_drift runs on --fleet local")
    if shorten:
        scenario = quick(scenario)
    out.mkdir(parents=True, exist_ok=True)
    write_scenario(scenario, out / "scenario.yaml")
    demo = (
        Demo(scenario, out, echo, progress)
        if fleet == "local"
        else SlurmDemo(scenario, out, echo, progress)
    )
    if shorten:
        demo.note("info", None, summary(full, scenario))
    warnings = repair_warnings(scenario, load_playbooks(default_playbooks_dir()))
    for warning in warnings:
        demo.note("info", None, f"WARNING: {warning}")
    budget = timeout_s if timeout_s is not None else 300.0 + 3.0 * scenario.trainer.steps
    observer, tail = demo.train(budget, stall_s)
    incidents = list(observer.seen.incident_details.values())
    skip = skip_list(incidents)
    # One scale window is what the trainer's schedule holds; the reference replays it. With
    # more than one the reference cannot, and bit-identity is not required (result.py).
    windows = lr_windows(out / "supervisor.log")
    lr = windows[0] if len(windows) == 1 else None
    reference, ref_steps = None, []
    if tail.digest is not None:
        note = f" skipping batches {skip}" if skip else ""
        note += f" with the learning rate scaled {lr}" if lr else ""
        demo.note("info", None, f"clean reference run of the same configuration{note}")
        started = time.monotonic()
        args = trainer_args(scenario) + (["--lr-scale", lr] if lr else [])
        replicas = scenario.trainer.dp if scenario.runs_replicas else 1
        ref = reference_run(scenario.fleet.world_size, args, skip, out / "data", replicas=replicas)
        how = "cached" if ref.cached else f"{time.monotonic() - started:.0f}s"
        demo.note("info", None, f"reference digest {ref.digest[:12]} ({how})")
        reference, ref_steps = ref.digest, ref.steps
    steps = [ln.step for ln, _g in demo.rec.lines]
    evidence = Evidence(
        scenario=scenario,
        t0=demo.rec.t0,
        incidents=incidents,
        strikes=demo.strikes(),
        steps=[(ln.t, ln.step, g) for ln, g in demo.rec.lines],
        completed_steps=tail.final_step or (max(steps) if steps else 0),
        final_digest=tail.digest,
        final_loss=demo.rec.lines[-1][0].loss if demo.rec.lines else None,
        reference_final_loss=dict(ref_steps).get(max(steps)) if steps and ref_steps else None,
        tokens=token_ledger(out / "run", scenario.trainer.steps),
        reference_digest=reference,
        burnin_exclude=demo.rec.burnin_exclude,
        reference_has_lr_scale=lr is not None,
        generations=generations(out / "supervisor.log", demo.rec.t0),
        returns=demo.rec.returns,
        repairs=repair_costs(
            restarts(out / "supervisor.log", demo.rec.t0),
            [(ln.t, ln.step, g) for ln, g in demo.rec.lines],
            tail.launches,
            scenario.fleet.gpus_per_node,
            [(ln.t, ln.participants) for ln, _g in demo.rec.lines if ln.participants],
        ),
        timing=dataclasses.replace(
            demo.timing,
            hang_timeout_s=hang_timeout_s(out / "coordinator" / "coordinator.db", HANG_FLOOR_S),
        ),
    )
    result = build_result(evidence)
    result["warnings"] = warnings
    result["drill_settings"] = {
        "compression": DRILL_COMPRESSION,
        "hooks": drill_hooks(),
        "agent_interval_s": AGENT_INTERVAL_S,
    }
    result["time_account"] = account_of(demo, tail, evidence)
    demo.rec.timeline = align_timeline(demo.rec.timeline, result)
    if isinstance(demo, SlurmDemo):
        result = add_slurm_facts(result, demo.final_states)
    times = goodput_input(result)
    result["fleet_projection"] = drill_projection(times, str(out / "goodput.json"))
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "goodput.json").write_text(json.dumps(times, indent=2) + "\n")
    write_report_for(out, demo, result, ref_steps, tail.saves, evidence.generations)
    return result


def token_ledger(run: Path, steps: int) -> dict[str, Any] | None:
    """The trainer's ledger checker on the run (every sample of every step consumed once);
    None when the run kept no ledger. A subprocess: `sentinel` never imports the trainer."""
    argv = [sys.executable, "-m", "trainer_hooks.reference.ledger", str(run)]
    argv += ["--steps", str(steps), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1):
        return None
    verdict: dict[str, Any] = json.loads(done.stdout)
    return verdict


def account_of(demo: Demo, tail: MetricsTail, ev: Evidence) -> dict[str, Any]:
    """The run's wall time by category (account.py): each line belongs to the generation the
    supervisor had launched last when the line was seen."""
    starts = [(g.t, g.number) for g in ev.generations]
    lines = []
    for line, _gen in demo.rec.lines:
        k = max((i for i, (t, _n) in enumerate(starts) if t <= line.t), default=0)
        lines.append((line, k))
    detections = [inc["opened_at"] - ev.t0 for inc in ev.incidents]
    return time_account(lines, starts, tail.launches, tail.saves, detections, demo.rec.burnin_span)


def align_timeline(timeline: list[TimelineEntry], result: dict[str, Any]) -> list[TimelineEntry]:
    """Give each fault's and each detection's timeline entry the step the result states for it,
    so the timeline and the table say the same thing (the live entry was stamped as it was
    seen; a detection's evidence can name its own step)."""
    steps: dict[str, int | None] = {}
    for index, f in enumerate(result["faults"]):
        steps[f"fault:{index}"] = f.get("injected_step")
    for inc in result["incidents"]:
        steps[f"incident:{inc['id']}"] = inc.get("detected_step")
    return [
        dataclasses.replace(e, step=steps[e.ref])
        if e.ref in steps and steps[e.ref] is not None
        else e
        for e in timeline
    ]


def _events(db: Path, kind: str) -> list[tuple[int | None, float, dict[str, Any]]]:
    """(rank, ts, payload) of every stored event of `kind`, read after the coordinator stopped."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT rank, ts, payload FROM events WHERE kind=? ORDER BY ts", (kind,)
        ).fetchall()
    finally:
        conn.close()
    return [(None if r is None else int(r), float(ts), json.loads(p)) for r, ts, p in rows]


def hang_timeout_s(db: Path, floor_s: float) -> float:
    """The timeout the first watchdog to fire had reached (the hooks' timeout adapts: the larger
    of its floor and k times the slowest recent step); the floor when none fired."""
    timeouts = [
        float(p["timeout_s"]) for _r, _t, p in _events(db, "rank.hang") if p.get("timeout_s")
    ]
    return min(timeouts, default=floor_s)


def rank_samples(db: Path, t0: float, gens: list[Generation]) -> list[RankSample]:
    """Each rank's reported step times (`rank.step` events) from the coordinator's store, read
    after the coordinator has stopped. Every generation's report of a step is kept (a step
    rolled back and replayed has two), each with the generation launched last before it."""
    starts = sorted((g.t, g.number) for g in gens)
    out: dict[tuple[int, int, int], RankSample] = {}
    for rank, ts, p in _events(db, "rank.step"):
        if rank is None:
            continue
        t = ts - t0
        gen = max((n for start, n in starts if start <= t), default=0)
        step = int(p["step"]) + 1  # the hooks count from 0, the trainer's metrics from 1
        out[(rank, step, gen)] = RankSample(
            rank, step, float(p["step_s"]), p.get("mfu"), generation=gen, t=t
        )
    return sorted(out.values(), key=lambda r: (r.generation, r.step, r.rank))


def write_report_for(
    out: Path,
    demo: Demo,
    result: dict[str, Any],
    ref_steps: list[tuple[int, float]],
    saves: list[CheckpointSave],
    gens: list[Generation],
) -> Path:
    from sentinel.lab.demo.report import write_report

    data = DemoData(
        result=result,
        steps=demo.step_points(),
        reference_steps=[StepPoint(s, loss, 0, 0.0) for s, loss in ref_steps],
        ranks=rank_samples(out / "coordinator" / "coordinator.db", demo.rec.t0, gens),
        burnin=demo.rec.burnin,
        timeline=demo.rec.timeline,
        generations=gens,
        gpus_per_node=demo.scenario.fleet.gpus_per_node,
        checkpoints=sorted({s.step for s in saves}),
    )
    return write_report(out, data)


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The verdict, then why it failed (first, where a person reads), then one line a fault."""
    lines = [
        f"verdict: {result['verdict'].upper()}  scenario {result['scenario']}, "
        f"{result['completed_steps']} steps"
    ]
    lines += [f"  FAIL: {p}" for p in result.get("problems", [])]
    for f in result["faults"]:
        done = "stopped" if f.get("expected") else "repaired"
        state = "MISSED" if not f["detected"] else done if f["repaired"] else "UNREPAIRED"
        ttd = f"detect {f['time_to_detect_s']}s" if f["time_to_detect_s"] is not None else ""
        ttr = f"resume {f['time_to_resume_s']}s" if f["time_to_resume_s"] is not None else ""
        path = f.get("repair_path") or ""  # live, warm_restart or restart: what the job paid
        lines.append(
            f"  {f['kind']:<14} {f['target']:<9} {state:<9} {ttd:<15} {ttr:<15} "
            f"{path:<13} {' '.join(f['actions'])}"
        )
    for i in result["false_incidents"]:
        lines.append(f"  false incident #{i['id']} {i['kind']} on {i['target']}")
    lines += return_lines(result.get("returns"))
    if result["final_digest"] is None and not result["bit_identity_required"]:
        lines.append("  no final model: the job was stopped for a person, as the drill expects")
        return lines
    tokens = result.get("tokens")
    if tokens is not None:
        exact = "exact" if result["ledger_exact"] else "NOT EXACT"
        lines.append(
            f"  token ledger {exact}: {tokens['consumed']} of {tokens['expected']} tokens "
            f"consumed, {tokens['duplicated']} twice, {tokens['skipped']} skipped"
        )
    if result.get("final_loss_within_tolerance") is not None:
        final, ref, tol = (
            result["final_loss"],
            result["reference_final_loss"],
            result["loss_tolerance"],
        )
        within = "within" if result["final_loss_within_tolerance"] else "NOT within"
        lines.append(
            f"  final loss {final}: {within} {tol:g} of the reference's {ref} "
            "(repaired live: the same samples, summed in another order)"
        )
        return lines
    same = "bit-identical" if result["bit_identical"] else "NOT bit-identical"
    lines.append(f"  final digest {str(result['final_digest'])[:16]}: {same} to the reference")
    return lines


def return_lines(returns: dict[str, Any] | None) -> list[str]:
    """One line per return the operator asked for (a scenario's `returns` drill)."""
    if returns is None:
        return []
    out = []
    for a in returns["attempts"]:
        how = "still damaged" if a["still_damaged"] else "repaired"
        got = (a["outcome"] or "no answer").upper()
        why = f": {a['reason']}" if a["outcome"] == "refused" and a["reason"] else ""
        out.append(f"  return {returns['node']:<9} ({how}) {got}{why}")
    if returns["false_return"]:
        out.append(f"  FALSE RETURN of {returns['node']}")
    return out
