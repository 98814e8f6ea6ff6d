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

from sentinel.demo.data import StepPoint, TimelineEntry
from sentinel.demo.inject import Follower, Injection, Injector, MetricsTail, StepLine
from sentinel.demo.observe import CoordinatorClient, Observer
from sentinel.demo.procs import SENTINEL, CoordinatorProcess, SupervisorProcess
from sentinel.demo.result import Strike
from sentinel.scenario import RANK_FAULTS, CorruptBatchFault, Scenario
from sentinel.sim.fleet import SimFleet

JOB = "demo"
# A tiny model: about 0.3 s per step for 8 ranks on 2 CPU cores.
MODEL_FLAGS = ["--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--vocab", "128",
               "--corpus-tokens", "32768", "--mbs", "2", "--accum", "2", "--warmup", "2"]  # fmt: skip


def hooks_env(out: Path, pipeline_stages: int = 1) -> dict[str, str]:
    """The trainer hooks' settings for a drill of a few dozen 0.3 s steps: a step report and a
    gang exchange (straggler and SDC comparison) every few steps, a hang declared after a
    stall of several seconds instead of a minute, flight recorders dumped where `sentinel run`
    analyzes them. The loss-spike detector is the shipped default (median/MAD over a short
    window), which follows the tiny model's fast-falling loss. Stragglers are judged from a
    30% slowdown, not 3%: eight ranks share two cores here (and other work often shares them
    too), so a rank's step time next to its replica's swings by 20% on scheduling alone.

    With pipeline parallelism straggler scoring is off (threshold `inf`): a rank's measured
    compute then includes its waits in pipeline receives and DTensor's functional collectives,
    which the hooks do not time as communication, so the ranks a slow rank holds up look as
    slow as it does, and the replica whose ranks write the checkpoint (DCP deduplicates
    replicated shards onto the lowest ranks) runs up to 2x slower for a whole generation on two
    shared cores; scored on that, healthy nodes get evicted.

    The SDC spot check runs at every exchange (a real run spaces it out more: it costs a host
    sync and a small GEMM chain), so that corruption is caught within a checkpoint interval of
    a short drill."""
    return {
        "SENTINEL_HOOKS_REPORT_EVERY": "1",
        "SENTINEL_HOOKS_EXCHANGE_EVERY": "5",
        "SENTINEL_HOOKS_SDC_EVERY": "5",
        "SENTINEL_HOOKS_STRAGGLER_THRESHOLD": "1.3" if pipeline_stages == 1 else "inf",
        "SENTINEL_HOOKS_HANG_FLOOR_S": "8",
        "SENTINEL_HOOKS_HANG_FIRST_STEP_S": "120",
        "SENTINEL_HOOKS_FR_DIR": str(out / "fr"),
    }


def trainer_args(scenario: Scenario) -> list[str]:
    t = scenario.trainer
    return [*MODEL_FLAGS, "--tp", str(t.tp), "--pp", str(t.pp), "--dp", str(t.dp),
            "--steps", str(t.steps), "--checkpoint-every", str(t.checkpoint_every),
            "--seed", str(t.seed)]  # fmt: skip


def quick(scenario: Scenario) -> Scenario:
    """Fewer steps: stop two checkpoint intervals after the last timed fault, or one where two
    would cut nothing (the default scenario's faults run to its last steps). A repair resumes
    from the checkpoint before its fault, so the run crosses that step again within one
    interval and still proves the repair."""
    last = max((getattr(f, "at_step", getattr(f, "batch", 0)) for f in scenario.faults), default=0)
    every, steps = scenario.trainer.checkpoint_every, scenario.trainer.steps
    steps = min(steps, last + 2 * every) if last + 2 * every < steps else min(steps, last + every)
    trainer = scenario.trainer.model_copy(update={"steps": max(steps, 1)})
    return scenario.model_copy(update={"trainer": trainer})


@dataclass
class Recording:
    """What the run saw, in demo seconds since `t0`."""

    t0: float
    lines: list[tuple[StepLine, int]] = field(default_factory=list)  # (line, generation)
    injections: list[Injection] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    burnin: dict[str, Any] | None = None
    burnin_exclude: list[str] = field(default_factory=list)


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

    # --- the live timeline -------------------------------------------------------------------

    def note(self, kind: str, target: str | None, text: str, step: int | None = None) -> None:
        t = time.time() - self.rec.t0
        if step is None and self.rec.lines:
            step = self.rec.lines[-1][0].step
        entry = TimelineEntry(t=t, step=step, kind=kind, target=target, text=text)
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
        if replay or line.step % self.print_every == 0 or line.step == 1:
            tag = " (replayed after rollback)" if replay else ""
            self.echo(f"[{line.t:7.1f}s]    step {line.step:4d}  loss {line.loss:.4f}{tag}")

    def on_inject(self, inj: Injection) -> None:
        fault = self.scenario.faults[inj.index]
        self.note("fault", inj.node, f"injected {fault.kind} on {inj.node}", step=inj.step)

    # --- phases --------------------------------------------------------------------------------

    def burnin(self) -> Path | None:
        """Burn-in of the fleet with the scenario's link faults; returns the exclude file."""
        links = [f for f in self.scenario.faults if f.kind == "link_degraded"]
        if not links:
            return None
        spec = self.out / "burnin-scenario.yaml"
        doc = self.scenario.model_dump(mode="json", include={"fleet", "trainer"})
        spec.write_text(yaml.safe_dump({**doc, "faults": [f.model_dump() for f in links]}))
        exclude, report = self.out / "exclude.txt", self.out / "burnin.json"
        fleet = self.scenario.fleet
        self.note("burnin", None, f"burn-in of {fleet.nodes} nodes (links) before launch")
        cmd = [*SENTINEL, "burnin", "--sim-nodes", str(fleet.nodes), "--gpus-per-node",
               str(fleet.gpus_per_node), "--scenario", str(spec), "--quick", "--phases", "links",
               "--json", str(report), "--exclude-out", str(exclude), "--no-progress"]  # fmt: skip
        with (self.out / "burnin.log").open("wb") as log:
            code = subprocess.run(cmd, stdout=log, stderr=log, timeout=900).returncode
        if code not in (0, 1) or not report.exists():
            raise RuntimeError(f"burn-in failed to run (exit {code}); see {self.out}/burnin.log")
        self.rec.burnin = json.loads(report.read_text())
        self.rec.burnin_exclude = list(self.rec.burnin.get("exclude", []))
        excluded = ", ".join(self.rec.burnin_exclude) or "none"
        self.note("burnin", None, f"burn-in {self.rec.burnin['verdict']}: excluded {excluded}")
        return exclude

    def supervisor_argv(self, coord_url: str, job_token: Path, exclude: Path | None) -> list[str]:
        fleet, o = self.scenario.fleet, self.out
        trainer = [sys.executable, "-m", "trainer_hooks.reference.train",
                   *trainer_args(self.scenario), "--out", str(o / "run"),
                   "--data-dir", str(o / "data"), "--ckpt-dir", str(o / "ckpt"),
                   "--faults", str(o / "scenario.yaml"), "--quiet"]  # fmt: skip
        argv = ["run", "--job-id", JOB, "--coordinator", coord_url, "--token-file",
                str(job_token), "--nodes", str(fleet.nodes), "--gpus-per-node",
                str(fleet.gpus_per_node), "--spares", str(fleet.spares), "--checkpoint-dir",
                str(o / "ckpt"), "--log-dir", str(o / "logs"), "--rank-socket-template",
                str(o / "fleet" / "{node}" / "agent.sock"), "--fr-dir", str(o / "fr")]  # fmt: skip
        if exclude is not None:
            argv += ["--exclude-file", str(exclude)]
        return [*argv, "--", *trainer]

    def train(self, timeout_s: float, stall_s: float) -> tuple[Observer, MetricsTail]:
        """Coordinator, agents, supervisor; follow and observe until the job ends."""
        exclude = self.burnin()
        fleet_spec, o = self.scenario.fleet, self.out
        coord = CoordinatorProcess(o / "coordinator", o / "coordinator.log")
        names = fleet_spec.node_names() + fleet_spec.spare_names()
        fleet = SimFleet(o / "fleet", names, fleet_spec.gpus_per_node)
        sup: SupervisorProcess | None = None
        follower: Follower | None = None
        observer: Observer | None = None
        try:
            coord.start()
            tokens = {n: coord.token(o / "tokens" / f"{n}.token", "--role", "node", "--node", n)
                      for n in names}  # fmt: skip
            job_token = coord.token(o / "tokens" / "job.token", "--role", "job", "--job", JOB)
            fleet.coordinator_url, fleet.token_files = coord.url, tokens
            self.note("info", None, f"coordinator {coord.url}; agents for {', '.join(names)}")
            fleet.start(timeout_s=180.0)  # ten agents starting at once on two busy cores
            client = CoordinatorClient(coord.url, coord.admin_token())
            observer = Observer(client, JOB, self.rec.t0, self.note)
            tail = MetricsTail(o / "run" / "metrics.jsonl", self.rec.t0)
            injector = Injector(self.scenario, fleet.inject)
            obs = observer
            follower = Follower(tail, injector, lambda ln: self.on_line(ln, obs), self.on_inject)
            observer.start()
            sup = SupervisorProcess(self.supervisor_argv(coord.url, job_token, exclude),
                                    o / "supervisor.log",
                                    hooks_env(o, self.scenario.trainer.pp))  # fmt: skip
            sup.start()
            follower.start()
            self.note("info", None, f"training {self.scenario.trainer.steps} steps on "
                      f"{fleet_spec.world_size} ranks (sentinel run, job {JOB!r})")  # fmt: skip
            self._wait(sup, timeout_s, stall_s)
            follower.stop()
            observer.stop()
            observer.refresh_details()
            for th in (follower, observer):
                if th.error is not None:
                    raise th.error
            self.rec.injections = list(injector.injected)
            return observer, tail
        finally:
            if follower is not None:
                follower.stop()
            if sup is not None:
                sup.stop()
            if observer is not None:
                observer.stop()
            fleet.stop()
            coord.stop()

    def _wait(self, sup: SupervisorProcess, timeout_s: float, stall_s: float) -> None:
        start = last_seen = time.monotonic()
        count = 0
        while sup.poll() is None:
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
        self.note("info", None, f"supervisor exited with {sup.poll()}")

    # --- after the run -----------------------------------------------------------------------

    def strikes(self) -> dict[int, Strike]:
        """When and where each fault struck, from the injector, the trainer's fault markers and
        the metrics (for a corrupt batch)."""
        out: dict[int, Strike] = {
            i.index: Strike(t=i.t, step=i.step, node=i.node) for i in self.rec.injections
        }
        markers = self.out / "run" / "faults"
        for index, f in enumerate(self.scenario.faults):
            if isinstance(f, RANK_FAULTS):
                m = markers / f"{f.kind}-rank{f.rank}-step{f.at_step}.fired"
                if m.exists():
                    t = m.stat().st_mtime - self.rec.t0
                    out[index] = Strike(t=t, step=f.at_step, node=m.read_text(), rank=f.rank)
            elif isinstance(f, CorruptBatchFault):
                hit = next((ln for ln, _g in self.rec.lines if ln.batch == f.batch), None)
                if hit is not None:
                    out[index] = Strike(t=hit.t - hit.step_s, step=hit.step - 1, node=None)
        return out

    def step_points(self) -> list[StepPoint]:
        return [StepPoint(ln.step, ln.loss, g, ln.t) for ln, g in self.rec.lines]


def write_scenario(scenario: Scenario, path: Path) -> None:
    """The scenario as the trainer's `--faults` reads it (rank and data faults only matter)."""
    doc = scenario.model_dump(mode="json")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
