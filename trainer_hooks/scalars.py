"""Loss and grad norm off the device without a sync: pinned buffers read a step later.

On CUDA each observed scalar is copied with `non_blocking=True` into a slot of a small ring of
pinned host buffers and an event is recorded after the copy; the slot is read only once the
event has completed (`Event.query()`), normally by the next step. On CPU the value is read at
once: there is no device to wait for.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

METRICS = ("loss", "grad_norm")


@dataclass(frozen=True)
class StepScalars:
    step: int
    loss: float | None
    grad_norm: float | None


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.item() if value.numel() == 1 else value.detach().reshape(-1)[0])
    return float(value)


class ScalarReader:
    def __init__(self, slots: int = 8) -> None:
        self._slots = slots
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._pending: deque[tuple[int, dict[str, Any], Any]] = deque()
        self._current: dict[str, Any] = {}

    def observe(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            self._current[name] = value.detach().reshape(-1)[:1]
        else:
            self._current[name] = _to_float(value)

    def end_step(self, step: int) -> None:
        current, self._current = self._current, {}
        if not current:
            return
        device_values = {k: v for k, v in current.items() if isinstance(v, torch.Tensor)}
        if not device_values:
            self._pending.append((step, current, None))
            return
        buf = self._slot()
        for i, name in enumerate(METRICS):
            if name in device_values:
                buf[i : i + 1].copy_(device_values[name].float(), non_blocking=True)
                current[name] = ("slot", buf, i)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((step, current, event))
        while len(self._pending) > self._slots - 1:  # never overwrite a slot still unread
            self._pending.popleft()

    def _slot(self) -> torch.Tensor:
        if len(self._buffers) < self._slots:
            self._buffers.append(torch.empty(len(METRICS), pin_memory=True))
        buf = self._buffers[self._next % self._slots]
        self._next += 1
        return buf

    def poll(self) -> list[StepScalars]:
        out = []
        while self._pending:
            step, values, event = self._pending[0]
            if event is not None and not event.query():
                break
            self._pending.popleft()
            read = {
                k: (float(v[1][v[2]]) if isinstance(v, tuple) else v) for k, v in values.items()
            }
            out.append(StepScalars(step, read.get("loss"), read.get("grad_norm")))
        return out
