"""Peer-outlier detection over a simulated day of a 1,000-GPU fleet: false flags and recall.

    python benchmarks/agent_outliers.py [--hours 24] [--nodes 125] [--seed 7]

Runs the agent's own detector (`sentinel.agent.health.outliers.PeerOutliers`, default thresholds)
node by node, poll by poll at 1 Hz, on readings with realistic noise:

- each node runs one job: busy (95-100% util) with short idle spells (a checkpoint or eval
  every ~30 minutes, ~1 minute long) shared by its 8 GPUs;
- power: the job's common-mode draw wandering around 620 W (AR(1), sd 30 W), a per-GPU offset
  (silicon, sd 12 W) and per-poll noise (step phase, sd 20 W);
- temperature: inlet + thermal resistance x power smoothed over ~20 s (resistance varies
  +-6% between board positions) + AR(1) sensor noise (sd 0.5 C); one-poll sensor spikes
  (+10 C) at 2e-6 per GPU-poll;
- SM clock: the node's clocks under the power cap (1,755-1,980 MHz, common mode) + per-GPU
  jitter of a 15 MHz step; one-poll dips of 300 MHz at 2e-6 per GPU-poll;
- corrected errors: none, but for rare bursts that stay under every limit.

False flags: `peer_outlier` findings raised on a fault-free fleet over `--hours` (through the
rule's raise, clear and hold, as the agent raises them), scaled to per 1,000 GPUs per day
(target <= 1). Recall: `--faults` nodes each get one GPU made odd (hotter at the same power,
clocks cut, power cut, or an error-rate burst) after 30 fine polls (an agent just started: the
detector has had little time to learn each GPU's place), every node busy throughout, and count
as found when the detector flags that GPU, and only it, by the second poll. Fault sizes: +10..15 C at the same power, clocks 12..22%
lower, power 25..40% lower, 100..500 corrected errors a minute. Prints one JSON line; its
`false_flags` lists what raised each false finding (the first 50: poll, node, GPU, the
detector's reason).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.agent.health.holds import Holds  # noqa: E402
from sentinel.agent.health.outliers import PeerOutliers  # noqa: E402
from sentinel.agent.nvml.readings import GpuReading  # noqa: E402
from sentinel.config import HealthThresholds  # noqa: E402
from sentinel.faults.catalog import rule  # noqa: E402
from sentinel.protocol import Finding  # noqa: E402

PEER_OUTLIER = rule("peer_outlier")

GPUS = 8
FAULTS = ("hot_at_power", "clocks_cut", "power_cut", "error_burst")


@dataclass
class Fleet:
    """Noise state of `nodes` nodes of 8 GPUs, advanced one 1 s poll at a time."""

    nodes: int
    rng: np.random.Generator
    idle_spells: bool = True  # False: every node stays busy (the recall trials)

    def __post_init__(self) -> None:
        n, r = self.nodes, self.rng
        self.busy = np.ones(n, dtype=bool)
        self.node_power = np.full(n, 620.0)
        self.node_clock = np.full(n, 1900.0)
        self.power_offset = r.normal(0, 12, (n, GPUS))
        self.resistance = 0.045 * (1 + r.normal(0, 0.06, (n, GPUS)))
        self.inlet = r.normal(28, 1.5, (n, 1))
        self.smooth_power = np.full((n, GPUS), 620.0)
        self.temp_noise = np.zeros((n, GPUS))

    def step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(util %, power W, temperature C, SM clock MHz) of every GPU, shape (nodes, 8)."""
        n, r = self.nodes, self.rng
        flip = r.random(n)
        if self.idle_spells:
            self.busy = np.where(self.busy, flip >= 1 / 1800, flip < 1 / 60)
        self.node_power = 620 + 0.95 * (self.node_power - 620) + r.normal(0, 30 * 0.31, n)
        self.node_clock = np.clip(
            1868 + 0.97 * (self.node_clock - 1868) + r.normal(0, 25, n), 1755, 1980
        )
        busy = self.busy[:, None]
        util = np.where(busy, r.integers(95, 101, (n, GPUS)), r.integers(0, 11, (n, GPUS)))
        power = np.where(
            busy,
            self.node_power[:, None] + self.power_offset + r.normal(0, 20, (n, GPUS)),
            120 + r.normal(0, 5, (n, GPUS)),
        )
        self.smooth_power += (power - self.smooth_power) / 20
        self.temp_noise = 0.9 * self.temp_noise + r.normal(0, 0.5 * 0.436, (n, GPUS))
        temp = self.inlet + self.resistance * self.smooth_power + self.temp_noise
        temp += 10 * (r.random((n, GPUS)) < 2e-6)
        clock = np.where(
            busy,
            np.round((self.node_clock[:, None] + r.normal(0, 10, (n, GPUS))) / 15) * 15,
            345,
        )
        clock -= 300 * (r.random((n, GPUS)) < 2e-6)
        return util, power, temp, clock


def readings(
    util: list[int], power: list[float], temp: list[float], clock: list[float]
) -> list[GpuReading]:
    """One node's readings, from its rows of the fleet's arrays (as Python lists)."""
    return [
        GpuReading(index=g, util_gpu_pct=u, power_w=p, temp_gpu_c=t, sm_clock_mhz=int(c))
        for g, (u, p, t, c) in enumerate(zip(util, power, temp, clock, strict=True))
    ]


def detectors(nodes: int) -> list[PeerOutliers]:
    t = HealthThresholds()
    return [PeerOutliers(t.outlier_z, t.outlier_polls) for _ in range(nodes)]


def false_flags(nodes: int, polls: int, seed: int) -> dict[str, object]:
    """Flags as the agent raises them: `peer_outlier` through the rule's own raise, clear and
    hold (sentinel/agent/health/holds.py), one poll a second."""
    fleet = Fleet(nodes, np.random.default_rng(seed))
    found = detectors(nodes)
    holds = Holds()
    raised: set[tuple[int, int]] = set()
    episodes = 0
    flags: list[dict[str, object]] = []  # what raised each episode, for the first 50
    quiet = {g: 0.0 for g in range(GPUS)}
    start = time.process_time()
    for t in range(polls):
        rows = [a.tolist() for a in fleet.step()]
        for n in range(nodes):
            node = readings(rows[0][n], rows[1][n], rows[2][n], rows[3][n])
            for g, (why, clear) in found[n].update(node, quiet).items():
                if why is None and (n, g) not in raised:
                    continue  # quiet and nothing held: the agent's fast path
                finding = (
                    None
                    if why is None
                    else Finding(
                        rule="peer_outlier",
                        verdict=PEER_OUTLIER.verdict,
                        action=PEER_OUTLIER.action,
                        detail=why,
                    )
                )
                up = holds.step((n, g), PEER_OUTLIER, finding, lambda c=clear: c, float(t))
                if up is not None and (n, g) not in raised:
                    episodes += 1
                    raised.add((n, g))
                    if len(flags) < 50:
                        flags.append({"poll": t, "node": n, "gpu": g, "why": why})
                elif up is None:
                    raised.discard((n, g))
    cpu_s = time.process_time() - start
    gpu_days = nodes * GPUS * polls / 86_400
    return {
        "fleet_gpus": nodes * GPUS,
        "simulated_hours": round(polls / 3600, 2),
        "false_flag_episodes": episodes,
        "false_flags": flags,
        "false_flags_per_1000_gpu_days": round(episodes / gpu_days * 1000, 3),
        "detector_us_per_node_poll": round(cpu_s / (nodes * polls) * 1e6, 1),
    }


def recall(faults: int, seed: int) -> dict[str, object]:
    """Each fault on its own node: 30 fine polls, then one GPU odd from poll 30 on."""
    rng = np.random.default_rng(seed + 1)
    # Every node busy throughout: a fault is judged at like load (the idle spells are above).
    fleet = Fleet(faults, rng, idle_spells=False)
    found = detectors(faults)
    kinds = [FAULTS[i % len(FAULTS)] for i in range(faults)]
    victim = rng.integers(0, GPUS, faults)
    size = rng.uniform(0, 1, faults)
    hit = {k: 0 for k in FAULTS}
    wrong_gpu = 0
    for poll in range(32):
        util, power, temp, clock = fleet.step()
        rates = [{g: 0.0 for g in range(GPUS)} for _ in range(faults)]
        if poll >= 30:
            for n, kind in enumerate(kinds):
                g, s = victim[n], size[n]
                if kind == "hot_at_power":
                    temp[n, g] += 10 + 5 * s  # +10..15 C at the same power
                elif kind == "clocks_cut":
                    clock[n, g] *= 0.88 - 0.1 * s  # 12..22% lower
                elif kind == "power_cut":
                    power[n, g] *= 0.75 - 0.15 * s  # 25..40% lower at the same util
                else:
                    rates[n][int(g)] = 100 + 400 * s  # corrected errors per minute
        rows = [a.tolist() for a in (util, power, temp, clock)]
        for n in range(faults):
            node = readings(rows[0][n], rows[1][n], rows[2][n], rows[3][n])
            flags = found[n].update(node, rates[n])
            odd = {g for g, (why, _) in flags.items() if why is not None}
            if poll < 30 and odd:
                wrong_gpu += len(odd)
            if poll == 31:
                hit[kinds[n]] += odd == {int(victim[n])}
                wrong_gpu += len(odd - {int(victim[n])})
    per_kind = {k: round(hit[k] / kinds.count(k), 3) for k in FAULTS}
    return {
        "faults": faults,
        "recall_within_2_polls": round(sum(hit.values()) / faults, 3),
        "recall_by_kind": per_kind,
        "flags_on_other_gpus": wrong_gpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0, help="simulated time (default 24)")
    parser.add_argument("--nodes", type=int, default=125, help="8-GPU nodes (default 125)")
    parser.add_argument(
        "--faults", type=int, default=400, help="recall trials (default 400; 0: none)"
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    start = time.monotonic()
    figures: dict[str, object] = {"benchmark": "agent_outliers"}
    if args.faults:  # none: the false-flag day alone (a fleet split over processes)
        figures |= recall(args.faults, args.seed)
    figures |= false_flags(args.nodes, int(args.hours * 3600), args.seed)
    figures["target_false_flags_per_1000_gpu_days"] = 1.0
    figures["wall_s"] = round(time.monotonic() - start, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
