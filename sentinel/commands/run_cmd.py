"""`sentinel run [--config FILE] [--launcher local|slurm] -- TRAINER_COMMAND...`: the job
supervisor."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.commands.status_cmd import coordinator_option
from sentinel.exitcodes import InputError
from sentinel.inputs import read_text, read_token, writable_dir

log = logging.getLogger("sentinel.supervisor")

if TYPE_CHECKING:
    from sentinel.config import SupervisorConfig
    from sentinel.supervisor.launcher import Launcher


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="supervise a training job (launch, watch, restart on command)")
    p.add_argument("--config", type=Path, help="config file; section `supervisor`")
    p.add_argument(
        "--launcher",
        choices=["local", "slurm"],
        help="local: ranks as local processes; slurm: a job step per generation in this Slurm "
        "allocation (or one asked for with salloc)",
    )
    p.add_argument(
        "--ranks",
        choices=["warm", "cold"],
        help="warm (default): rank processes outlive a repair and a spare's wait with the "
        "trainer imported; cold: new processes for every generation (supervisor.ranks)",
    )
    p.add_argument(
        "--recovery",
        choices=["live", "warm_restart", "restart"],
        help="the repair path for every fault where the fault allows it (default: each "
        "fault's own, from the fault catalog; supervisor.recovery)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        help="data-parallel replicas as fault domains (the trainer's --replicas ft --dp N): a "
        "fault confined to one is repaired live, the others never stop (supervisor.replicas)",
    )
    p.add_argument("--job-id", help="job id (default from config)")
    coordinator_option(p, "supervisor.coordinator_url")
    p.add_argument("--token-file", type=Path, help="file holding a job (or admin) token")
    p.add_argument("--nodes", type=int, help="simulated nodes for the local launcher")
    p.add_argument("--gpus-per-node", type=int, help="ranks per simulated node (local launcher)")
    p.add_argument("--spares", type=int, help="hot spares the coordinator may swap in")
    p.add_argument(
        "--checkpoint-dir", type=Path, help="where the trainer writes step_N checkpoints"
    )
    p.add_argument(
        "--rank-socket-template",
        help='node agent socket per rank, "{node}" replaced (e.g. /run/sentinel/{node}.sock)',
    )
    p.add_argument("--fr-dir", type=Path, help="where ranks dump flight recorders (analyzed here)")
    p.add_argument("--log-dir", type=Path, help="write each rank's output here")
    p.add_argument(
        "--exclude-file",
        type=Path,
        help="nodes to leave out before launch, one per line (a burn-in's --exclude-out); "
        "spares take their places",
    )
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="-- TRAINER_COMMAND...")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from pydantic import ValidationError

    from sentinel.config import ConfigError, config_errors, load_config
    from sentinel.supervisor.launcher import per_node
    from sentinel.supervisor.supervisor import Supervisor

    argv = list(args.trainer)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("no trainer command: use `sentinel run [options] -- TRAINER_COMMAND...`")
    cfg = load_config(args.config).supervisor
    overrides = {
        k: v
        for k, v in {
            "launcher": args.launcher,
            "ranks": args.ranks,
            "recovery": args.recovery,
            "replicas": args.replicas,
            "job_id": args.job_id,
            "coordinator_url": args.coordinator,
            "token_file": args.token_file,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "spares": args.spares,
            "checkpoint_dir": args.checkpoint_dir,
            "rank_socket_template": args.rank_socket_template,
            "fr_dir": args.fr_dir,
        }.items()
        if v is not None
    }
    try:
        cfg = cfg.model_validate({**cfg.model_dump(), **overrides})
    except ValidationError as e:
        raise ConfigError("command line", config_errors(e)) from None
    token = os.environ.get("SENTINEL_TOKEN")
    if cfg.token_file is not None:
        token = read_token(cfg.token_file, "--token-file")
    if not token:
        raise InputError("no token: pass --token-file FILE or set SENTINEL_TOKEN")
    if cfg.launcher == "local":  # on Slurm the nodes' own filesystems hold the trainer
        runnable(argv[0])
        for option, where in (
            ("supervisor.checkpoint_dir", cfg.checkpoint_dir),
            ("supervisor.fr_dir", cfg.fr_dir),
        ):
            if where is not None and not per_node(str(where)):
                writable_dir(where, option)
    if args.log_dir is not None:
        writable_dir(args.log_dir, "--log-dir")
    exclude = read_exclude(args.exclude_file)
    control = (args.log_dir or Path(".")) / f"{cfg.job_id}.control.jsonl"
    if cfg.ranks == "warm" and not warm_capable(argv):
        log.warning(
            "warm ranks run a trainer given as `python -m MODULE ...`; this job's ranks are "
            "started anew for every generation (supervisor.ranks: cold)"
        )
        cfg = cfg.model_copy(update={"ranks": "cold"})
    with make_launcher(cfg, args.log_dir) as launcher:
        try:
            sup = Supervisor(cfg, argv, launcher, token, control.resolve(), exclude)
        except ValueError as e:
            raise InputError(f"cannot place the gang: {e}") from None
        return asyncio.run(sup.run())


def runnable(program: str) -> None:
    """InputError unless `program` is an executable file, as a path or on PATH."""
    if shutil.which(program) is None:
        where = "not an executable file" if "/" in program else "not found on PATH"
        raise InputError(f"the trainer command {program!r}: {where}")


def warm_capable(argv: list[str]) -> bool:
    """A trainer warm ranks can run: `[python] -m MODULE ...` (its `main(argv)` is called once
    per generation in a process that outlives it)."""
    from sentinel.ranks.host import trainer_module

    try:
        trainer_module(argv)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def make_launcher(cfg: SupervisorConfig, log_dir: Path | None) -> Iterator[Launcher]:
    """The configured launcher (warm or cold ranks); for Slurm, in the current allocation or in
    one asked for here (and given back when the job ends). Whatever it keeps is ended after."""
    from sentinel.supervisor.launcher import LocalLauncher
    from sentinel.supervisor.warm import LocalHosts, WarmLauncher

    if cfg.launcher == "local":
        launcher: Launcher = (
            WarmLauncher(LocalHosts(log_dir), log_dir, cfg.leave_grace_s)
            if cfg.ranks == "warm"
            else LocalLauncher(log_dir)
        )
        try:
            yield launcher
        finally:
            launcher.close()
        return
    from sentinel.slurm.allocation import Allocation, SlurmError
    from sentinel.supervisor.slurm_launcher import SlurmHosts, SlurmLauncher

    try:
        alloc = Allocation.current() or Allocation.request(
            cfg.nodes + cfg.spares, f"sentinel-{cfg.job_id}"
        )
    except SlurmError as e:
        raise InputError(f"--launcher slurm: no allocation to run in: {e}") from None
    try:
        launcher = (
            WarmLauncher(SlurmHosts(alloc, log_dir), log_dir, cfg.leave_grace_s)
            if cfg.ranks == "warm"
            else SlurmLauncher(alloc, log_dir)
        )
        try:
            yield launcher
        finally:
            launcher.close()
    finally:
        alloc.release()


def read_exclude(path: Path | None) -> frozenset[str]:
    """Node names, one per line; blank lines and `#` comments ignored."""
    if path is None:
        return frozenset()
    lines = read_text(path, "--exclude-file: node names, one per line").splitlines()
    names = [ln.split("#", 1)[0].strip() for ln in lines]
    bad = [n for n in names if n and not re.fullmatch(r"(node|spare)-\d+", n)]
    if bad:
        raise InputError(f"--exclude-file {path}: not node names: {', '.join(bad)}")
    return frozenset(n for n in names if n)
