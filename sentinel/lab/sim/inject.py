"""The drill injector: follows training through the trainer's metrics file and, when training
reaches a node fault's `at_step`, writes the fault into the named node's simulated GPUs.

Rank faults and `corrupt_batch` are not injected here: the trainer injects them itself from the
same scenario file (`--faults`). Nothing here tells any detector what was injected.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.scenario import NODE_FAULTS, Scenario


@dataclass(frozen=True)
class StepLine:
    """One per-step line of metrics.jsonl as the demo saw it; `t` is seconds since the start."""

    t: float
    step: int
    loss: float
    batch: int | None
    step_s: float
    ckpt_stall_s: float = 0.0  # of step_s, waiting for a checkpoint's staging copy
    participants: int | None = None  # replicas that trained the step (replica mode)


@dataclass(frozen=True)
class Launch:
    """A generation's start-up as its rank 0 reported it (demo seconds): its code running
    from `main_t`, rendezvous seconds, checkpoint-load seconds, first step from `ready_t`."""

    main_t: float
    rendezvous_s: float
    load_s: float
    ready_t: float
    resume_step: int
    generation: int | None = None  # None: a trainer that does not say
    ranks: int | None = None  # the ranks it speaks for (a replica's world, or the gang)


@dataclass(frozen=True)
class CheckpointSave:
    """A save started after step `step`'s line: seconds training was held up by it."""

    t: float
    step: int
    held_s: float


@dataclass(frozen=True)
class Injection:
    """A node fault written into a node's simulated GPUs at wall time `t` (demo seconds)."""

    index: int  # position in the scenario's fault list
    node: str
    step: int
    t: float


@dataclass
class MetricsTail:
    """Reads new lines of the trainer's metrics.jsonl (rank 0 appends; replayed steps repeat)."""

    path: Path
    t0: float
    _pos: int = 0
    _buf: str = ""
    digest: str | None = None
    final_step: int | None = None
    launches: list[Launch] = field(default_factory=list)
    saves: list[CheckpointSave] = field(default_factory=list)

    def poll(self) -> list[StepLine]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        text = self._buf + chunk
        lines, _, self._buf = text.rpartition("\n")
        now = time.time() - self.t0
        out = []
        for raw in filter(None, lines.split("\n")):
            rec: dict[str, Any] = json.loads(raw)
            if "digest" in rec and rec.get("replica", 0) == 0:
                self.digest, self.final_step = str(rec["digest"]), int(rec["final_step"])
            elif "launch" in rec:  # one a gang, or one per replica of a replica-mode job
                la = rec["launch"]
                self.launches.append(
                    Launch(
                        main_t=float(la["main_at"]) - self.t0,
                        rendezvous_s=float(la["rendezvous_s"]),
                        load_s=float(la["load_s"]),
                        ready_t=float(la["ready_at"]) - self.t0,
                        resume_step=int(la["resume_step"]),
                        generation=la.get("generation"),
                        ranks=la.get("ranks"),
                    )
                )
            elif "checkpoint" in rec and rec.get("replica", 0) == 0:
                held = float(rec.get("wait_s", 0.0)) + float(rec.get("block_s", 0.0))
                self.saves.append(CheckpointSave(t=now, step=int(rec["checkpoint"]), held_s=held))
            elif "step" in rec and "loss" in rec and rec.get("quorum_rank", 0) == 0:
                # every replica of a replica-mode job writes each step; the quorum's first
                # replica's line stands for it
                out.append(
                    StepLine(
                        # when the step committed, where the trainer says (replica mode)
                        t=float(rec["t"]) - self.t0 if "t" in rec else now,
                        step=int(rec["step"]),
                        loss=float(rec["loss"]),
                        batch=rec.get("batch"),
                        step_s=float(rec.get("step_s", 0.0)),
                        ckpt_stall_s=float(rec.get("ckpt_stall_s") or 0.0),
                        participants=rec.get("participants"),
                    )
                )
        return out


@dataclass
class Injector:
    """Injects each node fault once, into `inject(node, fault_dict)`, at its step."""

    scenario: Scenario
    inject: Callable[[str, dict[str, Any]], None]
    injected: list[Injection] = field(default_factory=list)

    def pending(self) -> list[tuple[int, Any]]:
        done = {i.index for i in self.injected}
        return [
            (i, f)
            for i, f in enumerate(self.scenario.faults)
            if isinstance(f, NODE_FAULTS) and i not in done
        ]

    def on_step(self, step: int, t0: float) -> list[Injection]:
        """Inject the faults due at `step`; each is timed when it is written (seconds since
        `t0`), not when the step's line was read: a busy follower can read a line late."""
        fired = []
        for index, fault in self.pending():
            if step >= fault.at_step:
                doc = fault.model_dump(mode="json", exclude={"node", "at_step"})
                self.inject(fault.node, doc)
                now = time.time() - t0
                fired.append(Injection(index=index, node=fault.node, step=step, t=now))
        self.injected += fired
        return fired


@dataclass
class MarkerWatch:
    """The fault markers the trainer writes when a rank fault strikes (`KIND-rankR-stepS.fired`,
    holding the node it struck): each is reported once, so the run's account shows every
    fault as it strikes, not only the node faults written here."""

    directory: Path
    seen: set[str] = field(default_factory=set)

    def poll(self) -> list[tuple[str, str]]:
        """New markers: (file name, node)."""
        if not self.directory.is_dir():
            return []
        new = []
        for marker in sorted(self.directory.glob("*.fired")):
            if marker.name not in self.seen:
                node = marker.read_text().strip()
                if node:  # written whole before it counts
                    self.seen.add(marker.name)
                    new.append((marker.name, node))
        return new


class Polling(threading.Thread, ABC):
    """A daemon thread that calls `tick` every `interval_s` until stopped, and once more after;
    an exception ends it and waits in `error` for the orchestrator, which checks after join."""

    def __init__(self, name: str, interval_s: float, join_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s, self.join_s = interval_s, join_s
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    @abstractmethod
    def tick(self) -> None:
        """One look (called every `interval_s`, and once more after `stop`)."""

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.tick()
                self.stopping.wait(self.interval_s)
            self.tick()
        except BaseException as e:  # surfaced by the orchestrator after join()
            self.error = e

    def stop(self) -> None:
        self.stopping.set()
        self.join(self.join_s)


class Follower(Polling):
    """Polls the metrics file, feeds the injector and hands every step line to `on_line`."""

    def __init__(
        self,
        tail: MetricsTail,
        injector: Injector,
        on_line: Callable[[StepLine], None],
        on_inject: Callable[[Injection], None],
        on_tick: Callable[[], None] = lambda: None,
        interval_s: float = 0.1,
    ) -> None:
        super().__init__("demo-follower", interval_s, join_s=10)
        self.tail, self.injector = tail, injector
        self.on_line, self.on_inject, self.on_tick = on_line, on_inject, on_tick

    def tick(self) -> None:
        self.drain()

    def drain(self) -> None:
        for line in self.tail.poll():
            self.on_line(line)
            for inj in self.injector.on_step(line.step, self.tail.t0):
                self.on_inject(inj)
        self.on_tick()
