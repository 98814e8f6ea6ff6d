"""A rank's flight-recorder dump with stack traces (an incident's evidence): a real rank process
with a gloo group and PyTorch's recorder on writes `<dump>.stacks` beside its plain dump, each
entry with the Python stack it was issued from, and no sidecar of its own; the analysis still
reads the directory as the plain dumps."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

from sentinel.fr.dumps import load_dir

RANK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch, torch.distributed as dist
    from trainer_hooks.flight import FlightRecorder, enable_flight_recorder

    def issue_the_reductions():
        for _ in range(5):
            dist.all_reduce(torch.ones(4))

    enable_flight_recorder()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    issue_the_reductions()
    fr = FlightRecorder(Path(sys.argv[1]), 0)
    fr.dump("command", 3)
    path, entries = fr.dump("command, with stack traces", 3, with_stacks=True)
    print(path.name, entries, flush=True)
    """
)


def test_a_dump_with_stack_traces_names_where_each_collective_was_issued(tmp_path: Path) -> None:
    out = tmp_path / "fr"
    done = subprocess.run(
        [sys.executable, "-c", RANK, str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    name, entries = done.stdout.split()
    assert name == "fr_trace_rank_0.stacks" and int(entries) >= 5
    assert sorted(p.name for p in out.iterdir()) == [
        "fr_trace_rank_0",
        "fr_trace_rank_0.stacks",
        "sentinel_fr_meta.0.json",
    ]
    trace = pickle.loads((out / name).read_bytes())
    frames = [f.get("name") for e in trace["entries"] for f in e.get("frames", [])]
    assert "issue_the_reductions" in frames
    plain = pickle.loads((out / "fr_trace_rank_0").read_bytes())
    assert not any(e.get("frames") for e in plain["entries"])  # the plain dump has none
    dumps = load_dir(out)
    assert list(dumps.summaries) == [0] and not dumps.unreadable
