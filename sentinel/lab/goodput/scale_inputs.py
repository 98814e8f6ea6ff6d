"""The inputs that carry a repair from the drills' 8 CPU ranks to a fleet (`repairs.py`), each
with its origin and source: the job's layout, how each part grows with the ranks, and the live
path's times (measured by `benchmarks/recovery.py` when its output is given, else its targets,
named as assumptions)."""

from __future__ import annotations

from sentinel.lab.goodput.origin import Input
from sentinel.lab.goodput.recovery_bench import RecoveryBench

GPUS_PER_NODE = 8
# Llama 3 405B on 16,384 GPUs ("The Llama 3 Herd of Models", Table 4): TP 8 x PP 16 hold one copy
# of the model; 16 sequences of 8,192 tokens per data-parallel group a step.
REPLICA_GPUS = 128
MICROBATCHES = 16
START_TAIL = 0.1
# Stock NCCL's initialization at 96k GPUs, ~265 s (Meta's NCCLX paper), taken as linear in ranks.
COMM_S_PER_KRANK = 265 / 96
READ_GBPS = 5.0
PEER_GBPS = 25.0


def scale_rows() -> list[Input]:
    """The job's layout, and how each part of a repair grows with the ranks."""
    return [
        Input("layout.gpus_per_node", "GPUs per node", GPUS_PER_NODE, "GPUs", "assumption",
              "8 H100 a server (Llama 3 paper, 3.3.1); a restart waits for the slowest node, a "
              "spare is a node"),
        Input("layout.replica_gpus", "GPUs per data-parallel replica", REPLICA_GPUS, "GPUs",
              "assumption", "the live path's fault domain, one full copy of the state: TP 8 x "
              "PP 16, Llama 3 405B's model-parallel group on 16,384 GPUs (Llama 3 paper, Table "
              "4); 5.67 TB of state is 44 GB a GPU (--replica-gpus)"),
        Input("layout.microbatches", "microbatches per replica a step", MICROBATCHES, "",
              "assumption", "Llama 3 405B on 16,384 GPUs: 16 sequences of 8,192 tokens per "
              "data-parallel group a step (Table 4), one a microbatch; held per replica as the "
              "fleet grows (the step time is held too)"),
        Input("scale.start_tail", "process start: a node's mean excess", START_TAIL, "x",
              "assumption", "no published figure found: a node's start (step launch, container, "
              "Python and torch import from shared storage, CUDA init) taken to vary by a tenth "
              "of it, exponentially; the gang waits for the slowest node: 1.8x the measured "
              "start at 2,048 nodes, 2.0x at 12,500"),
        Input("scale.comm_s_per_krank", "communicator setup per 1,000 ranks", COMM_S_PER_KRANK,
              "s", "assumption", "stock NCCL's initialization takes ~265 s at 96k GPUs (Meta's "
              "NCCLX paper, Si et al., arXiv 2510.20171, as quoted in a summary of it; NCCLX's "
              "own is 11x faster), taken as linear in ranks (NCCL's bootstrap gathers every "
              "rank's address through one ring): 45 s at 16,384, 276 s at 100,000, added to "
              "the drills' measured rendezvous"),
        Input("scale.read_gbps", "checkpoint read per GPU, shared tier", READ_GBPS, "GB/s",
              "assumption", "no published figure for the fleet's frontend: a node's ~2 x 200 "
              "Gb/s (50 GB/s) shared by its 8 GPUs, less overhead; all ranks together are "
              "capped by the storage bandwidth"),
        Input("scale.peer_gbps", "state copied from a peer, per GPU", PEER_GBPS, "GB/s",
              "assumption", "half the 400 Gb/s (50 GB/s) per-GPU RoCE link of Llama 3's "
              "cluster (Llama 3 paper, 3.3.1): the peer keeps training on the same link"),
    ]  # fmt: skip


def live_rows(bench: RecoveryBench, where: str) -> list[Input]:
    """The live path's survivors' stall and spare join: the recovery benchmark's worst of each
    (the shipped run's, or `--recovery-bench FILE`'s)."""
    live = bench.live
    run = f"{live.steps} steps in {live.wall_s:g} s, {live.checkpoint_reads} checkpoint reads"
    return [
        Input(
            "live.stall_s",
            "live: survivors' stall",
            live.stall_s_max,
            "s",
            "measured",
            f"{where}: live way's worst survivors' stall ({run})",
        ),
        Input(
            "live.join_s",
            "live: spare join",
            live.join_s_max,
            "s",
            "measured",
            f"{where}: live way's worst join, decision to full width ({run})",
        ),
    ]
