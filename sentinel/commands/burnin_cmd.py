"""`sentinel burnin`: pre-launch burn-in of links, GPUs and arithmetic; writes an exclude list."""

from __future__ import annotations

import argparse
from pathlib import Path

from sentinel.burnin.settings import LINK_SEARCHES, PHASES
from sentinel.commands.jsonout import add_json_option


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "burnin",
        help="pre-launch burn-in: collectives, link localization, stragglers, SDC",
        description=(
            "Run under torchrun/Slurm (one process per GPU) or with --sim-nodes for a simulated "
            "fleet of local gloo ranks. Exit 0 pass, 1 a node failed, 2 bad usage."
        ),
    )
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--sim-nodes", type=int, metavar="N", help="simulate N nodes locally")
    fleet.add_argument("--gpus-per-node", type=int, metavar="G", help="ranks per simulated node")
    fleet.add_argument(
        "--scenario",
        metavar="NAME|FILE",
        help="simulated faults to inject first: a shipped scenario name (scenarios/NAME.yaml) or a file",
    )
    fleet.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="collective backend (auto: nccl with GPUs, else gloo)",
    )
    node = p.add_argument_group("validation of one node (before it returns to service)")
    node.add_argument(
        "--validate",
        action="store_true",
        help="test this node alone against --baseline: GEMM timing, SDC recompute, loopback"
        " bandwidth (exit 1: it failed); with --save-baseline alone, record a healthy node",
    )
    node.add_argument("--gpus", type=int, metavar="N", help="GPUs to test (default: all)")
    node.add_argument(
        "--sim-faults", type=Path, metavar="FILE", help="a simulated node's agent faults file"
    )
    run = p.add_argument_group("what to run")
    run.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {PHASES}")
    run.add_argument("--quick", action="store_true", help="small sweep: about a minute")
    run.add_argument("-b", "--min-bytes", help="smallest collective size (default 4K)")
    run.add_argument("-e", "--max-bytes", help="largest collective size (default 16M)")
    run.add_argument("-f", "--step-factor", type=int, help="size multiplier (default 4)")
    run.add_argument("-n", "--iters", type=int, help="timed iterations per size")
    run.add_argument("-w", "--warmup", type=int, help="warm-up iterations per size")
    run.add_argument(
        "--link-search",
        choices=LINK_SEARCHES,
        default="auto",
        help="circle (all pairs), bisection (O(log n) rounds) or both",
    )
    run.add_argument("--link-tolerance", type=float, help="link drop vs the other nodes (0.40)")
    run.add_argument("--straggler-threshold", type=float, help="slowdown that flags (0.04)")
    run.add_argument(
        "--allow-drift",
        action="append",
        default=[],
        metavar="FIELD",
        help="a fingerprint field allowed to differ between nodes (repeatable; fnmatch "
        "patterns: 'env.NCCL_DEBUG*')",
    )
    out = p.add_argument_group("output")
    add_json_option(out, "the report")
    out.add_argument("--exclude-out", type=Path, metavar="FILE", help="write failed node names")
    out.add_argument("--save-baseline", type=Path, metavar="FILE", help="record these figures")
    out.add_argument("--baseline", type=Path, metavar="FILE", help="judge against saved figures")
    out.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from sentinel.burnin.cli import run

    return run(args)
