"""`sentinel run`: the job supervisor.

It talks to one coordinator, or fails over between the replicas listed in `coordinator_url`
(sentinel/failover.py). It registers the job with the coordinator (its `job.status` heartbeat), launches the gang,
reports rank exits as `rank.crash` events, and carries out job commands it long-polls:
`job.stop`, and `job.restart` with a plan (excluded nodes, spares in their place, the checkpoint
to resume from, batches to skip, a learning-rate scale). The plan reaches the trainer as flags
appended to its command: `--resume-from PATH`, `--skip-batches A-B[,C-D]`, `--lr-scale F:N`.
Rank-level commands (`fr.dump`, `sdc.check`, `checkpoint.now`) are appended as JSON lines to the
file named by `SENTINEL_CONTROL_FILE` in every rank's environment.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError

from sentinel.config import SupervisorConfig
from sentinel.failover import CONNECT_TIMEOUT_S, Coordinators, Reply, Unreachable, request
from sentinel.fr.dumps import dumped_ranks
from sentinel.processes import Teardown, free_rendezvous_port
from sentinel.protocol import (
    CommandKind,
    EventBatch,
    FrAnalysisEvent,
    FrAnalysisPayload,
    JobStatusEvent,
    JobStatusPayload,
    RankCrashEvent,
    RankCrashPayload,
    Recovery,
    RepairPlan,
    Source,
    StopPlan,
    encode,
)
from sentinel.protocol import JobState as ReportedState
from sentinel.supervisor.launcher import Gang, GangPlan, GangStartError, Launcher, RankExit

log = logging.getLogger("sentinel.supervisor")
# Events and acknowledgements: a replica that has not answered in this long (paused, or its
# host gone) is left for the next one, rather than after the long-poll's longer timeout.
_SHORT = aiohttp.ClientTimeout(total=10, sock_connect=CONNECT_TIMEOUT_S)
_CKPT = re.compile(r"step[-_]?(\d+)")


class GangError(RuntimeError):
    """A restart plan that cannot form the gang at its size (a node out with no spare in)."""


@dataclass
class JobState:
    nodes: list[str]
    spares: list[str]
    gpus_per_node: int
    generation: int = 0
    state: str = "starting"
    resume_from: str | None = None
    resume_step: int | None = None  # the step of `resume_from`
    skip: list[tuple[int, int]] = field(default_factory=list)
    lr_scale: tuple[float, int] | None = None
    seen_commands: set[str] = field(default_factory=set)

    def apply_restart(
        self, plan: RepairPlan | dict[str, Any], checkpoints: dict[int, Path]
    ) -> None:
        if not isinstance(plan, RepairPlan):
            plan = RepairPlan.model_validate(plan)
        spare_map, excluded = plan.spare_map, set(plan.exclude)
        new_nodes = []
        for node in self.nodes:
            if node in excluded or node in spare_map:
                if node in spare_map:
                    new_nodes.append(spare_map[node])
                continue
            new_nodes.append(node)
        if len(new_nodes) < len(self.nodes):
            out = sorted(n for n in self.nodes if n in excluded and n not in spare_map)
            raise GangError(
                f"the restart plan takes {', '.join(out)} out with no spare in its place:"
                f" {len(new_nodes)} of {len(self.nodes)} nodes left, the gang cannot be formed"
            )
        self.spares = [s for s in self.spares if s not in spare_map.values()]
        self.nodes = new_nodes
        before = plan.resume_before_step
        eligible = [s for s in checkpoints if before is None or s <= before]
        self.resume_step = max(eligible, default=None)
        self.resume_from = None if self.resume_step is None else str(checkpoints[self.resume_step])
        for lo, hi in plan.skip_batches:
            if (lo, hi) not in self.skip:
                self.skip.append((lo, hi))
        lr = plan.lr_scale
        self.lr_scale = (lr.factor, lr.steps) if lr else None
        self.generation += 1

    def trainer_flags(self) -> list[str]:
        flags = []
        if self.resume_from:
            flags += ["--resume-from", self.resume_from]
        if self.skip:
            flags += ["--skip-batches", ",".join(f"{lo}-{hi}" for lo, hi in self.skip)]
        if self.lr_scale:
            flags += ["--lr-scale", f"{self.lr_scale[0]:g}:{self.lr_scale[1]}"]
        return flags


def find_checkpoints(directory: Path | None, marker: str = "COMMITTED") -> dict[int, Path]:
    """Complete checkpoints by step: `step_N*` / `step-N*` files, or directories holding the
    commit marker. Half-written ones (`*.tmp`, a directory without the marker) are skipped."""
    if directory is None or not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        m = _CKPT.fullmatch(path.stem) or _CKPT.fullmatch(path.name)
        if m is None or path.name.endswith(".tmp"):
            continue
        if path.is_dir() and not (path / marker).exists():
            continue
        found[int(m.group(1))] = path
    return found


def initial_job(
    nodes: int,
    spares: int,
    gpus_per_node: int,
    exclude: frozenset[str],
    given: list[str] | None = None,
) -> JobState:
    """The first node map: excluded nodes (a burn-in's exclude list) give their place to spares,
    in order; with too few spares the job cannot start at its size. `given`: the launcher's
    node names (gang first, then spares), else the simulated fleet's `node-K` and `spare-K`."""
    if given is None:
        given = [f"node-{i}" for i in range(nodes)] + [f"spare-{i}" for i in range(spares)]
    names = given[:nodes]
    free = [s for s in given[nodes : nodes + spares] if s not in exclude]
    placed = []
    for name in names:
        if name not in exclude:
            placed.append(name)
        elif free:
            placed.append(free.pop(0))
        else:
            raise ValueError(
                f"{name} is excluded and no spare is left to take its place "
                f"({spares} spare(s) for {len(set(names) & exclude)} excluded node(s))"
            )
    return JobState(nodes=placed, spares=free, gpus_per_node=gpus_per_node)


class Supervisor:
    def __init__(
        self,
        cfg: SupervisorConfig,
        argv: list[str],
        launcher: Launcher,
        token: str,
        control_file: Path,
        exclude: frozenset[str] = frozenset(),
    ) -> None:
        self.cfg, self.argv, self.launcher = cfg, argv, launcher
        self.token, self.control_file = token, control_file
        names = launcher.node_names(cfg.nodes + cfg.spares)
        self.job = initial_job(cfg.nodes, cfg.spares, cfg.gpus_per_node, exclude, names)
        self.gang: Gang | None = None
        self.plan: GangPlan | None = None
        self.session: aiohttp.ClientSession | None = None
        self.coordinators = Coordinators(cfg.coordinator_url)
        self.done = asyncio.Event()
        self.exit_code = 0
        self._background: set[asyncio.Task[None]] = set()
        self.teardown: Teardown | None = None  # the last stop of a gang
        self._teardowns: dict[str, Teardown | None] = {}  # by command id, for its (re)ack

    # --- coordinator I/O ---------------------------------------------------------------------

    async def _call(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One request to the coordinator, failing over between the replicas it knows."""
        assert self.session is not None
        return await request(self.session, self.coordinators, method, path, **kwargs)

    async def _post(self, events: list[Any]) -> None:
        body = encode(EventBatch(events=events))
        headers = {"Content-Type": "application/json"}
        for attempt in range(5):
            try:
                r = await self._call(
                    "POST", "/v1/events", data=body, headers=headers, timeout=_SHORT
                )
            except Unreachable as e:
                log.warning("%s; retrying", e)
                await asyncio.sleep(max(0.5 * (attempt + 1), e.retry_in_s))
                continue
            if r.status != 200:
                log.warning("coordinator refused events: %s %s", r.status, r.error())
            return

    def _status_event(self) -> Any:
        ckpts = sorted(find_checkpoints(self.cfg.checkpoint_dir, self.cfg.checkpoint_marker))
        payload = JobStatusPayload(
            state=ReportedState(self.job.state),
            generation=self.job.generation,
            world_size=len(self.job.nodes) * self.job.gpus_per_node,
            gpus_per_node=self.job.gpus_per_node,
            nodes=self.job.nodes,
            spares=self.job.spares,
            checkpoints=ckpts,
        )
        return JobStatusEvent(source=Source(job=self.cfg.job_id), payload=payload)

    async def report_status(self) -> None:
        await self._post([self._status_event()])

    async def _heartbeat(self) -> None:
        while not self.done.is_set():
            await self.report_status()
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's can swallow a cancel
                async with asyncio.timeout(self.cfg.heartbeat_s):
                    await self.done.wait()

    async def _commands(self) -> None:
        params = {"job": self.cfg.job_id, "wait": str(self.cfg.poll_wait_s)}
        while not self.done.is_set():
            try:
                r = await self._call("GET", "/v1/commands", params=params)
            except Unreachable as e:
                log.warning("command poll failed (%s); retrying", e)
                await asyncio.sleep(max(1.0, e.retry_in_s))
                continue
            if r.status != 200:
                log.warning("command poll refused: %s %s", r.status, r.error())
                await asyncio.sleep(1.0)
                continue
            for cmd in r.json()["commands"]:
                await self._handle(cmd)

    async def _handle(self, cmd: dict[str, Any]) -> None:
        cid = cmd["id"]
        if cid not in self.job.seen_commands:  # redelivered after a lost ack: do not redo
            self.job.seen_commands.add(cid)
            log.info("command %s %s", cmd["kind"], cid, extra={"command_args": cmd["args"]})
            self.teardown = None
            await self._execute(cmd["kind"], cmd["args"], issued_at=float(cmd.get("ts") or 0))
            self._teardowns[cid] = self.teardown
        detail: dict[str, Any] = {"generation": self.job.generation, "state": self.job.state}
        done = self._teardowns.get(cid)
        if done is not None:  # how the gang ended: the coordinator's teardown step reads it
            detail["teardown"] = done.as_json()
        try:
            r = await self._call(
                "POST",
                f"/v1/commands/{cid}/ack",
                json={"ok": True, "detail": detail},
                timeout=_SHORT,
            )
        except Unreachable as e:  # delivered again later; seen_commands keeps it from a redo
            log.warning("ack of %s not delivered: %s", cid, e)
            return
        if r.status != 200:
            log.warning("ack of %s refused: %s", cid, r.error())

    async def _execute(self, kind: str, args: dict[str, Any], issued_at: float = 0.0) -> None:
        if kind == CommandKind.JOB_STOP:
            stop = StopPlan.model_validate(args)  # the coordinator sent it through the model
            await self._stop_and_report(keep=frozenset(self.job.nodes) - set(stop.replace))
            self.job.state = "stopped"
        elif kind == CommandKind.JOB_RESTART:
            try:
                plan = RepairPlan.model_validate(args)
            except ValidationError as e:  # a plan that is not one: fail the job, loudly
                await self._stop_and_report()
                log.error("cannot restart the job: %s", e)
                self.job.state = "failed"
                self.exit_code = 1
                self.done.set()
                return
            path = self.repair_path(plan)
            log.info("restart by %s", path.value, extra={"path": path.value})
            # The nodes that stay in the gang keep their rank processes warm on a warm restart,
            # unless the plan says their processes cannot be trusted again.
            out = {*plan.exclude, *plan.spare_map, *plan.replace}
            keep = frozenset(self.job.nodes) - out if path != Recovery.RESTART else frozenset()
            await self._stop_and_report(keep=keep)
            try:
                self.job.apply_restart(
                    plan, find_checkpoints(self.cfg.checkpoint_dir, self.cfg.checkpoint_marker)
                )
            except GangError as e:  # never shrink the job: wait, visibly, for a person
                log.error("cannot restart the job, waiting for nodes: %s", e)
                self.job.state = "waiting_for_nodes"
            else:
                await self._launch()
        else:  # rank-level: hand it to the ranks through the control file
            with self.control_file.open("a") as f:
                f.write(json.dumps({"kind": kind, "args": args}) + "\n")
            if kind == CommandKind.FR_DUMP and (self.cfg.fr_dir or self.cfg.fr_from_coordinator):
                # Ranks may have the command from their node's agent before this copy came:
                # their dumps count from when it was issued (the coordinator's clock; not later
                # than now).
                since = min(issued_at or time.time(), time.time())
                task = asyncio.create_task(self._analyze_fr(args.get("check_id"), since))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        await self.report_status()

    def repair_path(self, plan: RepairPlan) -> Recovery:
        """The path of this repair: the one the job asks for (`supervisor.recovery`) where the
        fault allows it, else the fault's own; then the nearest one the launcher can take
        (live is only for jobs whose replicas are fault domains)."""
        wanted = self.cfg.recovery if self.cfg.recovery in plan.paths else plan.path
        order = list(Recovery)  # least to most disruptive
        for path in order[order.index(wanted) :]:
            if path in self.launcher.paths:
                return path
        return Recovery.RESTART

    async def _analyze_fr(self, check_id: str | None, since: float) -> None:
        """Wait for the ranks' dumps, run the analyzer, report what it found."""
        world = len(self.job.nodes) * self.job.gpus_per_node
        if self.cfg.fr_from_coordinator:
            if check_id is None:
                log.error("an fr.dump without a check id: its node-local dumps cannot be found")
                return
            with tempfile.TemporaryDirectory(prefix="sentinel-fr-") as tmp:
                await self._collect_fr(check_id, Path(tmp), world)
                await self._run_fr_analyzer(Path(tmp), check_id)
            return
        fr_dir = self.cfg.fr_dir
        assert fr_dir is not None
        deadline = since + self.cfg.fr_wait_s
        while time.time() < deadline:
            fresh = [p.name for p in fr_dir.glob("*") if p.stat().st_mtime >= since]
            if len(dumped_ranks(fresh)) >= world:
                break  # a rank's sidecar lands after its dump: every dump is whole
            await asyncio.sleep(0.1)
        await self._run_fr_analyzer(fr_dir, check_id)

    async def _collect_fr(self, check_id: str, into: Path, world: int) -> None:
        """The dumps the nodes' agents carried to the coordinator: until every rank's dump and
        sidecar are there (an agent carries a node's files together), or fr_wait_s."""
        deadline = time.time() + self.cfg.fr_wait_s
        files: list[dict[str, Any]] = []
        while time.time() < deadline:
            try:
                r = await self._call("GET", f"/v1/fr/{check_id}")
                files = r.json()["files"] if r.status == 200 else files
            except (Unreachable, ValueError) as e:
                log.warning("cannot read carried dumps (%s); retrying", e)
            if len(dumped_ranks(Path(f["name"]).name for f in files)) >= world:
                break
            await asyncio.sleep(0.25)
        for f in files:  # one directory, as the analyzer reads it; names are per rank
            (into / Path(f["name"]).name).write_bytes(base64.b64decode(f["data"]))
        log.info("collected %d dump file(s) of %s from %d node(s)", len(files), check_id,
                 len({f["node"] for f in files}))  # fmt: skip

    async def _run_fr_analyzer(self, fr_dir: Path, check_id: str | None) -> None:
        argv = [*self.cfg.fr_analyze_command, str(fr_dir), "--json"]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as e:
            log.error("cannot run the flight-recorder analyzer %s: %s", argv[0], e)
            return
        out, err = await proc.communicate()
        try:
            doc = json.loads(out)
            payload = FrAnalysisPayload(
                verdict=str(doc["verdict"]),
                culprit_ranks=[int(r) for r in doc.get("culprit_ranks", [])],
                waiting_ranks=[int(r) for r in doc.get("waiting_ranks", [])],
                check_id=check_id,
            )
        except (ValueError, KeyError, TypeError) as e:
            log.error("flight-recorder analysis failed (%s, exit %s): %s", e, proc.returncode,
                      err.decode(errors="replace")[-500:])  # fmt: skip
            return
        log.info("flight recorder: %s, culprits %s", payload.verdict, payload.culprit_ranks)
        await self._post([FrAnalysisEvent(source=Source(job=self.cfg.job_id), payload=payload)])

    # --- the gang ----------------------------------------------------------------------------

    async def _launch(self) -> None:
        """Launch the job's next generation, off the event loop (a warm launcher waits for
        its node hosts the first time, and for new rank processes after a loss)."""
        plan = GangPlan(
            argv=[*self.argv, *self.job.trainer_flags()],
            nodes=list(self.job.nodes),
            gpus_per_node=self.job.gpus_per_node,
            generation=self.job.generation,
            master_addr=self.cfg.master_addr,
            master_port=(
                self.cfg.master_port + self.job.generation % 1000
                if self.cfg.master_port is not None
                else free_rendezvous_port()
            ),
            env={"SENTINEL_JOB": self.cfg.job_id, "SENTINEL_CONTROL_FILE": str(self.control_file)},
            rank_socket_template=self.cfg.rank_socket_template,
            spares=list(self.job.spares),
        )
        log.info(
            "launching generation %d on %s",
            self.job.generation,
            plan.nodes,
            extra={"argv": plan.argv, "generation": self.job.generation, "nodes": list(plan.nodes)},
        )
        try:
            gang = await asyncio.to_thread(self.launcher.launch, plan)
        except GangStartError as e:  # a node's processes did not come up: its ranks crashed
            log.error("generation %d did not start: %s", self.job.generation, e)
            self.job.state = "crashed"
            await self._report_crashes(
                e.ranks, self.job.generation, self.job.resume_step, reason=f"did not start: {e}"
            )
            return
        except (OSError, RuntimeError, ValueError) as e:  # hosts that never came, a bad command
            log.error("cannot launch generation %d: %s", self.job.generation, e)
            self.job.state = "failed"
            self.exit_code = 1
            self.done.set()
            return
        self.plan, self.gang = plan, gang
        self.job.state = "running"

    async def _stop_gang(self, keep: frozenset[str] = frozenset()) -> list[RankExit]:
        """Stop the gang, bounded and verified (`Gang.stop`), off the event loop (a rank that
        ignores SIGTERM holds it for the grace period); return the ranks that had already died
        on their own (since the last poll, up to the stop's first signal): a rank that crashed
        just as a stop or restart arrived is still a crash, and losing it would hide a flaky
        node from `rank_crash_repeat`. Polled before the stop (what the launcher has seen: a
        Slurm step's task exits) and after it (what died while the stop began, `Gang.stop`).
        `keep`: nodes whose rank processes may stay warm for the next generation."""
        gang, self.gang = self.gang, None  # detached first: the watcher must not see it end
        if gang is None:
            return []
        died = gang.poll()
        result = await asyncio.to_thread(gang.stop, self.cfg.stop_grace_s, keep)
        died = [e for e in died + gang.poll() if e.returncode != 0]
        self.teardown = result
        detail = {"generation": self.job.generation, **result.as_json()}
        if result.verified:
            log.info("gang of generation %d gone in %.1f s", self.job.generation,
                     result.seconds, extra={"teardown": detail})  # fmt: skip
        else:
            log.error("processes of generation %d survived SIGKILL: %s", self.job.generation,
                      result.survivors, extra={"teardown": detail})  # fmt: skip
        return died

    async def _report_crashes(
        self,
        failed: list[RankExit],
        generation: int,
        resumed: int | None,
        reason: str | None = None,
    ) -> None:
        """Report `failed` as crashes of `generation`, which resumed from step `resumed` (both
        read before its gang was stopped: a restart may have launched the next one since)."""
        if not failed:
            return
        log.warning("ranks %s exited abnormally", [e.rank for e in failed])
        progress = self._progress(resumed)
        events = [
            RankCrashEvent(
                source=Source(node=e.node, rank=e.rank, job=self.cfg.job_id),
                payload=RankCrashPayload(
                    exit_code=None if reason or e.returncode < 0 else e.returncode,
                    signal=e.signal,
                    generation=generation,
                    reason=reason,
                    # a node whose processes did not start is at fault, progress or not
                    **(progress | {"no_progress": None} if reason else progress),
                ),
            )
            for e in failed
        ]
        await self._post(events)

    async def _stop_and_report(
        self, dead: Sequence[RankExit] = (), keep: frozenset[str] = frozenset()
    ) -> None:
        """Stop the gang, reporting `dead` and any other rank that had died on its own as
        crashes of the generation that was running; `keep` as for `_stop_gang`."""
        generation, resumed = self.job.generation, self.job.resume_step
        died = await self._stop_gang(keep)
        await self._report_crashes([*dead, *died], generation, resumed)

    def _progress(self, resumed: int | None) -> dict[str, Any]:
        """What a crash report says of the generation's progress: the newest committed
        checkpoint, the one the generation resumed from, and `no_progress` when it committed
        none since (unknown without a checkpoint directory)."""
        if self.cfg.checkpoint_dir is None:
            return {}
        found = find_checkpoints(self.cfg.checkpoint_dir, self.cfg.checkpoint_marker)
        newest = max(found, default=None)
        stuck = newest is None or (resumed is not None and newest <= resumed)
        return {
            "checkpoint": newest,
            "resumed_from": resumed,
            "no_progress": True if stuck else None,
        }

    async def _watch(self) -> None:
        while not self.done.is_set():
            await asyncio.sleep(0.1)
            if self.gang is None or self.plan is None:
                continue
            exits = self.gang.poll()
            failed = [e for e in exits if e.returncode != 0]
            if failed:  # a gang with a dead rank cannot progress; the others may stay warm
                await self._stop_and_report(failed, keep=frozenset(self.job.nodes))
                if self.gang is None:  # else a restart arrived meanwhile: its gang runs
                    self.job.state = "crashed"
                await self.report_status()
            elif self.gang.running() == 0:
                self.job.state = "finished"
                self.gang = None
                await self.report_status()
                self.done.set()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed", exc_info=task.exception())
            self.exit_code = 1
            self.done.set()

    async def run(self) -> int:
        timeout = aiohttp.ClientTimeout(
            total=self.cfg.poll_wait_s + 30, sock_connect=CONNECT_TIMEOUT_S
        )
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as self.session:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._terminate, sig)
            tasks = [asyncio.create_task(c) for c in (self._heartbeat(), self._watch())]
            # Heartbeats flow while the first generation starts (a warm launcher's node hosts
            # import the trainer first); commands are taken once it runs.
            await self._launch()
            tasks.append(asyncio.create_task(self._commands()))
            for t in tasks:
                t.add_done_callback(self._task_ended)
            await self.done.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.gang is not None:  # told to stop (signal) or broken: leave no rank behind
                await self._stop_gang()
                self.job.state = "stopped"
                await self.report_status()
        return self.exit_code

    def _terminate(self, sig: int) -> None:
        log.warning("signal %d: stopping the gang and exiting", sig)
        self.exit_code = 128 + sig
        self.done.set()
