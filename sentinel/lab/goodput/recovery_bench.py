"""The live path's measured times, read from `benchmarks/recovery.py`'s output.

The benchmark runs one fault schedule three ways on the simulated fleet and prints, as its last
line, a JSON object with one object per way under `restart`, `warm_restart` and `live`, each
with `wall_s`, `steps`, `stall_s_max`, `join_s_max`, `checkpoint_reads` and `ledger_exact`.
`sentinel goodput --recovery-bench FILE` reads that line (the whole output saved, or the line
alone) and takes the live way's worst survivors' stall and worst join as the live path's
measured times; without the flag it reads the line of the run shipped in
`sentinel/data/recovery_bench.json`. A live run whose token ledger is not exact did not pass, so its times are
refused, as is anything else that is not such a line.
"""

from __future__ import annotations

import datetime as dt
import json
from importlib.resources import files
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from sentinel.config import config_errors
from sentinel.exitcodes import InputError
from sentinel.inputs import read_text

WHAT = "benchmarks/recovery.py's output, its last line JSON"
SHIPPED = "recovery_bench.json"  # in sentinel/data/: the last line of the run the README cites
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Way(BaseModel):
    """One way of repairing the schedule; a way with no survivors or no join has nulls."""

    model_config = ConfigDict(extra="allow", frozen=True)

    wall_s: Seconds
    steps: int = Field(ge=0)
    stall_s_max: Seconds | None
    join_s_max: Seconds | None
    checkpoint_reads: int = Field(ge=0)
    ledger_exact: StrictBool


class LiveWay(Way):
    stall_s_max: Seconds
    join_s_max: Seconds


class RecoveryBench(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    restart: Way
    warm_restart: Way
    live: LiveWay


def _last_line(path: Path) -> str:
    text = read_text(path, WHAT)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise InputError(f"{path}: empty ({WHAT})")
    return lines[-1]


def read_recovery_bench(path: Path | None = None) -> tuple[RecoveryBench, str]:
    """The benchmark's figures (at `path`, or the shipped run's) and where they came from: the
    file and the day it was written (the JSON's own `date` where it has one), with the load it
    ran under where it says."""
    if path is None:
        text = files("sentinel").joinpath("data", SHIPPED).read_text()
        return _parse(text, Path("sentinel/data") / SHIPPED)
    return _parse(_last_line(path), path)


def _parse(line: str, path: Path) -> tuple[RecoveryBench, str]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: last line is not valid JSON: {e} ({WHAT})") from None
    try:
        bench = RecoveryBench.model_validate(data)
    except ValidationError as e:
        lines = "\n  ".join(config_errors(e))
        raise InputError(f"{path}: invalid recovery benchmark figures:\n  {lines}") from None
    if not bench.live.ledger_exact:
        raise InputError(
            f"{path}: live.ledger_exact is false: that run did not pass (a sample consumed "
            "twice or skipped), so its times are not a measurement of the live path"
        )
    return bench, _where(path, data)


def _where(path: Path, data: dict[str, object]) -> str:
    date = data.get("date")
    if not isinstance(date, str) or not date:
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC)
        date = mtime.date().isoformat()
    load = data.get("load_avg", data.get("loadavg"))
    return f"{path} ({date}" + (f", load average {load}" if load is not None else "") + ")"
