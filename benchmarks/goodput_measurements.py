"""Sentinel's detection and repair times per fault class, measured by the shipped drills.

    python benchmarks/goodput_measurements.py [--scenarios default,sdc,...] [--fleet local|slurm]
                                              [--results DIR ...] [--out FILE] [--keep DIR]

Runs each scenario as a `--quick` drill (as `sentinel demo --scenario NAME --quick` does) on the
simulated fleet, or, with `--results`, reads drill run directories made before
(`sentinel demo --out DIR`), and merges every timed fault into one measurements file
(`sentinel/lab/goodput/measurements.py`): per fault class the mean detection and repair seconds,
the sample count and the drills they came from, with its date, this command and the machine's
load (default `build/goodput_measurements.json`, where `make bench` leaves it).
`sentinel goodput --measurements FILE` reads it; the copy shipped in
`sentinel/data/goodput_measurements.json` was made by this script. A class no drill times (a
degraded link, kept out by burn-in) is listed with a note instead of a number.

Last line: JSON (`classes`: per class `detect_s`, `repair_s`, `samples`; `out`: the file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.lab.goodput.drills import drill_of, read_run, samples_of  # noqa: E402
from sentinel.lab.goodput.measurements import (  # noqa: E402
    FORMAT,
    Drill,
    Measurements,
    Sample,
    dump,
    summarise,
)

# Where `make bench` leaves the file (build/ is not tracked): `sentinel goodput --measurements
# build/goodput_measurements.json` reads it; the shipped copy is refreshed with --out.
DEFAULT_OUT = ROOT / "build" / "goodput_measurements.json"
# Every fault kind the drills time, and the link fault burn-in keeps out (its class's note).
SCENARIOS = "default,sdc,link_degraded,hang,crash,ecc_dbe,xid,thermal"


def machine(ran_drills: bool) -> str:
    """The machine and its load when the file was written: right after the drills, or (merging
    earlier runs) only at the merge, which says nothing of the drills' load."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    when = "at the end of the drills" if ran_drills else "when merging (not during the drills)"
    return f"{os.cpu_count()} CPU cores, no GPU; load average {when} {load} (1, 5, 15 min)"


def run_drills(scenarios: list[str], fleet: str, keep: Path) -> list[Path]:
    from sentinel.lab.demo.drill import run_drill
    from sentinel.scenario import load_scenario

    out = []
    for name in scenarios:
        run_dir = keep / name
        result = run_drill(
            load_scenario(name), run_dir, shorten=True, echo=lambda _l: None, fleet=fleet
        )
        print(f"{name}: {result['verdict']}", flush=True)
        out.append(run_dir)
    return out


def merge(run_dirs: list[Path], command: str, ran_drills: bool) -> Measurements:
    drills: list[Drill] = []
    samples: list[Sample] = []
    for run_dir in run_dirs:
        result, scenario = read_run(run_dir)
        drills.append(drill_of(result, scenario))
        samples += samples_of(result, len(drills) - 1)
    return Measurements(
        format=FORMAT,
        date=datetime.date.today().isoformat(),
        command=command,
        machine=machine(ran_drills),
        drills=drills,
        samples=samples,
        classes=summarise(drills, samples),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=SCENARIOS, help=f"drills to run (default {SCENARIOS})")
    ap.add_argument("--fleet", choices=["local", "slurm"], default="local")
    ap.add_argument(
        "--results",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="read these drill run directories instead of running drills",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"measurements file (default: {DEFAULT_OUT.relative_to(ROOT)})",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep the drills' run directories in DIR (default: a temporary one)",
    )
    args = ap.parse_args()
    command = shlex.join(["python", "benchmarks/goodput_measurements.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="goodput-drills-") as tmp:
        keep = args.keep or Path(tmp)
        dirs = args.results or run_drills(args.scenarios.split(","), args.fleet, keep)
        m = merge(dirs, command, ran_drills=not args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(m))
    classes = {
        str(k): v.model_dump(include={"detect_s", "repair_s", "samples"})
        for k, v in m.classes.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "goodput_measurements",
                "out": str(args.out),
                "drills": [f"{d.scenario}: {d.verdict}" for d in m.drills],
                "classes": classes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
