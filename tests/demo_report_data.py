"""A realistic synthetic demo for the report's tests: three generations of an 8-rank gang on
nodes that changed under it, a rollback after each fault, a hang, a straggler, a burn-in that
failed one node's links, and the run's time account."""

from __future__ import annotations

import copy
import math
from typing import Any

from burnin_sample import SAMPLE_REPORT

from sentinel.lab.demo.data import DemoData, RankSample, StepPoint, TimelineEntry
from sentinel.lab.demo.result import Generation

EVIL = "rank-5<script>alert(1)</script>"


def _loss(step: int) -> float:
    return 4.0 * math.exp(-step / 40) + 1.5


# Where the gang ran: burn-in excluded node-3 before the launch, so spare-0 took its place;
# the ECC error on node-2 then swapped spare-1 in for it. Ranks 6-7 never ran on node-3.
GENERATIONS = [
    Generation(0.0, 0, ("node-0", "node-1", "node-2", "spare-0")),
    Generation(40.0, 1, ("node-0", "node-1", "spare-1", "spare-0")),
    Generation(100.0, 2, ("node-0", "node-1", "spare-1", "spare-0")),
]
RUNS = {0: range(1, 48), 1: range(41, 104), 2: range(101, 121)}  # steps each generation ran
CHECKPOINTS = [20, 40, 60, 80, 100, 120]


def _t(gen: int, step: int) -> float:
    return GENERATIONS[gen].t + 0.3 * (step - RUNS[gen].start + 1)


def make_data() -> DemoData:
    """Generation 0 trains steps 1-47: an ECC error on node-2 at step 45 is detected at 47 and
    the job stops in step 48. Generation 1 resumes from checkpoint 40 and trains 41-103: rank 6
    hangs in step 104. Generation 2 resumes from checkpoint 100 and finishes at 120. Rank 5 is
    a straggler (1.3x); step 31's loss spikes far off the scale."""
    steps = [StepPoint(s, _loss(s), g, _t(g, s)) for g, run in RUNS.items() for s in run]
    steps[30] = StepPoint(31, 55.0, 0, _t(0, 31))
    reference = [StepPoint(s, _loss(s), 0, 0.5 * s) for s in range(1, 121)]
    ranks = [
        RankSample(
            r,
            s,
            0.5 * (1.3 if r == 5 else 1.0) + 0.001 * r,
            0.31 if r != 5 else 0.24,
            generation=g,
            t=_t(g, s),
        )
        for g, run in RUNS.items()
        for s in run
        for r in range(8)
    ]
    return DemoData(
        copy.deepcopy(RESULT),
        steps,
        reference,
        ranks,
        burnin(),
        timeline(),
        generations=GENERATIONS,
        gpus_per_node=2,
        checkpoints=CHECKPOINTS,
    )


def burnin() -> dict[str, Any]:
    """Node-3's links failed: burn-in excluded it before the launch."""
    nodes = {f"node-{i}": {"verdict": "pass", "reasons": []} for i in range(4)}
    nodes["node-3"] = {"verdict": "fail", "reasons": ["link node-3<->node-0: 0.25 GB/s"]}
    links = [
        {
            "a": f"node-{a}",
            "b": f"node-{b}",
            "gbps": 0.25 if 3 in (a, b) else 1.0,
            "verdict": "fail" if 3 in (a, b) else "pass",
        }
        for a in range(4)
        for b in range(a + 1, 4)
    ]
    burnin = {
        "verdict": "fail",
        "nodes": nodes,
        "links": links,
        "exclude": ["node-3"],
        "collectives": SAMPLE_REPORT["collectives"][:1],
    }
    return burnin


def timeline() -> list[TimelineEntry]:
    timeline = [
        TimelineEntry(1.0, None, "burnin", "node-3", "link node-3 slow: excluded"),
        TimelineEntry(15.0, 30, "fault", EVIL, "straggler injected", ref="fault:1"),
        TimelineEntry(16.5, 33, "detect", EVIL, "straggler detected"),
        TimelineEntry(22.5, 45, "fault", "node-2", "ecc_dbe injected", ref="fault:0"),
        TimelineEntry(23.7, 47, "incident", "node-2", "inc-1 opened"),
        TimelineEntry(24.0, None, "action", "node-2", "cordon node-2"),
        TimelineEntry(30.0, None, "action", "spare-0", "swap in spare-0"),
        TimelineEntry(45.2, 41, "resume", None, "resumed from step 40"),
    ]
    return timeline


RESULT: dict[str, Any] = {
    "verdict": "pass",
    "scenario": "default",
    "completed_steps": 120,
    "incidents": [
        {
            "id": "inc-1",
            "kind": "ecc_dbe",
            "target": "node-2",
            "detected_step": 47,
            "actions": ["cordon node-2", "swap in spare-0", "rollback to step 40"],
            "resolution": "resolved",
            "stages": {
                "detected": 40.0,
                "decided": 40.5,
                "drained": 41.0,
                "restart": 41.25,
                "relaunched": 44.0,
                "rendezvoused": 45.0,
                "checkpoint_loaded": 47.0,
                "first_step": 50.0,
            },
        },
        {
            "id": "inc-2",
            "kind": "straggler",
            "target": EVIL,
            "detected_step": 33,
            "actions": [{"kind": "evict", "target": "node-2"}],
            "resolution": "resolved",
        },
    ],
    "faults": [
        {
            "kind": "ecc_dbe",
            "target": "node-2",
            "injected_step": 45,
            "detected": True,
            "detected_step": 47,
            "incident": "inc-1",
            "actions": ["cordon node-2"],
            "time_to_detect_s": 1.2,
            "time_to_resume_s": 21.5,
        },
        {
            "kind": "straggler",
            "target": EVIL,
            "injected_step": 30,
            "detected": True,
            "detected_step": 33,
            "incident": "inc-2",
            "actions": [],
            "time_to_detect_s": 4.0,
        },
        {
            "kind": "hang",
            "target": "rank-6",
            "injected_step": 104,
            "detected": False,
            "detected_step": None,
            "incident": None,
            "actions": [],
        },
    ],
    "false_incidents": [],
    "evicted_nodes": ["node-2"],
    "final_digest": "sha256:abc123",
    "reference_digest": "sha256:abc123",
    "bit_identical": True,
    "time_account": {
        "wall_s": 100.0,
        "seconds": {
            "productive": 80.0,
            "rollback": 5.0,
            "detection": 3.0,
            "repair": 12.0,
            "checkpoint": 0.0,
            "burnin": 0.0,
            "startup": 0.0,
        },
        "repair_stages_s": {
            "stop": 4.0,
            "relaunch": 3.0,
            "rendezvous": 1.0,
            "checkpoint_load": 2.0,
            "build": 2.0,
        },
        "effective_ratio": 0.8,
    },
}
