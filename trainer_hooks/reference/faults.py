"""Fault injection for drills and tests: off unless a scenario file or --fault flags ask.

An injected fault only creates the fault; nothing here reports that it fired. Transient faults
(crash, hang) leave a marker in the run dir when they fire, so replaying the same steps after a
resume does not fire them again. Persistent faults (sdc, straggler) strike the hardware: the
marker records the node (SENTINEL_NODE) hosting the rank when the fault first struck, and a
replacement node (a hot spare) taking the rank over does not inherit it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError
from torch import nn

from sentinel.scenario import (
    CorruptBatchFault,
    CrashFault,
    Fault,
    HangFault,
    SdcFault,
    StragglerFault,
    load_scenario,
)

TRAINER_FAULTS = (CorruptBatchFault, SdcFault, StragglerFault, HangFault, CrashFault)
SDC_EVERY = 97  # one element in SDC_EVERY of a faulty Linear's output gets a bit flipped
_FLIP_BIT = {torch.float32: (torch.int32, 22), torch.bfloat16: (torch.int16, 6)}


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


def flip_bits(out: torch.Tensor) -> torch.Tensor:
    """`out` with one bit flipped in every SDC_EVERY-th element (a flaky multiplier)."""
    int_dtype, bit = _FLIP_BIT.get(out.dtype, (torch.int32, 22))
    bad = out.detach().float() if out.dtype not in _FLIP_BIT else out.detach().clone()
    flat = bad.reshape(-1).view(int_dtype)
    flat[::SDC_EVERY] ^= 1 << bit
    return out + (bad.to(out.dtype) - out.detach())


class FaultInjector:
    def __init__(self, faults: list[Fault], rank: int, run_dir: Path, vocab: int) -> None:
        self.rank, self.vocab = rank, vocab
        self.node = os.environ.get("SENTINEL_NODE", socket.gethostname())
        self.markers = run_dir / "faults"
        self.corrupt = {f.batch for f in faults if isinstance(f, CorruptBatchFault)}
        mine = [f for f in faults if getattr(f, "rank", None) == rank]
        self.sdc = [f for f in mine if isinstance(f, SdcFault)]
        self.stragglers = [f for f in mine if isinstance(f, StragglerFault)]
        self.transient = [f for f in mine if isinstance(f, HangFault | CrashFault)]
        self.step = 0
        self._busy_s = 0.0
        self._slept_s = 0.0

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
        """Crash, hang or slow down this rank at the start of `step` (before any collective)."""
        self.step = step
        for f in self.transient:
            if f.at_step == step and not self._marker(f).exists():
                self.markers.mkdir(parents=True, exist_ok=True)
                self._marker(f).write_text(self.node)
                sys.stdout.flush()
                if isinstance(f, CrashFault):
                    os._exit(1)
                while True:  # hang: a rank stuck before its next collective
                    time.sleep(3600)
        self._slept_s = 0.0
        for slow in self.stragglers:
            if step >= slow.at_step and self._strikes_here(slow):
                self._slept_s = (slow.slowdown - 1.0) * self._busy_s
                time.sleep(self._slept_s)

    def after_step(self, step_s: float) -> None:
        self._busy_s = max(0.0, step_s - self._slept_s)

    def install_sdc(self, model: nn.Module) -> None:
        """Perturb this rank's Linear outputs from the fault's step on (registered after TP)."""
        if not self.sdc:
            return

        def hook(_m: nn.Module, _inp: object, out: torch.Tensor) -> torch.Tensor | None:
            active = any(self.step >= f.at_step and self._strikes_here(f) for f in self.sdc)
            return flip_bits(out) if active and isinstance(out, torch.Tensor) else None

        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.register_forward_hook(hook)
