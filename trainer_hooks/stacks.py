"""This rank's Python stacks, every thread, for `sentinel stacks` (the `stacks.dump` command).

The hooks answer on their transport thread, never the training thread: a rank whose main thread
waits inside a collective (C++ code that released the GIL, as gloo's and NCCL's waits do) still
answers, and its main thread's stack shows where it waits. A rank whose GIL is held by a C call
that never returns cannot run this at all: it does not answer, and `sentinel stacks` lists it
as silent, which is itself the evidence.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from types import FrameType

from sentinel.protocol import (
    MAX_STACK_FRAMES,
    MAX_STACK_THREADS,
    RankStacksPayload,
    StackFrame,
    ThreadStack,
)


def _clip(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def thread_stack(name: str, daemon: bool, frame: FrameType) -> ThreadStack:
    """One thread's frames, outermost first; only the innermost MAX_STACK_FRAMES are kept
    (the innermost say where it is; the outermost are the same launcher frames everywhere)."""
    summary = traceback.extract_stack(frame)
    kept = summary[-MAX_STACK_FRAMES:]
    frames = [
        StackFrame(
            file=_clip(f.filename, 512),
            line=f.lineno,
            func=_clip(f.name, 256),
            code=_clip((f.line or "").strip(), 512),
        )
        for f in kept
    ]
    return ThreadStack(
        name=_clip(name, 256),
        daemon=daemon,
        frames=frames,
        frames_left_out=len(summary) - len(kept),
    )


def capture(request_id: str, step: int | None = None) -> RankStacksPayload:
    """Every thread's stack now: `sys._current_frames()` named by `threading.enumerate()`.
    Threads appear main thread first, then by name, so equal ranks give equal answers. A thread
    started outside `threading` (a C library's) is named "<unnamed>", never by its id, which
    differs on every rank."""
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    stacks = []
    for ident, frame in sys._current_frames().items():
        t = threads.get(ident)
        name = t.name if t is not None else "<unnamed>"
        stacks.append((ident != main, name, thread_stack(name, bool(t and t.daemon), frame)))
    stacks.sort(key=lambda s: (s[0], s[1]))
    kept = [s for _, _, s in stacks[:MAX_STACK_THREADS]]
    return RankStacksPayload(
        request_id=request_id,
        pid=os.getpid(),
        step=step,
        threads=kept,
        threads_left_out=len(stacks) - len(kept),
    )
