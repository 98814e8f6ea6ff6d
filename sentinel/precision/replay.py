"""Replay one corpus stream through the real agent rules and the real coordinator.

Every node of the stream's fleet gets what its agent has: simulated GPUs
(`sentinel.agent.nvml.sim`, the stream's faults appended to their faults file at their time),
the health rules (`HealthEvaluator` with the shipped thresholds) and the monitor that turns
their verdicts into events (`NodeMonitor`), swept every shipped agent interval. Their events,
the agents' heartbeats, the stream's rank events and the job's status go into the
coordinator's own ingest and engine (`Ingestor`, `Engine`) with the shipped playbooks and
configuration, on a SQLite store. Its evictions go to a simulated scheduler (`_Scheduler`),
which the stream's own scheduler happenings change too (an administrator's drain, a resume),
and which the coordinator's scheduler bridge reads every shipped poll interval. The job's side is the supervisor's own record of its job, changed by the
coordinator's commands at once (`_Supervisor`: no ranks are launched). One simulated clock
drives agents and coordinator alike, so a two-minute stream replays in about a second, and
the same stream replays the same way every time.

A restarted agent is a new monitor over new simulated GPUs reading the same faults file (the
GPUs keep what struck them; past XID events are not replayed, as NVML's are not); a restarted
coordinator is a new ingest and engine over the same store; a scale-up's nodes (`joining`) get
their agents at `join_at_s`, all in one sweep.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sentinel import __version__
from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.sim import SimulatedGpus, inject
from sentinel.config import AgentConfig, CoordinatorConfig, SupervisorConfig
from sentinel.coordinator.core import scheduler
from sentinel.coordinator.core.clearance import DESTRUCTIVE_ACTIONS
from sentinel.coordinator.core.effects import EvictionBackend, SchedulerNode
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.operator import ack_command
from sentinel.coordinator.core.playbooks import Playbook
from sentinel.coordinator.store import SqliteStore
from sentinel.precision.corpus import RANK_EVENT, Happening, Stream
from sentinel.protocol import (
    AgentHeartbeatEvent,
    AgentHeartbeatPayload,
    CommandKind,
    Event,
    EventBatch,
    JobState,
    JobStatusEvent,
    JobStatusPayload,
    NodeHealthEvent,
    Source,
    Verdict,
)
from sentinel.supervisor.job import GangError, JobRecord

JOB = "corpus-job"
AGENT = AgentConfig.model_fields


class Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class IncidentSeen:
    fault: str
    target: str
    playbook: str | None
    opened_s: float  # since the stream began
    actions: tuple[str, ...]  # the playbook's steps begun, in order (not in shadow)

    @property
    def destructive(self) -> tuple[str, ...]:
        return tuple(a for a in self.actions if a in DESTRUCTIVE_ACTIONS)


@dataclass(frozen=True)
class RuleFiring:
    rule: str
    node: str
    t: float  # since the stream began, the first time the rule judged the node unhealthy


@dataclass(frozen=True)
class Replayed:
    stream: Stream
    incidents: list[IncidentSeen]
    firings: list[RuleFiring]


class _Agent:
    def __init__(self, node: str, gpus: int, faults: Path, clock: Clock) -> None:
        backend = SimulatedGpus(gpus, faults_file=faults, clock=clock, node_id=node)
        evaluator = HealthEvaluator(AGENT["thresholds"].default, clock)
        self.monitor = NodeMonitor(node, backend, None, evaluator, clock, expected_gpus=gpus)
        self.gpus = gpus

    def sweep(self) -> list[Event]:
        return self.monitor.collect()[1]

    def heartbeat(self) -> Event:
        snap = self.monitor.snapshot
        verdict = snap.health.verdict if snap is not None else Verdict.HEALTHY
        payload = AgentHeartbeatPayload(gpus=self.gpus, verdict=verdict, agent_version=__version__)
        return AgentHeartbeatEvent(source=self.monitor.source, payload=payload)


class _Supervisor:
    """The job's side: the real supervisor's record of its job (`JobRecord`), changed by the
    coordinator's job commands as `sentinel run` changes it, with the launching left out (a
    restart moves the generation on at once; a save asked for is committed at once). Rank
    commands (dumps, stacks, recomputes) go unanswered, as from ranks that are not there."""

    def __init__(self, nodes: list[str], spares: list[str], gpus_per_node: int) -> None:
        self.job = JobRecord(list(nodes), list(spares), gpus_per_node, state=JobState.RUNNING)
        self.checkpoints: dict[int, Path] = {}

    def status(self, ts: float) -> Event:
        job = self.job
        payload = JobStatusPayload(
            state=job.state,
            generation=job.generation,
            world_size=len(job.nodes) * job.gpus_per_node,
            gpus_per_node=job.gpus_per_node,
            nodes=job.nodes,
            spares=job.spares,
            checkpoints=sorted(self.checkpoints),
        )
        return JobStatusEvent(source=Source(job=JOB), payload=payload, ts=ts)

    def obey(self, store: SqliteStore, now: float) -> bool:
        """Carry out the job's new commands; True when its status changed."""
        changed = False
        for cmd in store.take_commands("job", JOB, now):
            detail: dict[str, object] = {}
            if cmd.kind == CommandKind.JOB_RESTART:
                try:
                    left = self.job.apply_restart(cmd.args, self.checkpoints)
                except GangError as e:
                    ack_command(store, cmd.id, False, {"error": str(e)}, f"job:{JOB}", now)
                    continue
                detail = {"generation": self.job.generation, "left": left}
            elif cmd.kind == CommandKind.CHECKPOINT_NOW:
                step = max(self.checkpoints, default=0) + 1
                self.checkpoints[step] = Path(f"step-{step}")
            elif cmd.kind == CommandKind.JOB_STOP:
                self.job.state = JobState.STOPPED
            else:
                continue
            ack_command(store, cmd.id, True, detail, f"job:{JOB}", now)
            changed = True
        return changed


class _Scheduler(EvictionBackend):
    """The fleet's scheduler: every node in service until a drain (Sentinel's, with its
    reason, or an administrator's happening) takes it out, until a resume."""

    name = "simulated scheduler"
    polls_scheduler = True

    def __init__(self, nodes: list[str]) -> None:
        self.known = list(nodes)
        self.out: dict[str, str] = {}  # node -> the drain's reason

    def evict(self, node: str, reason: str) -> str:
        self.out[node] = reason
        return f"{node} drained"

    def restore(self, node: str, reason: str) -> str:
        self.out.pop(node, None)
        return f"{node} resumed"

    def release_validation(self, node: str, reason: str) -> str:
        return self.evict(node, reason)

    def is_evicted(self, node: str) -> bool:
        return node in self.out

    def scheduler_nodes(self) -> dict[str, SchedulerNode]:
        return {
            n: SchedulerNode(
                "DRAIN" if n in self.out else "IDLE", self.out.get(n, ""), n in self.out
            )
            for n in self.known
        }


class Replay:
    def __init__(self, stream: Stream, playbooks: list[Playbook], work: Path) -> None:
        self.stream, self.playbooks, self.work = stream, playbooks, work
        self.clock = Clock(float(int(time.time())))
        self.start = self.clock.t
        self.cfg = CoordinatorConfig(state_dir=work / "state")
        self.store = SqliteStore(work / "state" / "coordinator.db")
        fleet = stream.fleet
        self.backend = _Scheduler(fleet.node_names() + fleet.spare_names())
        self._start_coordinator()
        self.nodes, self.spares = fleet.job_nodes(), fleet.spare_names()
        self.agents = {n: self._agent(n) for n in self.nodes + self.spares}
        self.joining = fleet.joining_names()
        self.supervisor = _Supervisor(self.nodes, self.spares, fleet.gpus_per_node)
        self.firings: dict[tuple[str, str], float] = {}

    def _start_coordinator(self) -> None:
        self.ingestor = Ingestor(self.store, self.playbooks, self.cfg)
        self.engine = Engine(self.store, self.playbooks, self.cfg, self.backend, self.clock)

    def _agent(self, node: str) -> _Agent:
        return _Agent(node, self.stream.fleet.gpus_per_node, self.faults(node), self.clock)

    def faults(self, node: str) -> Path:
        return self.work / f"{node}.faults"

    def run(self) -> Replayed:
        interval = float(AGENT["interval_s"].default)
        agent_beat = float(AGENT["heartbeat_s"].default)
        job_beat = float(SupervisorConfig.model_fields["heartbeat_s"].default)
        poll = self.cfg.scheduler_poll_s
        todo = sorted(self.stream.events, key=lambda h: h.t)
        ticks = int(self.stream.duration_s / interval) + 1
        for i in range(ticks):
            elapsed = i * interval
            self.clock.t = self.start + elapsed
            if self.joining and elapsed >= self.stream.fleet.join_at_s:  # a scale-up
                self.agents |= {n: self._agent(n) for n in self.joining}
                self.joining = []
            events: list[Event] = []
            while todo and todo[0].t <= elapsed:
                events += self._happen(todo.pop(0))
            if self.supervisor.obey(self.store, self.clock.t) or _due(elapsed, job_beat, interval):
                events.append(self.supervisor.status(self.clock.t))
            for agent in self.agents.values():
                events += agent.sweep()
                if _due(elapsed, agent_beat, interval):
                    events.append(agent.heartbeat())
            if poll and _due(elapsed, poll, interval):  # the scheduler bridge
                seen = self.backend.scheduler_nodes()
                nodes = self.store.nodes(scheduler.MAX_NODES)
                events += scheduler.disagreements(seen, nodes, self.clock.t, poll)
            self._note_firings(events, elapsed)
            if events:
                self.ingestor.ingest(EventBatch(events=events), self.clock.t)
            self.engine.tick()
        self.store.close()
        return Replayed(self.stream, self._incidents(), self._firings())

    def _happen(self, h: Happening) -> list[Event]:
        """Make `h` happen; the events it sends itself (a rank's or the supervisor's)."""
        if h.kind == RANK_EVENT:
            return [h.rank_event(JOB, self.clock.t)]
        if h.kind == "coordinator_restart":
            self._start_coordinator()
        elif h.kind == "scheduler_drain":
            assert h.node is not None
            self.backend.out[h.node] = str((h.model_extra or {}).get("reason", "drained by hand"))
        elif h.kind == "scheduler_resume":
            self.backend.out.pop(str(h.node), None)
        elif h.kind == "agent_restart" and h.node in self.agents:
            self.agents[h.node] = self._agent(h.node)
        else:  # a GPU fault: a node not yet joined finds it when its agent starts
            assert h.node is not None
            inject(self.faults(h.node), h.fault_line())
        return []

    def _note_firings(self, events: list[Event], elapsed: float) -> None:
        for ev in events:
            if not isinstance(ev, NodeHealthEvent) or ev.source.node is None:
                continue
            for f in ev.payload.findings:
                if f.verdict == Verdict.UNHEALTHY:
                    self.firings.setdefault((f.rule, ev.source.node), elapsed)

    def _firings(self) -> list[RuleFiring]:
        return [RuleFiring(rule, node, t) for (rule, node), t in sorted(self.firings.items())]

    def _incidents(self) -> list[IncidentSeen]:
        steps = [s for s in self.store.steps(100_000) if not s.dry_run]
        out = []
        for inc in self.store.incidents(100_000):
            actions = tuple(s.action for s in steps if s.incident_id == inc.id)
            out.append(
                IncidentSeen(
                    inc.fault, inc.target, inc.playbook, inc.opened_at - self.start, actions
                )
            )
        return out


def _due(elapsed: float, every: float, interval: float) -> bool:
    """Whether a report sent every `every` seconds falls in the tick at `elapsed`."""
    return int(elapsed / every) != int((elapsed - interval) / every) or elapsed == 0


def replay(stream: Stream, playbooks: list[Playbook], work: Path) -> Replayed:
    work.mkdir(parents=True, exist_ok=True)
    return Replay(stream, playbooks, work).run()


def replay_corpus(streams: list[Stream], playbooks: list[Playbook], work: Path) -> list[Replayed]:
    """Every stream, each in its own directory under `work`. The replayed agents and coordinator
    log as they would in service; the scores say it all, so their logging is off meanwhile."""
    logging.disable(logging.WARNING)
    try:
        return [replay(s, playbooks, work / s.name) for s in streams]
    finally:
        logging.disable(logging.NOTSET)
