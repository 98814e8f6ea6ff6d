"""`sentinel demo`: the whole suite on one machine, through the real paths.

Burn-in (when the scenario has a link fault) -> coordinator -> one simulated agent per node and
spare -> `sentinel run` supervising the reference trainer on CPU -> the drill injector and the
observer while it trains -> the clean reference run -> the drill report, goodput input and HTML
report. Every process is started explicitly and stopped in `finally`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sentinel.config import AgentConfig
from sentinel.coordinator.core.states import IncidentState
from sentinel.lab.demo.data import StepPoint, TimelineEntry
from sentinel.lab.demo.observe import CoordinatorClient, Observer
from sentinel.lab.demo.procs import SENTINEL, CoordinatorProcess, SupervisorProcess
from sentinel.lab.demo.result import Strike, Timing
from sentinel.lab.demo.returns import Operator, damage_lines, record_baseline, validation_env
from sentinel.lab.sim.fleet import SimFleet
from sentinel.lab.sim.inject import (
    Follower,
    Injection,
    Injector,
    MarkerWatch,
    MetricsTail,
    StepLine,
)
from sentinel.protocol import Recovery
from sentinel.scenario import (
    PRELAUNCH_FAULTS,
    RANK_FAULTS,
    CorruptBatchFault,
    LinkDegradedFault,
    Scenario,
)

JOB = "demo"
# A tiny model: about 0.3 s per step for 8 ranks on 2 CPU cores.
# The pre-launch burn-in's phases: the configuration first, then the links.
BURNIN_PHASES = "drift,links"

MODEL_FLAGS = [
    "--layers",
    "2",
    "--dim",
    "32",
    "--heads",
    "4",
    "--seq",
    "16",
    "--vocab",
    "128",
    "--corpus-tokens",
    "32768",
    "--mbs",
    "2",
    "--accum",
    "2",
    "--warmup",
    "2",
]


# The agents sweep at the shipped default interval: hardware faults are judged against it.
AGENT_INTERVAL_S: float = AgentConfig.model_fields["interval_s"].default

# Drills compress time. A drill's steps take ~0.3 s on two shared CPU cores and it runs 40 to
# 100 of them where a real run takes thousands of multi-second steps, so every trainer-hooks
# setting counted in steps or in seconds is divided by this one factor, the same for every
# drill, and so are the coordinator's validation hold-down and timeout (demo/returns.py); every
# other setting (thresholds, the playbooks, the agents) is the shipped default.
DRILL_COMPRESSION = 4
# The hooks' shipped defaults the compression divides (trainer_hooks.config.HooksConfig;
# `sentinel` does not import `trainer_hooks`: a test checks these match).
SHIPPED_HOOKS_STEPS = {
    "report_every": 10,
    "exchange_every": 20,
    "straggler_window": 20,
    "sdc_every": 100,
}
SHIPPED_HOOKS_SECONDS = {"hang_floor_s": 60.0, "hang_first_step_s": 900.0}


def drill_hooks(compression: int = DRILL_COMPRESSION) -> dict[str, float | int]:
    """The compressed hooks settings: steps divided and rounded (at least 1), seconds divided."""
    out: dict[str, float | int] = {
        k: max(1, round(v / compression)) for k, v in SHIPPED_HOOKS_STEPS.items()
    }
    out |= {k: v / compression for k, v in SHIPPED_HOOKS_SECONDS.items()}
    return out


HANG_FLOOR_S = float(drill_hooks()["hang_floor_s"])


def hooks_env(out: Path) -> dict[str, str]:
    """The trainer hooks' settings for a drill: the shipped defaults, with every cadence
    compressed by `DRILL_COMPRESSION` (a step report every 2 steps, a gang exchange and a
    straggler window of 5, an SDC spot check every 25, a hang after a 15 s stall), and flight
    recorders dumped where `sentinel run` analyzes them."""
    env = {f"SENTINEL_HOOKS_{k.upper()}": str(v) for k, v in drill_hooks().items()}
    return env | {"SENTINEL_HOOKS_FR_DIR": str(out / "fr")}


def trainer_args(scenario: Scenario) -> list[str]:
    t = scenario.trainer
    replicas = ["--replicas", "ft"] if scenario.runs_replicas else []
    return [
        *MODEL_FLAGS,
        "--tp",
        str(t.tp),
        "--pp",
        str(t.pp),
        "--dp",
        str(t.dp),
        "--steps",
        str(t.steps),
        "--checkpoint-every",
        str(t.checkpoint_every),
        "--seed",
        str(t.seed),
        *replicas,
    ]


def recovery_args(scenario: Scenario) -> list[str]:
    """`sentinel run`'s flags for the scenario's `recovery:` (`restart` is today's path, every
    rank a new process: cold ranks; the others are asked of the catalog's allowed paths), and
    its replicas when they are fault domains (the live path's)."""
    replicas = ["--replicas", str(scenario.trainer.dp)] if scenario.runs_replicas else []
    if scenario.recovery is None:
        return replicas
    cold = ["--ranks", "cold"] if scenario.recovery == Recovery.RESTART else []
    return [*cold, "--recovery", scenario.recovery.value, *replicas]


@dataclass
class Recording:
    """What the run saw, in demo seconds since `t0`."""

    t0: float
    lines: list[tuple[StepLine, int]] = field(default_factory=list)  # (line, generation)
    injections: list[Injection] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    burnin: dict[str, Any] | None = None
    burnin_exclude: list[str] = field(default_factory=list)
    burnin_span: tuple[float, float] | None = None  # (start, end)
    returns: dict[str, Any] | None = None  # the operator's returns (returns.py)


class Demo:
    def __init__(
        self,
        scenario: Scenario,
        out: Path,
        echo: Callable[[str], None],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.scenario, self.out, self.echo = scenario, out.resolve(), echo
        self.progress = progress  # (step, steps in all) for a live display
        self.rec = Recording(t0=time.time())
        self.print_every = max(1, scenario.trainer.steps // 12)
        self.markers = MarkerWatch(self.out / "run" / "faults")
        self._noted: set[str] = set()  # `fault:INDEX` refs already on the timeline
        # "incident #N is mitigated", held until the job trains again (on_line)
        self._mitigated: list[tuple[str | None, str, float]] = []
        # What the time targets are judged against (result.py).
        self.timing = Timing(agent_interval_s=AGENT_INTERVAL_S, hang_timeout_s=HANG_FLOOR_S)
        self.damage: Callable[[str], None] | None = None  # the returns drill's (train())

    # --- the live timeline -------------------------------------------------------------------

    def note(
        self,
        kind: str,
        target: str | None,
        text: str,
        step: int | None = None,
        ref: str | None = None,
        state: str | None = None,
    ) -> None:
        """One timeline entry, echoed; `step` defaults to the step in progress (result.py). The
        coordinator calls an incident mitigated (`state`) once its repair relaunched the job;
        that is said when the job trains again, with its first step (`on_line`)."""
        if kind == "incident" and state == IncidentState.MITIGATED:
            self._mitigated.append((target, text, time.time() - self.rec.t0))
            return
        t = time.time() - self.rec.t0
        if step is None and self.rec.lines:
            step = self.rec.lines[-1][0].step + 1
        entry = TimelineEntry(t=t, step=step, kind=kind, target=target, text=text, ref=ref)
        self.rec.timeline.append(entry)
        # Saved as it happens: `tail -f timeline.jsonl` follows a run, and it stays after one.
        with (self.out / "timeline.jsonl").open("a") as f:
            f.write(json.dumps(asdict(entry)) + "\n")
        mark = {"fault": "!!", "detect": "??", "action": "->", "resume": ">>"}.get(kind, "  ")
        self.echo(f"[{t:7.1f}s] {mark} {text}")

    def on_line(self, line: StepLine, observer: Observer) -> None:
        gen = observer.seen.generation_at(line.t)
        replay = line.step <= max((ln.step for ln, _g in self.rec.lines), default=0)
        self.rec.lines.append((line, gen))
        if self.progress is not None:
            self.progress(line.step, self.scenario.trainer.steps)
        for index, f in enumerate(self.scenario.faults):
            ref = f"fault:{index}"
            if (
                isinstance(f, CorruptBatchFault)
                and line.batch == f.batch
                and ref not in self._noted
            ):
                self._noted.add(ref)
                self.note(
                    "fault",
                    None,
                    f"injected corrupt_batch: batch {f.batch} in step {line.step}",
                    step=line.step,
                    ref=ref,
                )
        newest = observer.seen.generations[-1][1] if observer.seen.generations else 0
        if gen >= newest:  # a step trained after the incident was called mitigated
            self._training_again(f"training again at step {line.step}", since=line.t)
        if replay or line.step % self.print_every == 0 or line.step == 1:
            tag = " (replayed after rollback)" if replay else ""
            self.echo(f"[{line.t:7.1f}s]    step {line.step:4d}  loss {line.loss:.4f}{tag}")

    def _training_again(self, how: str, since: float = float("inf")) -> None:
        for target, text, held_at in [m for m in self._mitigated if m[2] <= since]:
            self._mitigated.remove((target, text, held_at))
            self.note("incident", target, f"{text}: {how}")

    def on_inject(self, inj: Injection) -> None:
        fault = self.scenario.faults[inj.index]
        self.note(
            "fault",
            inj.node,
            f"injected {fault.kind} on {inj.node}",
            step=inj.step + 1,
            ref=f"fault:{inj.index}",
        )
        if self.damage is not None:
            self.damage(inj.node)

    def on_tick(self) -> None:
        """Rank faults as they strike, from the markers the trainer writes."""
        for name, node in self.markers.poll():
            for index, f in enumerate(self.scenario.faults):
                if isinstance(f, RANK_FAULTS) and name == marker_name(f):
                    self._noted.add(f"fault:{index}")
                    self.note(
                        "fault",
                        node,
                        f"injected {f.kind} on rank-{f.rank} ({node})",
                        step=f.at_step + 1,
                        ref=f"fault:{index}",
                    )
                    if self.damage is not None:
                        self.damage(node)

    # --- phases --------------------------------------------------------------------------------

    def burnin(self) -> Path | None:
        """Burn-in of the fleet with the scenario's pre-launch faults (a degraded link, a
        drifted configuration); returns the exclude file."""
        before = [f for f in self.scenario.faults if isinstance(f, PRELAUNCH_FAULTS)]
        if not before:
            return None
        spec = self.out / "burnin-scenario.yaml"
        doc = self.scenario.model_dump(mode="json", include={"fleet", "trainer"})
        spec.write_text(yaml.safe_dump({**doc, "faults": [f.model_dump() for f in before]}))
        exclude, report = self.out / "exclude.txt", self.out / "burnin.json"
        fleet = self.scenario.fleet
        self.note("burnin", None, f"burn-in of {fleet.nodes} nodes ({BURNIN_PHASES}) before launch")
        for index, f in enumerate(self.scenario.faults):
            if isinstance(f, PRELAUNCH_FAULTS):  # on the timeline like every fault, as it strikes
                how = (
                    f"bandwidth x{f.factor}"
                    if isinstance(f, LinkDegradedFault)
                    else ", ".join(f"{k}={v}" for k, v in f.env.items())
                )
                self.note(
                    "fault",
                    f.node,
                    f"injected {f.kind} on {f.node} ({how}) before launch",
                    ref=f"fault:{index}",
                )
        started = time.time() - self.rec.t0
        outputs = ["--json", str(report), "--exclude-out", str(exclude), "--no-progress"]
        cmd, env = self.burnin_command(spec, outputs)
        with (self.out / "burnin.log").open("wb") as log:
            code = subprocess.run(cmd, env=env, stdout=log, stderr=log, timeout=900).returncode
        if code not in (0, 1) or not report.exists():
            raise RuntimeError(f"burn-in failed to run (exit {code}); see {self.out}/burnin.log")
        self.rec.burnin_span = (started, time.time() - self.rec.t0)
        self.rec.burnin = json.loads(report.read_text())
        self.rec.burnin_exclude = list(self.rec.burnin.get("exclude", []))
        excluded = ", ".join(self.rec.burnin_exclude) or "none"
        self.note("burnin", None, f"burn-in {self.rec.burnin['verdict']}: excluded {excluded}")
        return exclude

    # --- where the fleet runs (the Slurm drill overrides these) -------------------------------

    def burnin_command(
        self, spec: Path, outputs: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        """The link burn-in of the gang's nodes (argv, environment): here simulated nodes on
        this machine, each link fault from the scenario file slowing its node's transfers."""
        fleet = self.scenario.fleet
        return [
            *SENTINEL,
            "burnin",
            "--sim-nodes",
            str(fleet.nodes),
            "--gpus-per-node",
            str(fleet.gpus_per_node),
            "--scenario",
            str(spec),
            "--quick",
            "--phases",
            BURNIN_PHASES,
            *outputs,
        ], None

    def coordinator(self) -> CoordinatorProcess:
        coord = CoordinatorProcess(self.out / "coordinator", self.out / "coordinator.log")
        if self.scenario.returns is not None:  # validation before return needs a baseline
            self.note(
                "info",
                None,
                "recording the validation baseline on this machine "
                "(sentinel burnin --validate --save-baseline)",
            )
            baseline = record_baseline(
                SENTINEL,
                self.out / "validation-baseline.json",
                self.scenario.fleet.gpus_per_node,
                self.out / "baseline.log",
            )
            coord.env |= validation_env(baseline, DRILL_COMPRESSION)
        return coord

    def fleet(self, names: list[str]) -> SimFleet:
        return SimFleet(
            self.out / "fleet", names, self.scenario.fleet.gpus_per_node, AGENT_INTERVAL_S
        )

    def fleet_env(self) -> dict[str, str]:
        """More environment for the supervisor and, through it, every rank."""
        return {}

    def checkpoint_tiers(self) -> list[str]:
        """The trainer's checkpoint flags; the supervisor resumes from `out/ckpt`."""
        return ["--ckpt-dir", str(self.out / "ckpt")]

    def supervisor_argv(self, coord_url: str, job_token: Path, exclude: Path | None) -> list[str]:
        fleet, o = self.scenario.fleet, self.out
        trainer = [
            sys.executable,
            "-m",
            "trainer_hooks.reference.train",
            *trainer_args(self.scenario),
            "--out",
            str(o / "run"),
            "--data-dir",
            str(o / "data"),
            *self.checkpoint_tiers(),
            "--faults",
            str(o / "scenario.yaml"),
            "--quiet",
        ]
        argv = [
            "run",
            "--job-id",
            JOB,
            "--coordinator",
            coord_url,
            "--token-file",
            str(job_token),
            "--nodes",
            str(fleet.nodes),
            "--gpus-per-node",
            str(fleet.gpus_per_node),
            "--spares",
            str(fleet.spares),
            "--checkpoint-dir",
            str(o / "ckpt"),
            "--log-dir",
            str(o / "logs"),
            "--rank-socket-template",
            str(o / "fleet" / "{node}" / "agent.sock"),
            "--fr-dir",
            str(o / "fr"),
        ]
        if exclude is not None:
            argv += ["--exclude-file", str(exclude)]
        return [*argv, *recovery_args(self.scenario), "--", *trainer]

    def train(self, timeout_s: float, stall_s: float) -> tuple[Observer, MetricsTail]:
        """Coordinator, agents, supervisor; follow and observe until the job ends."""
        exclude = self.burnin()
        fleet_spec, o = self.scenario.fleet, self.out
        coord = self.coordinator()
        names = fleet_spec.node_names() + fleet_spec.spare_names()
        fleet = self.fleet(names)
        sup: SupervisorProcess | None = None
        follower: Follower | None = None
        observer: Observer | None = None
        operator: Operator | None = None
        try:
            coord.start()
            tokens = {n: coord.token(o / "tokens" / f"{n}.token", "node", node=n) for n in names}
            job_token = coord.token(o / "tokens" / "job.token", "job", job=JOB)
            fleet.coordinator_url, fleet.token_files = coord.url, tokens
            self.note("info", None, f"coordinator {coord.url}; agents for {', '.join(names)}")
            fleet.start(timeout_s=180.0)  # ten agents starting at once on two busy cores
            client = CoordinatorClient(coord.url, coord.admin_token())
            observer = Observer(client, JOB, self.rec.t0, self.note)
            tail = MetricsTail(o / "run" / "metrics.jsonl", self.rec.t0)
            injector = Injector(self.scenario, fleet.inject)
            obs = observer
            follower = Follower(
                tail, injector, lambda ln: self.on_line(ln, obs), self.on_inject, self.on_tick
            )
            observer.start()
            if self.scenario.returns is not None:
                operator = self.operator(coord, fleet, client)
                operator.start()
            sup = SupervisorProcess(
                self.supervisor_argv(coord.url, job_token, exclude),
                o / "supervisor.log",
                hooks_env(o) | self.fleet_env(),
            )
            sup.start()
            follower.start()
            self.note(
                "info",
                None,
                f"training {self.scenario.trainer.steps} steps on "
                f"{fleet_spec.world_size} ranks (sentinel run, job {JOB!r})",
            )
            self._wait(sup, observer, timeout_s, stall_s)
            if operator is not None:
                self._wait_for_returns(operator, start=time.monotonic(), timeout_s=timeout_s)
                operator.stop()
                if operator.error is not None:
                    raise operator.error
                self.rec.returns = operator.record()
            follower.stop()
            observer.stop()
            observer.refresh_details()
            for th in (follower, observer):
                if th.error is not None:
                    raise th.error
            self.rec.injections = list(injector.injected)
            return observer, tail
        finally:
            if operator is not None:
                operator.stop()
            if follower is not None:
                follower.stop()
            if sup is not None:
                sup.stop()
            if observer is not None:
                observer.stop()
            fleet.stop()
            coord.stop()

    def operator(
        self, coord: CoordinatorProcess, fleet: SimFleet, admin: CoordinatorClient
    ) -> Operator:
        """The person of the returns drill, with an operator token; the struck node's GPU is
        damaged when its fault strikes (returns.py)."""
        spec = self.scenario.returns
        assert spec is not None
        token = coord.token(self.out / "tokens" / "operator.token", "operator")

        def damage(node: str) -> None:
            if node == spec.node and self.damage is not None:
                self.damage = None  # once
                for line in damage_lines(spec):
                    fleet.inject(node, line)
                kinds = " + ".join(spec.damage)
                self.note(
                    "info",
                    node,
                    f"{node}'s GPU {spec.gpu} stays damaged ({kinds} in its "
                    "simulated GPU, silent in NVML) until repaired",
                )

        self.damage = damage
        return Operator(
            spec,
            admin,
            token.read_text().strip(),
            lambda line: fleet.inject(spec.node, line),
            self.rec.t0,
            self.note,
        )

    def _wait_for_returns(self, operator: Operator, start: float, timeout_s: float) -> None:
        """After training, until the operator's returns are answered (or the budget is spent)."""
        if not operator.done:
            self.note("info", None, "training over; waiting for the operator's returns")
        while not operator.done and operator.error is None and operator.is_alive():
            if time.monotonic() - start > timeout_s:
                self.note("info", None, f"giving up on the returns after {timeout_s:.0f}s")
                return
            time.sleep(0.2)

    def _wait(
        self, sup: SupervisorProcess, observer: Observer, timeout_s: float, stall_s: float
    ) -> None:
        start = last_seen = time.monotonic()
        count = 0
        while sup.poll() is None:
            if _stopped_for_a_person(observer):
                self.note("info", None, "the job was stopped and handed to a person: run ends")
                return
            now = time.monotonic()
            if len(self.rec.lines) != count:
                count, last_seen = len(self.rec.lines), now
            if now - start > timeout_s:
                self.note("info", None, f"giving up: the job ran past {timeout_s:.0f}s")
                return
            if now - last_seen > stall_s:
                self.note("info", None, f"giving up: no training step for {stall_s:.0f}s")
                return
            time.sleep(0.2)
        self._training_again("the job trained no further step")
        self.note("info", None, f"supervisor exited with {sup.poll()}")

    # --- after the run -----------------------------------------------------------------------

    def strikes(self) -> dict[int, Strike]:
        """When and where each fault struck, from the injector, the trainer's fault markers and
        the metrics (for a corrupt batch)."""
        # Each strike's step is the step in progress when it struck (see result.py): a node
        # fault is written once the line closing `i.step` is seen, during the next step; a rank
        # fault fires at the start of the trainer's loop index `at_step`, i.e. step at_step + 1.
        out: dict[int, Strike] = {
            i.index: Strike(t=i.t, step=i.step + 1, node=i.node) for i in self.rec.injections
        }
        markers = self.out / "run" / "faults"
        for index, f in enumerate(self.scenario.faults):
            if isinstance(f, RANK_FAULTS):
                m = markers / marker_name(f)
                if m.exists():
                    t = m.stat().st_mtime - self.rec.t0
                    out[index] = Strike(t=t, step=f.at_step + 1, node=m.read_text(), rank=f.rank)
            elif isinstance(f, CorruptBatchFault):
                hit = next((ln for ln, _g in self.rec.lines if ln.batch == f.batch), None)
                if hit is not None:
                    out[index] = Strike(t=hit.t - hit.step_s, step=hit.step, node=None)
        return out

    def step_points(self) -> list[StepPoint]:
        return [StepPoint(ln.step, ln.loss, g, ln.t) for ln, g in self.rec.lines]


def _stopped_for_a_person(observer: Observer) -> bool:
    """Sentinel stopped the job (`job.stop`, the supervisor holds it with no gang) and escalated
    an incident: nothing trains until a person acts, so the drill has seen all it will."""
    with observer.lock:
        job = observer.seen.job
        escalated = any(i.get("state") == "escalated" for i in observer.seen.incidents.values())
    return job is not None and job.get("state") == "stopped" and escalated


def marker_name(fault: Any) -> str:
    """The file the trainer writes when a rank fault strikes (trainer_hooks.reference.faults)."""
    return f"{fault.kind}-rank{fault.rank}-step{fault.at_step}.fired"


def write_scenario(scenario: Scenario, path: Path) -> None:
    """The scenario as the trainer's `--faults` reads it (rank and data faults only matter)."""
    doc = scenario.model_dump(mode="json")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
