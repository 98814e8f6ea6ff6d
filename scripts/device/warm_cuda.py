"""Warm ranks on a real GPU: the reference trainer on CUDA through the warm launcher.

Run on a GPU machine (scripts/device/warm_cuda.sh): three runs of the same training, one rank
on the GPU each (one GPU: NCCL takes one rank per GPU in a communicator).

- `straight`: one generation, start to end (the reference digest).
- `leave`: generation 0 leaves at a step boundary (a warm restart's healthy leave); generation
  1 runs in the same process, its CUDA context and caching allocator kept, and resumes from
  the last checkpoint.
- `crash`: the rank's process dies at a step (`--fault crash`); generation 1 runs in a process
  forked anew from the node host, which imported the trainer but never touched CUDA.

Both repaired runs must end bit-identical to `straight`. Prints and writes (to the directory in
argv[1]) a JSON object: digests, whether the process was kept, the leave's seconds and each
generation's launch report (rendezvous, checkpoint load, first step).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sentinel.processes import free_rendezvous_port
from sentinel.supervisor.launcher import GangPlan
from sentinel.supervisor.warm import LocalHosts, WarmGang, WarmLauncher

MODEL = [
    "--layers",
    "4",
    "--dim",
    "256",
    "--heads",
    "8",
    "--seq",
    "128",
    "--vocab",
    "1024",
    "--corpus-tokens",
    str(1 << 20),
    "--mbs",
    "8",
    "--accum",
    "2",
    "--warmup",
    "2",
    "--tp",
    "1",
    "--pp",
    "1",
    "--dp",
    "1",
    "--steps",
    "60",
    "--checkpoint-every",
    "10",
    "--quiet",
]


def lines(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def wait(predicate: Any, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.05)


def launch(warm: WarmLauncher, out: Path, generation: int, *extra: str) -> WarmGang:
    argv = [
        sys.executable,
        "-m",
        "trainer_hooks.reference.train",
        *MODEL,
        "--out",
        str(out / "run"),
        "--data-dir",
        str(out / "data"),
        "--ckpt-dir",
        str(out / "ckpt"),
        *extra,
    ]
    plan = GangPlan(
        argv=argv,
        nodes=["node-0"],
        gpus_per_node=1,
        generation=generation,
        master_port=free_rendezvous_port(),
    )
    gang = warm.launch(plan)
    assert isinstance(gang, WarmGang)
    return gang


def newest_checkpoint(out: Path) -> str:
    return str(sorted((out / "ckpt").glob("step*"))[-1])


def digest(out: Path) -> str | None:
    return next((r["digest"] for r in lines(out / "run") if "digest" in r), None)


def run(name: str, root: Path, fault: list[str]) -> dict[str, Any]:
    out = root / name
    warm = WarmLauncher(LocalHosts(out / "logs"), out / "logs")
    try:
        gang = launch(warm, out, 0, *fault)
        pid0 = gang.procs[0].pid
        if name == "straight":
            wait(lambda: gang.running() == 0)
            return {"digest": digest(out)}
        if name == "leave":
            wait(lambda: any(r.get("step", 0) >= 25 for r in lines(out / "run")))
            stop = gang.stop(10.0, keep=frozenset({"node-0"}))
        else:
            wait(lambda: bool(gang.poll()))
            stop = gang.stop(10.0, keep=frozenset({"node-0"}))
        t0 = time.time()
        nxt = launch(warm, out, 1, "--resume-from", newest_checkpoint(out))
        wait(lambda: nxt.running() == 0)
        launches = [r["launch"] for r in lines(out / "run") if "launch" in r]
        return {
            "digest": digest(out),
            "process_kept": nxt.procs[0].pid == pid0,
            "stop_s": round(stop.seconds, 3),
            "relaunch_to_ready_s": round(launches[-1]["ready_at"] - t0, 3),
            "launches": launches,
        }
    finally:
        warm.close()


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "warm-cuda")
    root.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    result["straight"] = run("straight", root, [])
    result["leave"] = run("leave", root, [])
    result["crash"] = run("crash", root, ["--fault", "crash:rank=0,at_step=25"])
    ref = result["straight"]["digest"]
    result["bit_identical"] = {k: result[k]["digest"] == ref for k in ("leave", "crash")}
    text = json.dumps(result, indent=1)
    (root / "warm_cuda.json").write_text(text)
    print(text)
    return 0 if ref and all(result["bit_identical"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
