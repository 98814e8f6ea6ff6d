"""What every rank runs: set up the process group, run the selected phases, judge on rank 0.

All ranks execute the same sequence of collectives; measurements are gathered with
all_gather_object so every rank takes the same decisions (the bisection search needs that).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sentinel.burnin import collectives, links, sdc, stragglers
from sentinel.burnin.comm import Comm, Compute
from sentinel.burnin.faults import drift_env, faults_for_rank, inject
from sentinel.burnin.progress import Progress
from sentinel.burnin.report import Findings, assemble, load_baseline
from sentinel.burnin.settings import BurninSettings
from sentinel.fingerprint import drift, node_fields, runtime_fields
from sentinel.stats import median, variance

RETEST_TRIALS = 3  # a flagged node's links get this many times the trials in a second pass
BISECTION_FROM_NODES = 16  # `auto`: the circle search up to this many nodes, bisection above


def node_name() -> str:
    return (
        os.environ.get("SENTINEL_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    )


def _setup(settings: BurninSettings) -> tuple[Comm, Compute]:
    if settings.scenario:  # before the process group: NCCL reads its environment there
        os.environ.update(drift_env(settings.scenario, node_name()))
    use_cuda = settings.backend == "nccl" or (
        settings.backend == "auto" and torch.cuda.is_available()
    )
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    node_of: list[Any] = [None] * world
    dist.all_gather_object(node_of, node_name())
    comm, compute = Comm(rank, world, node_of, device), Compute(device)
    if settings.scenario:
        local = [r for r, n in enumerate(node_of) if n == node_of[rank]].index(rank)
        comm, compute = inject(
            comm, compute, faults_for_rank(settings.scenario, rank, comm.node, local)
        )
    return comm, compute


def _drift(comm: Comm, s: BurninSettings, f: Findings) -> dict[str, Any]:
    """Before anything is measured: every node's fingerprint as its ranks see it (the Python,
    torch and NCCL they run, their NCCL_* / FI_* environment, the kernel; a field its ranks
    hold differently kept per local rank: `fingerprint.node_fields`), and the nodes off the
    fleet's majority named with what differs (sentinel/fingerprint.py)."""
    prints: list[Any] = [None] * comm.world
    dist.all_gather_object(prints, runtime_fields())
    by_node: dict[str, list[dict[str, str]]] = {}
    for rank, fields in enumerate(prints):  # ranks in order: local ranks in order per node
        by_node.setdefault(comm.node_of[rank], []).append(fields)
    found = drift({n: node_fields(ranks) for n, ranks in by_node.items()}, s.allow_drift)
    for d in found:
        f.blame_node(d.node, d.reason())
    drifted = [{"node": d.node, "reason": d.reason()} for d in found]
    return {"drift": {"nodes": len(by_node), "allowed": list(s.allow_drift), "drifted": drifted}}


def _collectives(
    comm: Comm, s: BurninSettings, f: Findings, base: dict[str, Any]
) -> dict[str, Any]:
    sizes = s.sizes()
    bar = Progress("collectives", len(collectives.OPS) * len(sizes), comm.rank == 0 and s.progress)
    rows = []
    for op in collectives.OPS:
        for size in sizes:
            rows.append(collectives.measure(comm, op, size, s.warmup, s.iters))
            bar.step(f"{op} {size} B")
    for row in rows:
        for r in row["incorrect_ranks"]:
            f.blame_rank(r, f"wrong result in {row['op']} of {row['bytes']} bytes")
        # judged at the sweep's largest size only: small messages measure latency and jitter
        was = base.get("busbw_gbps", {}).get(f"{row['op']}:{row['bytes']}")
        if (
            row["bytes"] == max(r["bytes"] for r in rows if r["op"] == row["op"])
            and was
            and variance(row["busbw_gbps"], was) < -s.thresholds.baseline_tolerance
        ):
            f.fleet_reasons.append(
                f"{row['op']} {row['bytes']} B busbw {row['busbw_gbps']:.3f} GB/s is "
                f"{variance(row['busbw_gbps'], was):+.0%} against baseline {was:.3f}"
            )
    bar.finish(f"{len(rows)} measurements, {sum(not r['correct'] for r in rows)} incorrect")
    return {"collectives": rows}


def _intra_node(
    comm: Comm, s: BurninSettings, intra: list[tuple[str, int, int]], turns: bool
) -> links.LinkVerdicts:
    """Each node's pair of local ranks, judged against the other nodes' pairs. A flagged pair
    gets the same second, longer look as a flagged node's links."""

    def judged(gbps: list[float]) -> links.LinkVerdicts:
        return links.judge_intra(
            [(n, a, b, g) for (n, a, b), g in zip(intra, gbps, strict=True)], s.thresholds
        )

    (gbps,) = links.measure_rounds(
        comm, [[[a, b] for _, a, b in intra]], s.link_bytes, s.link_trials, turns
    )
    verdicts = judged(gbps)
    flagged = [i for i, (node, *_) in enumerate(intra) if node in verdicts.node_reasons]
    if not flagged:
        return verdicts
    (again,) = links.measure_rounds(
        comm,
        [[[intra[i][1], intra[i][2]] for i in flagged]],
        s.link_bytes,
        RETEST_TRIALS * s.link_trials,
        turns,
    )
    for i, g in zip(flagged, again, strict=True):
        gbps[i] = max(gbps[i], g)
    return judged(gbps)


def _links(comm: Comm, s: BurninSettings, f: Findings, base: dict[str, Any]) -> dict[str, Any]:
    lead = links.leaders(comm.node_of)
    nodes = list(lead)
    search = s.link_search
    if search == "auto":
        search = "circle" if len(nodes) <= BISECTION_FROM_NODES else "bisection"
    schedule = links.circle_rounds(nodes) if search in ("circle", "both") else []
    intra = links.intra_pairs(comm.node_of)
    hosts = comm.gather_objects(socket.gethostname())
    turns = comm.device.type != "cuda" and len(set(hosts)) < len(nodes)
    bar = Progress(
        "links", bool(intra) + (s.link_trials if schedule else 0), comm.rank == 0 and s.progress
    )

    def measure(
        rounds: list[list[list[str]]],
        trials: int = s.link_trials,
        on_trial: Callable[[int], None] | None = None,
    ) -> list[list[float]]:
        return links.measure_rounds(
            comm,
            [[[lead[n] for n in ring] for ring in rnd] for rnd in rounds],
            s.link_bytes,
            trials,
            turns,
            on_trial,
        )

    def rings(groups: list[list[str]]) -> list[float]:
        return measure([groups])[0]

    out: dict[str, Any] = {"link_search": {}}
    if intra:
        verdicts = _intra_node(comm, s, intra, turns)
        bar.step("intra-node")
        out["intra_node"] = verdicts.rows
        for node, why in verdicts.node_reasons.items():
            for reason in why:
                f.blame_node(node, reason)
    if schedule:
        gbps_by_round = measure(
            [[list(p) for p in pairs] for pairs in schedule],
            on_trial=lambda t: bar.step(f"trial {t + 1}/{s.link_trials}"),
        )
        matrix: dict[links.Pair, float] = {}
        for pairs, gbps in zip(schedule, gbps_by_round, strict=True):
            matrix.update(zip(pairs, gbps, strict=True))
        verdicts = links.judge_matrix(nodes, matrix, s.thresholds, base.get("node_link_gbps"))
        # A flagged node's links are measured once more, with RETEST_TRIALS times the trials,
        # and each keeps its better figure: a slow link is slow however often it is tried; a
        # burst of load, or ranks descheduled through the whole first pass (a 2-core CI host
        # put two healthy nodes 41% under their peers), is over by then. Every rank holds the
        # same verdicts, so all re-measure alike.
        suspects = set(verdicts.node_reasons)
        retest = [r for r in ([p for p in pairs if suspects & set(p)] for pairs in schedule) if r]
        if retest:
            again = measure(
                [[list(p) for p in pairs] for pairs in retest], RETEST_TRIALS * s.link_trials
            )
            for pairs, gbps in zip(retest, again, strict=True):
                matrix.update({p: max(matrix[p], g) for p, g in zip(pairs, gbps, strict=True)})
        if suspects:
            verdicts = links.judge_matrix(nodes, matrix, s.thresholds, base.get("node_link_gbps"))
        out["links"] = verdicts.rows
        out["link_search"].update(
            circle={"rounds": len(schedule), "retested": sorted(suspects)},
            reference_gbps=round(verdicts.reference_gbps, 4),
            node_scores={n: round(v, 4) for n, v in verdicts.node_scores.items()},
        )
        for node, why in verdicts.node_reasons.items():
            for reason in why:
                f.blame_node(node, reason)
    if search in ("bisection", "both"):
        found = links.bisect(nodes, rings, s.thresholds.link_tolerance)
        out["link_search"]["bisection"] = {
            "rounds": found.rounds,
            "bound": links.bisection_round_bound(len(nodes)),
            "found": found.found,
            "note": found.note,
            "trace": found.trace,
        }
        if found.found and search == "bisection":
            f.blame_node(
                found.found,
                f"links: bisection isolated it in {found.rounds} rounds "
                f"(group GB/s per round: {[t['gbps'] for t in found.trace]})",
            )
    bar.finish(f"{len(schedule)} circle rounds")
    return out


def _stragglers(
    comm: Comm, compute: Compute, s: BurninSettings, f: Findings, base: dict[str, Any]
) -> dict[str, Any]:
    bar = Progress("stragglers", 2, comm.rank == 0 and s.progress)
    size = s.gemm_size_gpu if comm.device.type == "cuda" else s.gemm_size

    def screen() -> tuple[list[stragglers.RankTiming], list[int], dict[int, str]]:
        timings = stragglers.measure(
            comm, compute, size, s.gemm_rounds, s.gemm_reps, s.membw_bytes, s.seed
        )
        return timings, *stragglers.judge(timings, s.thresholds, base.get("gemm_s"))

    timings, flagged, reasons = screen()
    bar.step("screen")
    slow = [r for r in flagged if timings[r].error is None]  # failed GPUs are not slow ones
    near = stragglers.near_the_line(timings, s.thresholds)
    if slow or near:
        # Every rank takes the same decision here (the timings were gathered everywhere), so
        # all measure again; the slow ranks, and those one pass left near the line, are judged
        # on both passes' rounds.
        timings = stragglers.pooled(timings, screen()[0])
        suspects = sorted(set(slow) | set(near))
        kept = stragglers.confirm(suspects, timings, s.thresholds, base.get("gemm_s"))
        reasons = {r: why for r, why in reasons.items() if r not in slow} | kept
        flagged, slow = sorted(reasons), sorted(kept)
    bar.step("confirmation" if slow else "")
    for r in flagged:
        f.blame_rank(r, reasons[r])
    flagged = slow
    bar.finish(f"flagged {flagged}")
    good = [t.gemm_s for t in timings if t.error is None]
    ok = {r: t.gemm_rounds for r, t in enumerate(timings) if t.error is None and t.gemm_rounds}
    relative = stragglers.round_scores(ok) if ok else {}
    return {
        "stragglers": flagged,
        "straggler_detail": {
            "median_gemm_s": median(good) if good else None,
            "ranks": {
                str(r): {
                    "gemm_ms": round(t.gemm_s * 1e3, 3),
                    "tflops": round(stragglers.gemm_tflops(size, t.gemm_s), 4),
                    "membw_gbps": round(t.membw_gbps, 2),
                    "relative_time": round(relative.get(r, float("nan")), 4),
                }
                if t.error is None
                else {"error": t.error}
                for r, t in enumerate(timings)
            },
        },
    }


def _sdc(comm: Comm, compute: Compute, s: BurninSettings, f: Findings) -> dict[str, Any]:
    bar = Progress("sdc", 1, comm.rank == 0 and s.progress)
    digests = sdc.measure(comm, compute, s.sdc_size, s.sdc_chain, s.seed)
    flagged, reasons = sdc.judge(digests)
    for r in flagged:
        f.blame_rank(r, f"SDC: {reasons[r]}")
    flagged = [r for r in flagged if digests[r].error is None]
    bar.step()
    bar.finish(f"mismatched {flagged}")
    return {
        "sdc": {
            "mismatched_ranks": flagged,
            "digests": {str(r): d.first for r, d in enumerate(digests)},
        }
    }


def run_rank(settings: BurninSettings) -> dict[str, Any] | None:
    """Run the burn-in in this rank; rank 0 returns the report, others None."""
    t0 = time.monotonic()
    comm, compute = _setup(settings)
    base = load_baseline(Path(settings.baseline_path)) if settings.baseline_path else {}
    findings = Findings(list(comm.node_of))
    sections: dict[str, Any] = {"phases": list(settings.phases)}
    try:
        if "drift" in settings.phases:
            sections.update(_drift(comm, settings, findings))
        if "collectives" in settings.phases:
            sections.update(_collectives(comm, settings, findings, base))
        if "links" in settings.phases:
            sections.update(_links(comm, settings, findings, base))
        if "stragglers" in settings.phases:
            sections.update(_stragglers(comm, compute, settings, findings, base))
        if "sdc" in settings.phases:
            sections.update(_sdc(comm, compute, settings, findings))
        comm.barrier()
    finally:
        dist.destroy_process_group()
    if comm.rank != 0:
        return None
    sections["duration_s"] = round(time.monotonic() - t0, 2)
    report = assemble(findings, sections)
    if settings.result_path:
        Path(settings.result_path).write_text(json.dumps(report, indent=2))
    return report
