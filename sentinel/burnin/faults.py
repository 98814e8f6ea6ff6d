"""Fault injection for simulated burn-in fleets: this module only creates faults.

A scenario's pre-job faults become per-rank behaviour behind the `Comm` and `Compute` seams:
- `link_degraded` (node, factor): the node's ranks stretch every transfer that leaves the node
  by sleeping `elapsed * (1/factor - 1)`, so measured bandwidth is `factor` times what the
  transport gave. On a real network the same signal comes from `tc` (see the namespace tests).
- `straggler` (rank, slowdown): the rank's matrix products and copies cost `slowdown` times as
  much of its device clock: after each one it stays busy for the extra share (a simulated GPU's
  clock is the rank's CPU time, so it burns CPU in proportion to the product; it never sleeps).
- `sdc` (rank): half of the rank's matrix products, at random, come back with one bit flipped
  in a random element.
- node faults on a GPU: `thermal` throttles it (slower arithmetic above 85 C); `ecc_dbe` and
  `xid` make its arithmetic raise, as a CUDA error would.
- `config_drift` (node, env): the node's ranks run with those NCCL_* / FI_* variables set in
  their environment, as a site script on one node would leave them (`drift_env`).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sentinel.burnin.comm import Comm, Compute
from sentinel.exitcodes import InputError
from sentinel.scenario import (
    ConfigDriftFault,
    EccDbeFault,
    LinkDegradedFault,
    SdcFault,
    StragglerFault,
    ThermalFault,
    XidFault,
    load_scenario,
)

if TYPE_CHECKING:
    from sentinel.agent.nvml.sim import SimFault

THROTTLE_START_C = 85.0
SDC_RATE = 0.5  # share of products that come back corrupted: SDC is intermittent


@dataclass(frozen=True)
class RankFaults:
    link_factor: float = 1.0
    slowdown: float = 1.0
    sdc: bool = False
    device_error: str | None = None

    @property
    def any(self) -> bool:
        return self != RankFaults()


def faults_for_rank(scenario_path: str, rank: int, node: str, gpu: int) -> RankFaults:
    """The faults striking global `rank`, which runs on GPU `gpu` of `node`."""
    scenario = load_scenario(scenario_path)
    link, slow, sdc, err = 1.0, 1.0, False, None
    for f in scenario.faults:
        if isinstance(f, LinkDegradedFault) and f.node == node:
            link = min(link, f.factor)
        elif isinstance(f, StragglerFault) and f.rank == rank:
            slow = max(slow, f.slowdown)
        elif isinstance(f, SdcFault) and f.rank == rank:
            sdc = True
        elif isinstance(f, ThermalFault) and (f.node, f.gpu) == (node, gpu):
            slow = max(slow, 1.0 + max(0.0, f.temp_c - THROTTLE_START_C) / 50.0)
        elif isinstance(f, EccDbeFault) and (f.node, f.gpu) == (node, gpu):
            err = "uncorrectable ECC error encountered (double-bit)"
        elif isinstance(f, XidFault) and (f.node, f.gpu) == (node, gpu):
            err = f"device reported Xid {f.xid}"
    return RankFaults(link_factor=link, slowdown=slow, sdc=sdc, device_error=err)


def drift_env(scenario_path: str, node: str) -> dict[str, str]:
    """The environment a `config_drift` fault gives `node`'s ranks (empty: none)."""
    env: dict[str, str] = {}
    for f in load_scenario(scenario_path).faults:
        if isinstance(f, ConfigDriftFault) and f.node == node:
            env.update(f.env)
    return env


def _sim_faults(faults_file: Path) -> list[SimFault]:
    """A simulated node's faults so far: its agent's faults file (`sentinel.agent.nvml.sim`)."""
    from sentinel.agent.nvml.sim import parse_fault

    try:
        lines = faults_file.read_text().splitlines()
    except FileNotFoundError:
        return []  # nothing injected yet
    out = []
    for raw in lines:
        try:
            out.append(parse_fault(json.loads(raw)))
        except (ValueError, InputError):
            continue  # the agent logs a bad line; it strikes nothing
    return out


def faults_for_sim_gpu(faults_file: Path, gpu: int) -> RankFaults:
    """The faults striking `gpu` of a simulated node now (a `clear` repairs the GPU). For the
    validation burn-in."""
    from sentinel.agent.nvml.sim import Clear, EccDbe, Loopback, Sdc, Slow, Thermal, Xid

    slow, sdc, err = 1.0, False, None
    for fault in _sim_faults(faults_file):
        if isinstance(fault, Loopback) or fault.gpu != gpu:
            continue
        match fault:
            case Clear():
                slow, sdc, err = 1.0, False, None
            case Sdc():
                sdc = True
            case Slow(slowdown=factor):
                slow = max(slow, factor)
            case Thermal(temp_c=temp):
                slow = max(slow, 1.0 + max(0.0, temp - THROTTLE_START_C) / 50.0)
            case EccDbe():
                err = "uncorrectable ECC error encountered (double-bit)"
            case Xid(xid=code):
                err = f"device reported Xid {code}"
    return RankFaults(slowdown=slow, sdc=sdc, device_error=err)


def sim_loopback_factor(faults_file: Path) -> float:
    """The share of its bandwidth a simulated node's own network stack carries now."""
    from sentinel.agent.nvml.sim import Loopback

    factors = [f.factor for f in _sim_faults(faults_file) if isinstance(f, Loopback)]
    return factors[-1] if factors else 1.0


def stretch(t0: float, factor: float) -> None:
    """A transfer begun at `t0` over a link that carries only `factor` of its bandwidth: wait
    for the rest of the time it would take."""
    if factor < 1.0:
        time.sleep((time.perf_counter() - t0) * (1.0 / factor - 1.0))


class ThrottledComm(Comm):
    """A node whose network link carries only `factor` of its bandwidth."""

    def __init__(self, base: Comm, factor: float) -> None:
        super().__init__(base.rank, base.world, base.node_of, base.device)
        self._factor = factor
        self._multi_node = len(set(base.node_of)) > 1

    def _stretched(self, crosses: bool, fn: Any, *args: Any) -> None:
        t0 = time.perf_counter()
        fn(*args)
        if crosses:
            stretch(t0, self._factor)

    def all_reduce(self, t: torch.Tensor) -> None:
        self._stretched(self._multi_node, super().all_reduce, t)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self._stretched(self._multi_node, super().all_gather, out, t)

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self._stretched(self._multi_node, super().reduce_scatter, out, t)

    def all_to_all(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self._stretched(self._multi_node, super().all_to_all, out, t)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        self._stretched(self._multi_node, super().broadcast, t, src)

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        crosses = self.node_of[dst] != self.node or self.node_of[src] != self.node
        self._stretched(crosses, super().sendrecv, send, dst, recv, src)


class FaultyCompute(Compute):
    def __init__(self, device: torch.device, faults: RankFaults) -> None:
        super().__init__(device)
        self._faults = faults
        self._rng = random.Random()  # unseeded on purpose: SDC differs run to run
        self._bookkeeping = 0.0

    def _slow(self, t0: float) -> None:
        """A throttled GPU stays busy longer (it does not sleep): spin on the device clock for
        (slowdown - 1) times what the operation since `t0` cost on that clock."""
        if self._faults.slowdown > 1.0:
            self.sync()
            now = self.clock()
            end = now + (now - t0) * (self._faults.slowdown - 1.0)
            while self.clock() < end:
                pass

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self._faults.device_error:
            raise RuntimeError(f"CUDA error: {self._faults.device_error}")
        t0 = self.clock()
        out = super().matmul(a, b)
        self._slow(t0)
        if self._faults.sdc and out.dtype == torch.float32 and self._rng.random() < SDC_RATE:
            t1 = self.clock()
            bits = out.view(-1).view(torch.int32)
            # the top mantissa bit of one element: a silent, plausible-looking error
            bits.narrow(0, self._rng.randrange(bits.numel()), 1).bitwise_xor_(1 << 22)
            self._bookkeeping += self.clock() - t1
        return out

    def timed(self, fn: Any, *args: Any) -> tuple[Any, float]:
        """Bit flips cost the simulated GPU nothing: the injector's own time is not counted."""
        before = self._bookkeeping
        out, seconds = super().timed(fn, *args)
        return out, seconds - (self._bookkeeping - before)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self._faults.device_error:
            raise RuntimeError(f"CUDA error: {self._faults.device_error}")
        t0 = self.clock()
        super().copy(dst, src)
        self._slow(t0)


def inject(comm: Comm, compute: Compute, faults: RankFaults) -> tuple[Comm, Compute]:
    if faults.link_factor < 1.0:
        comm = ThrottledComm(comm, faults.link_factor)
    if faults.slowdown > 1.0 or faults.sdc or faults.device_error:
        compute = FaultyCompute(compute.device, faults)
    return comm, compute
