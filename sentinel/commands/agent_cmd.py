"""`sentinel agent`: the node daemon (run it under systemd; see deploy/systemd)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.commands.status_cmd import coordinator_option
from sentinel.exitcodes import ExitCode, InputError

if TYPE_CHECKING:
    from sentinel.agent.nvml.readings import GpuBackend
    from sentinel.config import AgentConfig

log = logging.getLogger("sentinel.agent")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="node agent: NVML + host collection, health verdicts, /metrics, event relay",
        description="Watch this node's GPUs and host; serve /metrics; relay events.",
    )
    p.add_argument("--config", type=Path, help="YAML or TOML config file (section 'agent')")
    p.add_argument("--listen", metavar="HOST:PORT", help="/metrics address (agent.listen)")
    p.add_argument("--node-id", help="this node's name (agent.node_id; default: hostname)")
    coordinator_option(p, "agent.coordinator_url")
    p.add_argument("--spool-dir", type=Path, help="where undelivered events wait")
    p.add_argument("--rank-socket", type=Path, help="Unix socket for training ranks")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="collection interval")
    p.add_argument(
        "--expected-gpus", type=int, metavar="N", help="GPUs this node should have (default: PCI)"
    )
    p.add_argument(
        "--kmsg", metavar="PATH|off|auto", help="kernel log to watch (agent.kmsg; default auto)"
    )
    sim = p.add_argument_group("simulated GPUs (no NVML needed)")
    sim.add_argument("--sim", action="store_true", help="simulate GPUs instead of NVML")
    sim.add_argument("--gpus", type=int, default=None, help="number of simulated GPUs")
    sim.add_argument(
        "--sim-faults",
        type=Path,
        metavar="FILE",
        help="JSON-lines file of faults to inject into the simulated GPUs as it grows",
    )
    p.set_defaults(handler=run)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    pairs = {
        "listen": args.listen,
        "node_id": args.node_id,
        "coordinator_url": args.coordinator,
        "spool_dir": args.spool_dir,
        "rank_socket": args.rank_socket,
        "interval_s": args.interval,
        "expected_gpus": args.expected_gpus,
        "kmsg": args.kmsg,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from sentinel.agent.host import PsutilHost
    from sentinel.agent.service import Agent
    from sentinel.config import AgentConfig, ConfigError, SimConfig, config_errors, load_config

    cfg = load_config(args.config)
    fields = cfg.agent.model_dump() | _overrides(args)
    if args.sim or args.gpus is not None:
        base = cfg.agent.sim or SimConfig()
        fields["sim"] = base.model_dump() | ({"gpus": args.gpus} if args.gpus else {})
    try:
        agent_cfg = AgentConfig.model_validate(fields)
    except ValidationError as e:
        raise ConfigError("command line", config_errors(e)) from None
    if args.sim_faults and agent_cfg.sim is None:
        raise InputError("--sim-faults needs --sim")
    if args.sim_faults and args.sim_faults.is_dir():  # missing is fine: no fault injected yet
        raise InputError(f"--sim-faults {args.sim_faults}: a directory, not a fault file")

    backend = _backend(agent_cfg, args.sim_faults)
    if backend is None:
        return ExitCode.PROBLEM_FOUND
    agent = Agent(
        agent_cfg, backend, PsutilHost(), config_path=args.config, sim_faults=args.sim_faults
    )
    asyncio.run(agent.run_until_signalled())
    return ExitCode.OK


def _backend(cfg: AgentConfig, faults: Path | None) -> GpuBackend | None:
    if cfg.sim is not None:
        from sentinel.agent.nvml.sim import SimulatedGpus

        return SimulatedGpus(
            cfg.sim.gpus, cfg.sim.model, seed=cfg.sim.seed, faults_file=faults, node_id=cfg.node_id
        )
    from sentinel.agent.nvml.backend import NvmlBackend, NvmlUnavailable

    try:
        return NvmlBackend(slow_every_s=cfg.costly_reads_interval_s)
    except NvmlUnavailable as e:
        log.error("cannot read GPUs: %s (use --sim to run with simulated GPUs)", e)
        return None
