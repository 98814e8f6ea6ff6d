"""The `straggler` fault: a device that needs `slowdown` times as long for the same work.

A slow GPU (a throttled clock, a weak part) takes longer over every step's work, and its peers
wait for it. The simulation gives the rank more real work, never a sleep: each step it measures
its own compute (on a CPU device, the stepping thread's CPU time from the start of the step's
work to its end, the injected work left out), and at the start of the next step it multiplies
matrices on its device for `slowdown - 1` times that. The extra work competes for the machine
like the rank's own work does, so it stays proportional when the machine is loaded, and it
counts in CPU time only while the rank really runs it.

On a CUDA device the step is measured by the wall clock and each extra product is waited for;
that costs a host-device sync per product on the faulty rank, which is part of the fault.
"""

from __future__ import annotations

import time

import torch

UNIT = 64  # side of the extra products: ~50 us each on one CPU core, fine-grained enough


class SlowDevice:
    def __init__(self, device: torch.device, slowdown: float) -> None:
        self.device, self.slowdown = device, slowdown
        self.cuda = device.type == "cuda"
        self._clock = time.perf_counter if self.cuda else time.thread_time
        gen = torch.Generator().manual_seed(0)
        self._a = torch.randn(UNIT, UNIT, generator=gen).to(device)
        self._b = torch.randn(UNIT, UNIT, generator=gen).to(device)
        self._out = torch.empty(UNIT, UNIT, device=device)
        self._start: float | None = None
        self._own_s = 0.0  # the last step's own compute
        self.extra_s = 0.0  # the extra work done at the start of the current step

    def start_step(self) -> None:
        """Do the extra work owed for the last step's compute, then start timing this one."""
        t0 = self._clock()
        end = t0 + (self.slowdown - 1.0) * self._own_s
        while self._clock() < end:
            torch.mm(self._a, self._b, out=self._out)
            if self.cuda:
                torch.cuda.synchronize(self.device)
        self._start = self._clock()
        self.extra_s = self._start - t0

    def end_step(self) -> None:
        if self._start is not None:
            self._own_s = max(0.0, self._clock() - self._start)
            self._start = None
