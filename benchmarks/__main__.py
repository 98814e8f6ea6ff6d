"""`python -m benchmarks [NAME ...]` (what `make bench` runs): every benchmark script in turn,
each script's own output passed through unchanged (its last line is its JSON figures).

On a terminal a live bar shows which benchmark runs, how many are done and an estimate of the
time left, the scripts' lines scrolling above it; otherwise a plain line per benchmark.
Exit: the first non-zero exit code of a benchmark, else 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sentinel.live import LiveProgress

HERE = Path(__file__).resolve().parent


def scripts(names: list[str]) -> list[Path]:
    found = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_"))
    if not names:
        return found
    by_name = {p.stem: p for p in found}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        names_ = ", ".join(by_name)
        print(f"no benchmark named {', '.join(unknown)}; there are: {names_}", file=sys.stderr)
        raise SystemExit(2)
    return [by_name[n] for n in names]


def run_one(script: Path, live: LiveProgress) -> int:
    """Run a benchmark, passing its stdout through line by line (above the bar on a terminal)."""
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if live.terminal:
            live.event(f"{script.stem}: {line.rstrip()}")
        else:
            print(line, end="", flush=True)
    return proc.wait()


def main(names: list[str]) -> int:
    todo = scripts(names)
    with LiveProgress("bench") as live:
        live.phase("benchmarks", len(todo))
        for done, script in enumerate(todo):
            live.advance(script.stem, to=done)
            if not live.terminal:
                print(f"== {script.relative_to(HERE.parent)}", flush=True)
            code = run_one(script, live)
            if code != 0:
                live.event(f"{script.stem}: exit {code}")
                return code
        live.advance("", to=len(todo))
        live.finish(f"{len(todo)} benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
