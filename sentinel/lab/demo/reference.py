"""The clean reference run: the same trainer configuration with no fault, skipping the batches
the playbooks chose to skip, so a rollback-and-resume repair can be checked bit for bit.

Runs are cached by a hash of (trainer arguments, skip list) under
`~/.cache/sentinel/lab/demo-reference/` (override with SENTINEL_DEMO_CACHE); the trainer is
launched as a subprocess, never imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("SENTINEL_DEMO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "sentinel" / "demo-reference"


@dataclass(frozen=True)
class Reference:
    digest: str
    steps: list[tuple[int, float]]  # (step, loss)
    cached: bool


def skip_flag(skip: list[tuple[int, int]]) -> list[str]:
    return ["--skip-batches", ",".join(f"{lo}-{hi}" for lo, hi in sorted(skip))] if skip else []


def cache_key(world: int, train_args: list[str], skip: list[tuple[int, int]]) -> str:
    doc = json.dumps({"world": world, "args": train_args, "skip": sorted(skip)}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


def read_run(metrics: Path) -> tuple[str | None, list[tuple[int, float]]]:
    digest, steps = None, {}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        rec = json.loads(line)
        if "digest" in rec:
            digest = str(rec["digest"])
        elif "step" in rec and "loss" in rec:
            steps[int(rec["step"])] = float(rec["loss"])
    return digest, sorted(steps.items())


def reference_run(
    world: int,
    train_args: list[str],
    skip: list[tuple[int, int]],
    data_dir: Path,
    timeout_s: float = 1800.0,
    replicas: int = 1,
) -> Reference:
    """`train_args` are the model/parallelism flags (no --out/--ckpt-dir/--faults); with
    `replicas`, the run is the replica mode's (`world` ranks in that many gangs, a lighthouse)."""
    key = cache_key(world, train_args, skip)
    done = cache_root() / key
    digest, steps = read_run(done / "metrics.jsonl")
    if digest is not None:
        return Reference(digest, steps, cached=True)
    work = cache_root() / f"{key}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    argv = [
        *train_args,
        *skip_flag(skip),
        "--out",
        str(work),
        "--data-dir",
        str(data_dir),
        "--ckpt-dir",
        str(work / "ckpt"),
        "--quiet",
    ]
    cmd = [
        sys.executable,
        "-m",
        "trainer_hooks.reference.launch",
        "--nproc",
        str(world // replicas),
        "--replicas",
        str(replicas),
        "--fork",
        "--log-dir",
        str(work / "logs"),
        "--timeout",
        str(timeout_s),
        "--",
        *argv,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    shutil.rmtree(done, ignore_errors=True)
    work.rename(done)
    digest, steps = read_run(done / "metrics.jsonl")
    if digest is None:
        raise RuntimeError(f"reference run wrote no digest in {done}/metrics.jsonl")
    return Reference(digest, steps, cached=False)
