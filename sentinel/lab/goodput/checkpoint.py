"""What a checkpoint costs a fleet-scale job, derived from the state's size and two bandwidths.

The reference trainer saves with `dcp.async_save` (`trainer_hooks/reference/checkpoint.py`):
training blocks only while every rank stages its shard into host memory and the ranks agree on
the save plan; the write to storage then runs behind training, and the checkpoint counts
(is committed) only once that write has ended. So, per save:

    blocking = state bytes per GPU / staging bandwidth + coordination
    write    = state bytes in all / storage bandwidth     (overlapped with training)

A synchronous save (`dcp.save`) blocks for the coordination and the whole write instead.

Defaults, for the reference trace (Llama 3 405B on 16,384 H100s):
- 405e9 parameters at 14 bytes each: bf16 weights (2), fp32 master weights (4), AdamW's two
  fp32 moments (8): 5.67 TB, sharded across the fleet (FSDP/ZeRO leave each GPU 1/N of it),
  0.35 GB per GPU.
- staging at 10 GB/s per GPU: a device-to-pinned-host copy over PCIe Gen5 x16, whose peak is
  ~55 GB/s; a fifth of it, so 35 ms for the shard.
- coordination 1 s: DCP's save-plan exchange plus a barrier across every rank. The whole async
  block measures 0.02-0.06 s at 2-8 ranks here (`benchmarks/checkpoint.py`); 1 s allows
  16,384 ranks 20-50x that.
- storage at 2 TB/s: the sustained throughput of the Tectonic cluster Llama 3 checkpointed to
  (the Llama 3 paper, section 3.3.1; 7 TB/s peak), so 2.8 s to commit a save.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointSpec:
    params: float = 405e9
    bytes_per_param: float = 14.0
    staging_gb_per_s: float = 10.0
    coordination_s: float = 1.0
    storage_tb_per_s: float = 2.0
    asynchronous: bool = True

    @property
    def state_bytes(self) -> float:
        return self.params * self.bytes_per_param

    def bytes_per_gpu(self, gpus: int) -> float:
        return self.state_bytes / gpus

    @property
    def write_s(self) -> float:
        """Seconds from the start of the write to the commit, at the storage's bandwidth."""
        return self.state_bytes / (self.storage_tb_per_s * 1e12)

    def staging_s(self, gpus: int) -> float:
        return self.bytes_per_gpu(gpus) / (self.staging_gb_per_s * 1e9)

    def blocking_s(self, gpus: int) -> float:
        """Seconds one save stops training: staging + coordination (async), or the coordination
        and the whole write (sync)."""
        if self.asynchronous:
            return self.staging_s(gpus) + self.coordination_s
        return self.coordination_s + self.write_s

    def commit_lag_s(self) -> float:
        """Seconds after training resumes until the save is committed (0 for a sync save)."""
        return self.write_s if self.asynchronous else 0.0

    def describe(self, gpus: int) -> dict[str, float | bool]:
        return {
            "params": self.params,
            "bytes_per_param": self.bytes_per_param,
            "state_tb": self.state_bytes / 1e12,
            "gb_per_gpu": self.bytes_per_gpu(gpus) / 1e9,
            "staging_gb_per_s": self.staging_gb_per_s,
            "staging_s": self.staging_s(gpus),
            "coordination_s": self.coordination_s,
            "storage_tb_per_s": self.storage_tb_per_s,
            "write_s": self.write_s,
            "asynchronous": self.asynchronous,
            "blocking_s": self.blocking_s(gpus),
            "commit_lag_s": self.commit_lag_s(),
        }
