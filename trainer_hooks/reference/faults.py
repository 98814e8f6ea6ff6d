"""Fault injection for drills and tests: off unless a scenario file or --fault flags ask.

An injected fault only creates the fault; nothing here reports that it fired. Transient faults
(crash, hang) leave a marker in the run dir when they fire, so replaying the same steps after a
resume does not fire them again. Persistent faults (sdc, straggler) strike the hardware: the
marker records the node (SENTINEL_NODE) hosting the rank when the fault first struck, and a
replacement node (a hot spare) taking the rank over does not inherit it. A `straggler` fault is
a slow device that does real extra work in every step (`trainer_hooks.reference.slowdown`).

An `sdc` fault is a device whose GEMM unit computes wrong: from the fault's step on, every
matrix product the rank's process computes on its device comes back slightly wrong (`FaultyGemm`)
- the model's forward and backward, and whatever else multiplies matrices there, such as the
hooks' SDC spot check - as on a real GPU with silent data corruption.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError

from sentinel.scenario import (
    CorruptBatchFault,
    CrashFault,
    EccDbeFault,
    Fault,
    HangFault,
    SdcFault,
    StragglerFault,
    XidFault,
    load_scenario,
)
from trainer_hooks.reference.slowdown import SlowDevice

TRAINER_FAULTS = (
    CorruptBatchFault,
    SdcFault,
    StragglerFault,
    HangFault,
    CrashFault,
    EccDbeFault,
    XidFault,
)
SDC_EVERY = 97  # one element in SDC_EVERY of a faulty GEMM's output gets a bit flipped
# The mantissa bit flipped, per dtype: a relative error of 2**-7 (under 1%) in the element. Small
# enough that the loss and gradients look normal (the dangerous, silent kind), so only a
# recompute-and-compare check can tell.
_FLIP_BIT = {
    torch.float64: (torch.int64, 45),
    torch.float32: (torch.int32, 16),
    torch.float16: (torch.int16, 3),
    torch.bfloat16: (torch.int16, 0),
}


def parse_fault_flag(text: str) -> Fault:
    """`sdc:rank=1,at_step=3` -> SdcFault (validated by the scenario models)."""
    kind, _, rest = text.partition(":")
    doc: dict[str, str] = {"kind": kind}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--fault {text!r}: {item!r} is not key=value")
        doc[key.strip()] = value.strip()
    try:
        return TypeAdapter(Fault).validate_python(doc)
    except ValidationError as e:
        raise ValueError(f"--fault {text!r}: {e.errors()[0]['msg']}") from None


def load_faults(path: Path | None, flags: tuple[str, ...]) -> list[Fault]:
    faults: list[Fault] = list(load_scenario(path).faults) if path is not None else []
    faults += [parse_fault_flag(f) for f in flags]
    return [f for f in faults if isinstance(f, TRAINER_FAULTS)]


def flip_bits_(out: torch.Tensor) -> torch.Tensor:
    """Flip one mantissa bit of every SDC_EVERY-th element of `out`, in place (a flaky
    multiplier). Integer and unknown dtypes are left alone."""
    if out.dtype not in _FLIP_BIT or not out.is_contiguous():
        return out
    int_dtype, bit = _FLIP_BIT[out.dtype]
    out.view(-1).view(int_dtype)[::SDC_EVERY] ^= 1 << bit
    return out


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]))
    return flip_bits_(torch.ops.aten.mm.out(a, b, out=out))


def _addmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]))
    return flip_bits_(torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=out))


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
    return flip_bits_(torch.ops.aten.bmm.out(a, b, out=out))


def _baddbmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
    return flip_bits_(torch.ops.aten.baddbmm.out(bias, a, b, beta=beta, alpha=alpha, out=out))


GEMM_KERNELS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm}


def hang(how: str) -> NoReturn:
    """A rank stuck before its next collective, as `HangFault.how` says: asleep with its
    threads running, stopped by the kernel, or in one C call that never lets the GIL go."""
    if how == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "gil":
        sum(range(1 << 62))  # builtins.sum over a range: a C loop, no bytecode, no GIL switch
    while True:
        time.sleep(3600)


class FaultyGemm:
    """This process's device computes its matrix products wrong while installed.

    The faulty kernels replace PyTorch's own for the device's dispatch key, beneath autograd and
    DTensor, so every GEMM on the device is hit: forward, backward, and any check that
    recomputes a matmul workload. Each computes the right product (through the `.out` kernels,
    which stay untouched) and then flips bits in it.
    """

    def __init__(self, device: torch.device) -> None:
        self.key = device.type.upper()  # "CPU", "CUDA": the dispatch key of the device
        self._lib: torch.library.Library | None = None

    @property
    def installed(self) -> bool:
        return self._lib is not None

    def install(self) -> None:
        if self._lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel": we mean it
            warnings.simplefilter("ignore")
            for name, kernel in GEMM_KERNELS.items():
                lib.impl(name, kernel, self.key)
        self._lib = lib

    def uninstall(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None


class FaultInjector:
    def __init__(
        self,
        faults: list[Fault],
        rank: int,
        run_dir: Path,
        vocab: int,
        device: torch.device | None = None,
    ) -> None:
        self.rank, self.vocab = rank, vocab
        self.node = os.environ.get("SENTINEL_NODE", socket.gethostname())
        self.markers = run_dir / "faults"
        self.corrupt = {f.batch for f in faults if isinstance(f, CorruptBatchFault)}
        mine = [f for f in faults if getattr(f, "rank", None) == rank]
        self.sdc = [f for f in mine if isinstance(f, SdcFault)]
        self.device = device or torch.device("cpu")
        self.gemm = FaultyGemm(self.device)
        self.stragglers = [f for f in mine if isinstance(f, StragglerFault)]
        self.slow: SlowDevice | None = None  # the device once a straggler fault struck it
        self.transient = [f for f in mine if isinstance(f, HangFault | CrashFault)]
        # A node fault that stalls its GPU: the rank on that node's GPU, where it strikes.
        gpu = int(os.environ.get("LOCAL_RANK", "0"))
        self.stuck = [
            f
            for f in faults
            if isinstance(f, EccDbeFault | XidFault)
            and f.stalls
            and (f.node, f.gpu) == (self.node, gpu)
        ]
        self.step = 0

    def _marker(self, f: Fault) -> Path:
        return self.markers / f"{f.kind}-rank{self.rank}-step{getattr(f, 'at_step', 0)}.fired"

    def _strikes_here(self, f: Fault) -> bool:
        """A persistent fault stays with the node it first struck."""
        m = self._marker(f)
        if not m.exists():
            self.markers.mkdir(parents=True, exist_ok=True)
            m.write_text(self.node)
        return m.read_text() == self.node

    def corrupt_batch(self, batch: int, tokens: torch.Tensor) -> torch.Tensor:
        if batch not in self.corrupt:
            return tokens
        rng = np.random.default_rng([batch, 0xBAD])
        return torch.from_numpy(rng.integers(0, self.vocab, size=tuple(tokens.shape)))

    def before_step(self, step: int) -> None:
        """Crash, hang, corrupt or slow down this rank from the start of `step` (before any
        collective)."""
        self.step = step
        if not self.gemm.installed and any(
            step >= f.at_step and self._strikes_here(f) for f in self.sdc
        ):
            self.gemm.install()  # the device stays faulty: it is never uninstalled
        for f in self.stuck:  # the GPU stopped answering: this rank's step never ends
            if f.at_step == step:
                sys.stdout.flush()
                while True:
                    time.sleep(3600)
        for f in self.transient:
            fired = self._marker(f).exists()
            recurs = isinstance(f, CrashFault) and f.recurs
            # A first strike lands on the first step at or after its own that this rank runs (a
            # rank that joined its replica later, healed from a peer, never ran the earlier
            # steps); a recurring crash strikes again each time its step is replayed.
            if step < f.at_step or (fired and (not recurs or step != f.at_step)):
                continue
            if not fired:  # the marker keeps the first strike (its time and node)
                self.markers.mkdir(parents=True, exist_ok=True)
                self._marker(f).write_text(self.node)
            sys.stdout.flush()
            if isinstance(f, CrashFault):
                os._exit(1)
            hang(f.how)
        if self.slow is None:
            struck = [f for f in self.stragglers if step >= f.at_step and self._strikes_here(f)]
            if struck:  # the device stays slow: it never recovers
                self.slow = SlowDevice(self.device, max(f.slowdown for f in struck))
        if self.slow is not None:
            self.slow.start_step()

    def after_step(self) -> None:
        """The step's work is done (what a slow device takes longer over)."""
        if self.slow is not None:
            self.slow.end_step()
