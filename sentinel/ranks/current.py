"""What a trainer asks of the warm rank process it runs in: is it asked to leave?

A warm rank process (`sentinel.ranks.rank`) runs the trainer's `main(argv)` once per gang
generation and stays alive between them. When the supervisor ends a generation that this
process survives, it asks the rank to leave; the trainer reads `leave_requested()` at every
step boundary, agrees with its peers on it (in the same collective that carries its other
per-step flags, so every rank leaves after the same step and none is left waiting in a
collective), releases the generation's process groups and returns from `main`.

Outside a warm rank process (torchrun, a plain `python -m ...`) nobody ever asks: the answer is
always False and the trainer runs as it always did. Standard library only: the trainer imports
it.
"""

from __future__ import annotations

import threading
import time

_leave = threading.Event()
_generation: int | None = None
_began_ns: int | None = None
_asked = -1  # the latest generation asked to leave, begun or not


_prepared: object | None = None


def take_prepared() -> object | None:
    """What the trainer's `prepare(argv)` built while this process waited for a rank (a warm
    spare's model), once; None when nothing was prepared."""
    global _prepared
    ready, _prepared = _prepared, None
    return ready


def set_prepared(ready: object | None) -> None:
    global _prepared
    _prepared = ready


def leave_requested() -> bool:
    """True once the supervisor asked this process's rank to leave its current generation."""
    return _leave.is_set()


def generation() -> int | None:
    """The generation this process runs now; None outside a warm rank process."""
    return _generation


def began_ns() -> int | None:
    """When this process began its current generation (wall clock, ns); None outside a warm
    rank process. What a process-wide record (PyTorch's flight recorder) holds from before
    belongs to earlier generations."""
    return _began_ns


def begin(number: int) -> None:
    """The rank process starts `number` (the rank loop calls this, never a trainer)."""
    global _generation, _began_ns
    _leave.clear()
    _generation, _began_ns = number, time.time_ns()
    if _asked >= number:  # the request crossed the generation's start on the wire
        _leave.set()


def request_leave(number: int) -> None:
    """The supervisor asks the rank of generation `number` to leave. A late request for an
    earlier generation is ignored; an early one, for a generation handed to this process that
    has not begun yet (a second repair right after the first), holds when it begins."""
    global _asked
    _asked = max(_asked, number)
    if _generation == number:
        _leave.set()


def end() -> None:
    global _generation, _began_ns
    _generation, _began_ns = None, None
    _leave.clear()
