"""A burn-in report in the JSON contract's shape (DESIGN.md "JSON results"), with node-1 failing
a link, rank 3 a straggler and rank 2 an SDC mismatch, for the burn-in dashboard's tests."""

from __future__ import annotations

from typing import Any

SAMPLE_REPORT: dict[str, Any] = {
    "verdict": "fail",
    "nodes": {
        "node-0": {"verdict": "pass", "reasons": []},
        "node-1": {
            "verdict": "fail",
            "reasons": ["link node-1<->node-0: 0.25 GB/s, 24% of the fleet median", "rank 3 slow"],
        },
    },
    "collectives": [
        {
            "op": "all_reduce",
            "bytes": 1 << 20,
            "algbw_gbps": 0.9,
            "busbw_gbps": 1.35,
            "correct": True,
        },
        {
            "op": "all_reduce",
            "bytes": 1 << 24,
            "algbw_gbps": 1.1,
            "busbw_gbps": 1.65,
            "correct": True,
        },
        {
            "op": "all_gather",
            "bytes": 1 << 24,
            "algbw_gbps": 2.0,
            "busbw_gbps": 1.5,
            "correct": False,
        },
    ],
    "links": [
        {"a": "node-0", "b": "node-1", "gbps": 0.25, "verdict": "fail"},
        {"a": "node-0", "b": "node-0", "gbps": 1.05, "verdict": "pass"},
    ],
    "stragglers": [3],
    "straggler_detail": {
        "median_gemm_s": 0.010,
        "ranks": {"0": {"gemm_ms": 10.0}, "1": {"gemm_ms": 10.1}, "3": {"gemm_ms": 13.0}},
    },
    "sdc": {"mismatched_ranks": [2]},
    "exclude": ["node-1"],
}
