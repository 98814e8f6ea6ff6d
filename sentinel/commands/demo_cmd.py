"""`sentinel demo [--fleet local|slurm] [--scenario NAME|FILE] [--out DIR] [--json FILE]
[--quick]`: the fault drill (coordinator, agents, supervised trainer, injected faults, graded
against a clean run), on the simulated fleet or on a real Slurm cluster it starts itself."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError
from sentinel.live import LiveProgress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a fault drill on a simulated fleet and grade Sentinel's response",
        description="Simulated nodes and GPUs, a real coordinator, the reference trainer's ranks "
        "on CPU under `sentinel run`, faults injected from a scenario. Exit 0 when every fault "
        "was detected, attributed and repaired (bit-identical to a clean run where the repair "
        "is rollback-and-resume), 1 otherwise, 2 on bad input.",
    )
    p.add_argument(
        "--scenario",
        default="default",
        help="a shipped scenario name (scenarios/NAME.yaml) or a scenario file (default: default)",
    )
    p.add_argument(
        "--fleet",
        choices=["local", "slurm"],
        default="local",
        help="local: ranks as local processes; slurm: a real Slurm cluster of the scenario's "
        "size on this machine (root, slurm-wlm and munge), started and torn down here",
    )
    p.add_argument(
        "--recovery",
        choices=["live", "warm_restart", "restart"],
        help="the repair path for every fault, over the scenario's own `recovery:` (refused for "
        "a fault the fault catalog does not allow it for); default: the scenario's, else each "
        "fault's own",
    )
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="run directory")
    add_json_option(p, "the result")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a shorter drill proving the same repairs: the timed faults move earlier by whole "
        "checkpoint intervals (as far as each detector's warm-up allows, order and spacing "
        "kept) and training ends once the last repair is proven",
    )
    p.set_defaults(handler=run)


if TYPE_CHECKING:
    from sentinel.scenario import Scenario


class DemoDisplay:
    """On a terminal: the training steps as a live bar (step, ETA), the drill's timeline
    (faults, incidents opening and closing, actions, resumes) printed above it."""

    def __init__(self, live: LiveProgress) -> None:
        self.live, self.last = live, 0

    def echo(self, line: str) -> None:
        self.live.event(line)

    def step(self, step: int, steps: int) -> None:
        if self.last == 0:
            self.live.phase("training", steps)
        label = "replaying after a rollback" if step <= self.last else ""
        self.last = max(self.last, step)
        self.live.advance(label, to=step)


def with_recovery(scenario: Scenario, recovery: str) -> Scenario:
    """The scenario with every fault's repair path `recovery`, checked as a file's would be."""
    from pydantic import ValidationError

    from sentinel.config import config_errors
    from sentinel.scenario import Scenario

    doc = scenario.model_dump(mode="json") | {"recovery": recovery}
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        raise InputError(f"--recovery {recovery}:\n  " + "\n  ".join(config_errors(e))) from None


def run(args: argparse.Namespace) -> int:
    from sentinel.lab.demo.drill import run_drill, summary_lines
    from sentinel.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    if args.recovery is not None:
        scenario = with_recovery(scenario, args.recovery)
    if args.fleet == "slurm":
        from sentinel.lab.slurm.cluster import missing_requirements

        why = missing_requirements()
        if why:
            raise InputError(f"--fleet slurm: a Slurm cluster cannot start here: {why}")
    if args.out.exists() and any(args.out.iterdir()):
        raise InputError(f"--out {args.out} is not empty: pick a new directory or remove it")
    check_json_target(args)

    # With `--json` on stdout, the lines for a person go to stderr.
    human = sys.stderr if json_to_stdout(args) else sys.stdout

    def stop(sig: int, _frame: object) -> None:
        raise SystemExit(128 + sig)  # unwinds through the drill's `finally`: no orphans

    signal.signal(signal.SIGTERM, stop)
    with LiveProgress("demo", human) as live:
        display = DemoDisplay(live) if live.terminal else None
        result = run_drill(
            scenario,
            args.out,
            shorten=args.quick,
            echo=display.echo if display else lambda line: print(line, file=human, flush=True),
            progress=display.step if display else None,
            fleet=args.fleet,
        )
    for line in summary_lines(result):
        print(line, file=human)
    print(f"report: {args.out / 'report.html'}  result: {args.out / 'result.json'}", file=human)
    emit_json(args, result)
    sys.stdout.flush()
    return ExitCode.OK if result["verdict"] == "pass" else ExitCode.PROBLEM_FOUND
