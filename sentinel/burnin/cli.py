"""Orchestration behind `sentinel burnin`: validate, launch the ranks, publish the report.

Simulated fleet: spawn local ranks, read rank 0's report. torchrun/Slurm: this process is a
rank; rank 0 publishes. torch is imported only on the rank path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from sentinel.burnin.report import baseline_from, load_baseline, render, write_exclude
from sentinel.burnin.settings import (
    BurninSettings,
    Thresholds,
    parse_phases,
    parse_size,
    quick_settings,
)
from sentinel.commands.jsonout import check_json_target, emit_json, json_to_stdout
from sentinel.config import DRIFT_PATTERN
from sentinel.exitcodes import ExitCode, InputError
from sentinel.scenario import load_scenario, resolve_scenario_path


def settings_from_args(args: argparse.Namespace) -> BurninSettings:
    s = BurninSettings(
        phases=parse_phases(args.phases),
        link_search=args.link_search,
        backend=args.backend,
        progress=not args.no_progress,
    )
    if args.quick:
        s = quick_settings(s)
    overrides: dict[str, Any] = {}
    for name, parse in (
        ("min_bytes", parse_size),
        ("max_bytes", parse_size),
        ("step_factor", int),
        ("iters", int),
        ("warmup", int),
    ):
        if getattr(args, name) is not None:
            overrides[name] = parse(str(getattr(args, name)))
    th: dict[str, float] = {}
    if args.link_tolerance is not None:
        if not 0 < args.link_tolerance < 1:
            raise InputError("--link-tolerance must be between 0 and 1")
        th["link_tolerance"] = args.link_tolerance
    if args.straggler_threshold is not None:
        if not 0 < args.straggler_threshold < 10:
            raise InputError("--straggler-threshold must be a positive fraction, e.g. 0.03")
        th["straggler_slowdown"] = args.straggler_threshold
    for pattern in args.allow_drift:
        if not re.match(DRIFT_PATTERN, pattern):
            raise InputError(f"--allow-drift {pattern!r}: want a field name or an fnmatch pattern")
    overrides["allow_drift"] = tuple(args.allow_drift)
    if args.scenario:
        load_scenario(args.scenario)  # bad scenarios fail here, before any rank starts
        overrides["scenario"] = str(resolve_scenario_path(args.scenario).resolve())
    if args.baseline:
        load_baseline(args.baseline)
        overrides["baseline_path"] = str(args.baseline.resolve())
    check_json_target(args)
    for flag in ("exclude_out", "save_baseline"):
        path = getattr(args, flag)
        if path is not None and not path.resolve().parent.is_dir():
            raise InputError(f"--{flag.replace('_', '-')} {path}: directory does not exist")
    return dataclasses.replace(s, thresholds=Thresholds(**th), **overrides).validated()


def sim_fleet(args: argparse.Namespace) -> tuple[int, int]:
    nodes, gpus = args.sim_nodes, args.gpus_per_node
    if args.scenario:
        fleet = load_scenario(args.scenario).fleet
        if nodes not in (None, fleet.nodes) or gpus not in (None, fleet.gpus_per_node):
            raise InputError(
                f"--scenario describes {fleet.nodes} nodes x {fleet.gpus_per_node} GPUs but the "
                f"command line asks for {nodes} x {gpus}; drop one or make them agree"
            )
        nodes, gpus = fleet.nodes, fleet.gpus_per_node
    gpus = gpus or 1
    if nodes is None or nodes < 1 or gpus < 1:
        raise InputError("--sim-nodes and --gpus-per-node must be positive integers")
    if nodes * gpus < 2:
        raise InputError("burn-in needs at least 2 ranks (--sim-nodes x --gpus-per-node)")
    return nodes, gpus


def publish(report: dict[str, Any], args: argparse.Namespace) -> int:
    emit_json(args, report)
    if args.exclude_out:
        write_exclude(args.exclude_out, report["exclude"])
    if args.save_baseline:
        args.save_baseline.write_text(json.dumps(baseline_from(report), indent=2))
    print(render(report), file=sys.stderr if json_to_stdout(args) else sys.stdout)
    return ExitCode.OK if report["verdict"] == "pass" else ExitCode.PROBLEM_FOUND


def run(args: argparse.Namespace) -> int:
    if args.validate:
        from sentinel.burnin.validate import run_validate

        return run_validate(args)
    if args.gpus is not None or args.sim_faults is not None:
        raise InputError("--gpus and --sim-faults go with --validate")
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.sim_nodes is None and not args.scenario and not launched:
        raise InputError(
            "nothing to test: run one process per GPU under torchrun/Slurm "
            "(RANK and WORLD_SIZE set), or simulate a fleet with --sim-nodes N --gpus-per-node G"
        )
    settings = settings_from_args(args)
    if launched and args.sim_nodes is None:
        if os.environ["WORLD_SIZE"].strip() == "1":  # before NCCL fails on a send to no peer
            raise InputError(
                "burn-in needs at least 2 ranks (WORLD_SIZE is 1); a single GPU is tested "
                "alone by `sentinel burnin --validate`"
            )
        from sentinel.burnin.runner import run_rank

        report = run_rank(settings)
        return ExitCode.OK if report is None else publish(report, args)
    from sentinel.lab.sim.burnin import run_sim

    nodes, gpus = sim_fleet(args)
    with tempfile.TemporaryDirectory(prefix="sentinel-burnin-") as tmp:
        result = Path(tmp) / "report.json"
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(
            dataclasses.replace(settings, result_path=str(result), backend="gloo").to_json()
        )
        code = run_sim(nodes, gpus, settings_file)
        if code != 0 or not result.exists():
            print(f"sentinel burnin: a rank exited with code {code}; no report", file=sys.stderr)
            return ExitCode.PROBLEM_FOUND
        return publish(json.loads(result.read_text()), args)
