"""`sentinel goodput`: project the effective training time ratio of a fleet from a failure trace."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError

if TYPE_CHECKING:
    from sentinel.lab.goodput.origin import Input

# `sentinel.lab.goodput.paths.Recovery`'s values (a test checks), here so that `sentinel --help`
# does not load the simulator.
RECOVERY = ("catalog", "restart", "warm_restart")
COMPARE_GPUS = (16384, 100000)
GOAL = 0.90


def _positive(
    kind: type[int] | type[float], minimum: float, strict: bool
) -> Callable[[str], float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}")
        return value

    return parse


def _ratio(text: str) -> float:
    """A ratio in (0, 1]: 0.97, not 97 (a percentage is refused with the ratio it meant)."""
    value = _positive(float, 0, True)(text)
    if value > 1:
        hint = f" (for {value:g}%, pass {value / 100:g})" if value <= 100 else ""
        raise argparse.ArgumentTypeError(f"a ratio is at most 1, got {text}{hint}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "goodput",
        help="fleet-scale failure-trace projection of the effective training time ratio",
        description="Replay a failure trace (default: Llama 3's 419 interruptions in 54 days on "
        "16,384 GPUs) against Sentinel's recovery times and a no-Sentinel baseline, with each "
        "repair's parts carried to the fleet's size; then today's restart, the warm restart and "
        "the live path side by side at 16,384 and 100,000 GPUs.",
    )
    _fleet_options(p)
    _checkpoint_options(p)
    _time_options(p)
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument(
        "--runs", type=_positive(int, 1, False), default=10, help="seeded runs (default 10)"
    )
    p.add_argument(
        "--target",
        type=_ratio,
        default=0.97,
        help="ratio to compare with (default 0.97)",
    )
    add_json_option(p, "the projection")
    p.set_defaults(handler=run_goodput)


def _fleet_options(p: argparse.ArgumentParser) -> None:
    """The trace, the fleet and its repair paths."""
    p.add_argument("--trace", type=Path, help="trace file (YAML/JSON); default: Llama 3")
    p.add_argument("--gpus", type=_positive(int, 0, True), help="fleet size (default: trace's)")
    p.add_argument("--days", type=_positive(float, 0, True), help="window (default: trace's)")
    p.add_argument(
        "--spares",
        type=_positive(int, 0, False),
        metavar="K",
        help="hot spare nodes at every fleet size (default: by the rule, for the "
        "fleet's failure rate over a node's repair; 8 was the old fixed default)",
    )
    p.add_argument(
        "--recovery",
        choices=RECOVERY,
        default="catalog",
        help="the headline's repair path for every fault: restart (today's), "
        "warm_restart, or catalog (default: each fault the catalog's path, live "
        "where it is confined to one replica)",
    )
    p.add_argument(
        "--recovery-bench",
        type=Path,
        metavar="FILE",
        help="benchmarks/recovery.py's output: its live way's worst survivors' stall "
        "and join become the live path's measured times (default: the shipped run's, "
        "sentinel/data/recovery_bench.json)",
    )
    p.add_argument(
        "--replica-gpus",
        type=_positive(int, 0, True),
        metavar="N",
        help="GPUs per data-parallel replica on the live path (default 128)",
    )
    p.add_argument(
        "--shrink-batch",
        action="store_true",
        help="the live path drops a missing replica's samples instead of keeping the "
        "global batch (the survivors' step does not grow)",
    )
    p.add_argument(
        "--compare-gpus",
        type=_sizes,
        default=COMPARE_GPUS,
        metavar="N[,N...]",
        help="fleet sizes for the paths side by side (default 16384,100000)",
    )
    p.add_argument(
        "--goal",
        type=_ratio,
        default=GOAL,
        help="the live path's goal at the largest --compare-gpus (default 0.90)",
    )


def _checkpoint_options(p: argparse.ArgumentParser) -> None:
    """How often the fleet saves, and what a save costs."""
    ckpt = p.add_mutually_exclusive_group()
    ckpt.add_argument(
        "--checkpoint-interval",
        type=_positive(float, 0, True),
        metavar="S",
        help="fixed seconds of training between checkpoints",
    )
    ckpt.add_argument(
        "--young-daly",
        action="store_true",
        help="√(2·cost·MTBF of the failures that roll back) (the default)",
    )
    p.add_argument(
        "--checkpoint-cost",
        type=_positive(float, 0, False),
        metavar="S",
        help="seconds a save blocks training (default: derived from the flags below)",
    )
    state = p.add_argument_group(
        "checkpoint cost",
        "a save's cost from the state's size and bandwidths (defaults: Llama 3 405B)",
    )
    state.add_argument(
        "--model-params",
        type=_positive(float, 0, True),
        default=405e9,
        help="parameters (default 405e9)",
    )
    state.add_argument(
        "--bytes-per-param",
        type=_positive(float, 0, True),
        default=14.0,
        help="checkpointed bytes per parameter (default 14: bf16 weights, fp32 "
        "master, AdamW moments)",
    )
    state.add_argument(
        "--staging-gbps",
        type=_positive(float, 0, True),
        default=10.0,
        help="GB/s per GPU into host memory (default 10)",
    )
    state.add_argument(
        "--coordination-s",
        type=_positive(float, 0, False),
        default=1.0,
        help="save-plan exchange and barrier per save, seconds (default 1)",
    )
    state.add_argument(
        "--storage-tbps",
        type=_positive(float, 0, True),
        default=2.0,
        help="storage write TB/s for the whole fleet (default 2)",
    )
    state.add_argument(
        "--sync-checkpoint",
        action="store_true",
        help="synchronous saves: block for the whole write",
    )


def _time_options(p: argparse.ArgumentParser) -> None:
    """Sentinel's detection and repair times: measured, from a drill, or given."""
    p.add_argument(
        "--detect-s",
        action="append",
        default=[],
        metavar="[CLASS=]S",
        help="Sentinel detection time, for all classes or one (node, restart, hang, "
        "sdc, link); repeatable",
    )
    p.add_argument(
        "--repair-s",
        action="append",
        default=[],
        metavar="[CLASS=]S",
        help="Sentinel time from detection to resumed training after a full stop, "
        "taken whole at any fleet size; same form",
    )
    p.add_argument(
        "--node-repair-h",
        type=_positive(float, 0, False),
        default=12.0,
        help="hours until a swapped-out node is back in the spare pool (default 12)",
    )
    p.add_argument(
        "--measurements",
        type=Path,
        metavar="FILE",
        help="Sentinel's measured times (benchmarks/goodput_measurements.py); "
        "default: the copy shipped in sentinel/data",
    )
    p.add_argument(
        "--from-demo",
        type=Path,
        metavar="DEMO_JSON",
        help="a drill's goodput.json: its time_to_detect_s / time_to_resume_s per "
        "fault kind replace the measurements' for those classes",
    )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected GPU counts like 16384,100000, got {text!r}"
        ) from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("every size must be > 0")
    return tuple(sorted(set(sizes)))


def _overrides(items: list[str], flag: str) -> dict[str, float]:
    from sentinel.lab.goodput.trace import FaultClass

    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            raise InputError(f"{flag} {item}: expected [CLASS=]SECONDS") from None
        if seconds < 0:
            raise InputError(f"{flag} {item}: seconds must be >= 0")
        if name and name not in set(FaultClass):
            raise InputError(
                f"{flag} {item}: unknown class {name!r} (known: {', '.join(FaultClass)})"
            )
        for cls in [name] if name else list(FaultClass):
            out[cls] = seconds
    return out


# The checkpoint flags and the input each one sets.
CHECKPOINT_FLAGS = {
    "model_params": "checkpoint.params",
    "bytes_per_param": "checkpoint.bytes_per_param",
    "staging_gbps": "checkpoint.staging_gbps",
    "coordination_s": "checkpoint.coordination_s",
    "storage_tbps": "checkpoint.storage_tbps",
    "node_repair_h": "node_repair_h",
    "replica_gpus": "layout.replica_gpus",
}


def projection_inputs(args: argparse.Namespace) -> tuple[list[Input], dict[str, Any]]:
    """Every input with its origin: the measurements, then a drill's file, then the flags."""
    from sentinel.lab.goodput.inputs import default_rows, override, with_drill_times
    from sentinel.lab.goodput.inputs_report import measurements_dict
    from sentinel.lab.goodput.measurements import read_measurements
    from sentinel.lab.goodput.model import load_demo_times
    from sentinel.lab.goodput.recovery_bench import read_recovery_bench

    meas, where = read_measurements(args.measurements)
    bench, bench_where = read_recovery_bench(args.recovery_bench)
    rows = default_rows(meas, where, bench, bench_where)
    if args.checkpoint_cost is not None:
        cost = args.checkpoint_cost
        rows = override(rows, "checkpoint.cost_s", cost, "--checkpoint-cost", "checkpoint blocking")
    if args.from_demo:
        detect, resume = load_demo_times(args.from_demo)
        src = f"{args.from_demo} (a drill's goodput.json, as the drill ran)"
        rows = with_drill_times(rows, detect, resume, src)
    for name, v in _overrides(args.detect_s, "--detect-s").items():
        rows = override(rows, f"sentinel.detect_s.{name}", v, "--detect-s")
    for name, v in _overrides(args.repair_s, "--repair-s").items():
        rows = override(rows, f"sentinel.resume_s.{name}", v, "--repair-s")
    for dest, key in CHECKPOINT_FLAGS.items():
        value = getattr(args, dest)
        if value is not None and value != next(r.value for r in rows if r.key == key):
            rows = override(rows, key, value, "--" + dest.replace("_", "-"))
    return rows, measurements_dict(meas, where)


def _sources(rows: list[Input], prefix: str) -> str:
    """One line of where a model's per-class times came from, for its `sources`."""
    return "; ".join(
        f"{r.label}: {r.origin} ({r.source})" for r in rows if r.key.startswith(prefix)
    )


def run_goodput(args: argparse.Namespace) -> int:
    from sentinel.lab.goodput.compare import compare, compare_dict, render_compare, rule_spares
    from sentinel.lab.goodput.decompose import decompose
    from sentinel.lab.goodput.inputs import Plan, build_models
    from sentinel.lab.goodput.inputs_report import inputs_json, render_inputs
    from sentinel.lab.goodput.levers import lever_rows
    from sentinel.lab.goodput.paths import Recovery
    from sentinel.lab.goodput.report import build_report, render_text
    from sentinel.lab.goodput.sensitivity import sensitivity
    from sentinel.lab.goodput.simulate import Fleet
    from sentinel.lab.goodput.trace import LLAMA3, load_trace

    trace = load_trace(args.trace) if args.trace else LLAMA3
    gpus = args.gpus or trace.gpus
    rows, meas = projection_inputs(args)
    values = {r.key: r.value for r in rows}
    spares = rule_spares(trace, gpus, values) if args.spares is None else args.spares
    plan = Plan(
        gpus,
        spares,
        args.checkpoint_interval,
        not args.sync_checkpoint,
        Recovery(args.recovery),
        not args.shrink_batch,
    )
    model, baseline, spec = build_models(values, plan)
    model = model.replace(
        sources={
            "detect_s": _sources(rows, "sentinel.detect_s")
            + "; "
            + _sources(rows, "sentinel.hang")
            + "; "
            + _sources(rows, "sentinel.sdc"),
            "resume_s": _sources(rows, "sentinel.re"),
            "live": _sources(rows, "live.") + "; " + _sources(rows, "scale."),
        }
    )
    baseline = baseline.replace(
        sources={
            "detect_s": _sources(rows, "baseline.detect_s"),
            "resume_s": "today's restart at this size without Sentinel's decision and drain: the "
            "node class's measured stages carried to scale, as Sentinel's restart",
        }
    )
    days = args.days or trace.days
    seeds = [args.seed + i for i in range(args.runs)]
    fleet = Fleet(trace, gpus=gpus, days=days, seeds=seeds)
    sen, base = fleet.evaluate(model), fleet.evaluate(baseline)
    checkpoint = spec.describe(gpus) | {
        "blocking_s_used": model.checkpoint_cost_s,
        "source": "derived" if args.checkpoint_cost is None else "command line (--checkpoint-cost)",
    }
    steps = decompose(fleet, baseline, model)
    levers = lever_rows(fleet, model, sen, spec)
    rep = build_report(fleet, sen, base, steps, levers, args.target, args.seed, checkpoint)
    points = compare(trace, values, plan, args.compare_gpus, days, seeds, args.spares)
    counts = trace.counts_by_class()
    rep["compare"] = compare_dict(points, values, plan.keep_batch, args.goal, counts)
    rep |= inputs_json(rows, meas, sensitivity(fleet, rows, plan, sen.mean, base.mean))
    emit_json(args, rep)
    if not json_to_stdout(args):
        text = [render_text(rep), render_compare(rep["compare"]), render_inputs(rep)]
        print("\n\n".join(text))
    return ExitCode.OK
