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
import contextlib
import dataclasses
import json
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from sentinel.config import SupervisorConfig
from sentinel.failover import CONNECT_TIMEOUT_S, Coordinators, Reply, Unreachable, request
from sentinel.lighthouse import Lighthouse
from sentinel.processes import Teardown, free_rendezvous_port
from sentinel.protocol import (
    Command,
    CommandKind,
    EventBatch,
    JobState,
    JobStatusEvent,
    JobStatusPayload,
    ProtocolError,
    RankCrashEvent,
    RankCrashPayload,
    Recovery,
    RepairPlan,
    Source,
    StopPlan,
    decode_command,
    encode,
)
from sentinel.supervisor.flight import FlightAnalysis
from sentinel.supervisor.job import GangError, find_checkpoints, initial_job
from sentinel.supervisor.launcher import Gang, GangPlan, GangStartError, Launcher, RankExit
from sentinel.supervisor.replicas import (
    LIGHTHOUSE_ENV,
    REPLICA_ENV,
    ReplicaGang,
    ReplicaLayout,
)

log = logging.getLogger("sentinel.supervisor")
# Events and acknowledgements: a replica that has not answered in this long (paused, or its
# host gone) is left for the next one, rather than after the long-poll's longer timeout.
_SHORT = aiohttp.ClientTimeout(total=10, sock_connect=CONNECT_TIMEOUT_S)
# How often the heartbeat looks for a newly committed checkpoint between its reports (a listing
# of the checkpoint directory: a few entries, one stat each).
CHECKPOINT_LOOK_S = 0.2
# How often a launch waiting for the lighthouse to forget ended replicas asks it again.
LIGHTHOUSE_LOOK_S = 0.05


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
        self.session: aiohttp.ClientSession | None = None
        self.coordinators = Coordinators(cfg.coordinator_url)
        self.done = asyncio.Event()
        self.exit_code = 0
        self._background: set[asyncio.Task[None]] = set()
        self.teardown: Teardown | None = None  # the last stop of a gang
        self._teardowns: dict[str, Teardown | None] = {}  # by command id, for its (re)ack
        # Replicas as fault domains (the trainer's --replicas ft), met at a lighthouse run here.
        self.layout = (
            ReplicaLayout(cfg.replicas, cfg.nodes // cfg.replicas) if cfg.replicas > 1 else None
        )
        self.lighthouse: Lighthouse | None = None
        # Replicas rejoined by a live repair that may not hold the model yet (they heal from a
        # peer at their first quorum), with the lighthouse's quorum id before they rejoined.
        self.joining: dict[int, int | None] = {}
        self._stopped_at: float | None = None  # when rank processes were last ended (monotonic)
        self.flight = FlightAnalysis(cfg, self._call, self._post)
        # One change of the gang at a time: the watch loop's stop of a crashed gang and a
        # command's stop or restart never interleave (a warm rank's slot takes one process).
        self._gang_lock = asyncio.Lock()

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
        ckpts = self._committed()
        payload = JobStatusPayload(
            state=self.job.state,
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
        """Report the job's status every `heartbeat_s`, and as soon as a new checkpoint is
        committed: a repair waiting for one (`wait_checkpoint`) acts on that report, where a
        heartbeat's wait had added up to `heartbeat_s` to it (1.1 s of a straggler's 3.8 s
        repair in a drill)."""
        loop = asyncio.get_running_loop()
        while not self.done.is_set():
            event = self._status_event()
            await self._post([event])
            due = loop.time() + self.cfg.heartbeat_s
            while not self.done.is_set() and (left := due - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's can swallow one
                    async with asyncio.timeout(min(left, CHECKPOINT_LOOK_S)):
                        await self.done.wait()
                # off the event loop: a checkpoint directory may sit on a slow shared filesystem
                if await asyncio.to_thread(self._committed) != event.payload.checkpoints:
                    break

    def _committed(self) -> list[int]:
        return sorted(find_checkpoints(self.cfg.checkpoint_dir, self.cfg.checkpoint_marker))

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
            for raw in r.json()["commands"]:
                try:
                    cmd = decode_command(raw)
                except ProtocolError as e:
                    await self._unreadable(raw, e)
                    continue
                await self._handle(cmd)

    async def _handle(self, cmd: Command) -> None:
        if cmd.id not in self.job.seen_commands:  # redelivered after a lost ack: do not redo
            self.job.seen_commands.add(cmd.id)
            log.info("command %s %s", cmd.kind.value, cmd.id, extra={"command_args": cmd.args})
            self.teardown = None
            await self._execute(cmd)
            self._teardowns[cmd.id] = self.teardown
        detail: dict[str, Any] = {"generation": self.job.generation, "state": self.job.state}
        done = self._teardowns.get(cmd.id)
        if done is not None:  # how the gang ended: the coordinator's teardown step reads it
            detail["teardown"] = done.as_json()
        await self._ack(cmd.id, True, detail)

    async def _ack(self, cid: str, ok: bool, detail: dict[str, Any]) -> None:
        try:
            r = await self._call(
                "POST",
                f"/v1/commands/{cid}/ack",
                json={"ok": ok, "detail": detail},
                timeout=_SHORT,
            )
        except Unreachable as e:  # delivered again later; seen_commands keeps it from a redo
            log.warning("ack of %s not delivered: %s", cid, e)
            return
        if r.status != 200:
            log.warning("ack of %s refused: %s", cid, r.error())

    async def _unreadable(self, raw: object, error: ProtocolError) -> None:
        """A command the protocol's decoder refuses. A restart that cannot be read fails the
        job, loudly: no plan says how to form the gang again. Either way it is refused in its
        ack, so that it is not delivered again."""
        doc = raw if isinstance(raw, dict) else {}
        log.error("coordinator sent a malformed command: %s", error)
        if doc.get("kind") == CommandKind.JOB_RESTART:
            async with self._gang_lock:
                await self._stop_and_report()
            log.error("cannot restart the job: %s", error)
            self.job.state = JobState.FAILED
            self.exit_code = 1
            self.done.set()
            await self.report_status()
        if isinstance(cid := doc.get("id"), str) and cid not in self.job.seen_commands:
            self.job.seen_commands.add(cid)
            await self._ack(cid, False, {"error": str(error)})

    async def _execute(self, cmd: Command) -> None:
        if cmd.kind == CommandKind.JOB_STOP:
            stop = StopPlan.model_validate(cmd.args)  # the decoder checked it against the model
            async with self._gang_lock:
                await self._stop_and_report(keep=frozenset(self.job.nodes) - set(stop.replace))
                self.job.state = JobState.STOPPED
        elif cmd.kind == CommandKind.JOB_RESTART:
            async with self._gang_lock:
                await self._restart(RepairPlan.model_validate(cmd.args))
        else:  # rank-level: hand it to the ranks through the control file
            with self.control_file.open("a") as f:
                f.write(json.dumps({"kind": cmd.kind, "args": cmd.args}) + "\n")
            if cmd.kind == CommandKind.FR_DUMP and (
                self.cfg.fr_dir or self.cfg.fr_from_coordinator
            ):
                # Ranks may have the command from their node's agent before this copy came:
                # their dumps count from when it was issued (the coordinator's clock; not later
                # than now).
                since = min(cmd.ts or time.time(), time.time())
                world = len(self.job.nodes) * self.job.gpus_per_node
                check_id = cmd.args.get("check_id")
                if cmd.args.get("purpose") != "evidence":
                    work = self.flight.analyze(check_id, since, world)
                elif self.cfg.fr_dir and check_id:  # else the nodes' agents carry them
                    work = self.flight.keep(str(check_id), since, world)
                else:
                    await self.report_status()
                    return
                task = asyncio.create_task(work)
                self._background.add(task)
                task.add_done_callback(self._background_done)
        await self.report_status()

    async def _restart(self, plan: RepairPlan) -> None:
        path = self.repair_path(plan)
        if self.joining:
            await asyncio.to_thread(self._count_healed)
        struck = self._struck_replicas(plan) if path == Recovery.LIVE else set()
        if path == Recovery.LIVE and not struck:  # every rank stops: the next path down
            path = self._path_from(Recovery.WARM_RESTART)
        log.info("restart by %s", path.value, extra={"path": path.value})
        if struck:
            await self._live_repair(plan, struck)
            return
        # The nodes that stay in the gang keep their rank processes warm on a warm restart,
        # unless the plan says their processes cannot be trusted again. A replica still
        # healing is ended at once: it holds nothing a leave would keep, and it waits in its
        # first quorum, where no step boundary comes to leave at (its node hosts fork anew).
        out = {*plan.exclude, *plan.spare_map, *plan.replace, *self._healing_nodes()}
        keep = frozenset(self.job.nodes) - out if path != Recovery.RESTART else frozenset()
        await self._stop_and_report(keep=keep)
        try:
            left = self.job.apply_restart(
                plan, find_checkpoints(self.cfg.checkpoint_dir, self.cfg.checkpoint_marker)
            )
        except GangError as e:  # never shrink the job: wait, visibly, for a person
            log.error("cannot restart the job, waiting for nodes: %s", e)
            self.job.state = JobState.WAITING_FOR_NODES
            return
        self._release(left)
        await self._launch()

    def _struck_replicas(self, plan: RepairPlan) -> set[int]:
        """The replicas a live repair would stop: those holding the plan's nodes, while the
        others still train. Empty when the live path cannot serve the plan: no replica is
        struck, no replica holding the model would be left (each is struck, or rejoined and
        not yet healed: the others would heal from nothing), or the gang is not running (a
        rank's death stopped it as the command arrived): then every rank stops."""
        gang, layout = self.gang, self.layout
        if not isinstance(gang, ReplicaGang) or layout is None:
            return set()
        out = {*plan.exclude, *plan.spare_map, *plan.replace}
        struck = layout.struck(self.job.nodes, out)
        holding = set(gang.gangs) - struck - set(self.joining)
        if struck and not holding:
            log.warning(
                "replica(s) %s struck; no other replica holds the model (still healing: %s)",
                sorted(struck),
                sorted(self.joining),
            )
        return struck if holding else set()

    def _healing_nodes(self) -> list[str]:
        layout = self.layout
        if layout is None:
            return []
        return [n for r in sorted(self.joining) for n in layout.nodes(self.job.nodes, r)]

    def _count_healed(self) -> None:
        """Let go of the rejoined replicas the lighthouse has seen train at their peers' step
        in a quorum formed after they rejoined. One whose quorum id before it rejoined is not
        known, or that the lighthouse does not show, still counts as healing."""
        view = self.lighthouse.last_quorum() if self.lighthouse else None
        if view is None:
            return
        for replica, before in list(self.joining.items()):
            if before is not None and view.quorum_id > before and view.at_peers_step(replica):
                del self.joining[replica]

    async def _live_repair(self, plan: RepairPlan, struck: set[int]) -> None:
        """The live path: only the `struck` replicas stop; they rejoin on their new nodes and
        heal from a live peer; the others never stop."""
        gang, layout = self.gang, self.layout
        assert isinstance(gang, ReplicaGang) and layout is not None
        out = {*plan.exclude, *plan.spare_map, *plan.replace}
        leaving = [n for r in sorted(struck) for n in layout.nodes(self.job.nodes, r)]
        keep = frozenset(leaving) - out  # the struck replicas' sound nodes stay warm
        generation, resumed = self.job.generation, self.job.resume_step
        stops = [
            await asyncio.to_thread(gang.stop_replica, r, self.cfg.stop_grace_s, keep)
            for r in sorted(struck)
        ]
        self.teardown = stops[0][0]
        self._stopped_at = time.monotonic()
        died = [e for _teardown, ended in stops for e in ended if e.returncode != 0]
        await self._report_crashes(died, generation, resumed)
        try:
            left = self.job.swap_nodes(plan)
        except GangError as e:  # the survivors train on; the replica waits for a node
            log.error("replica(s) %s cannot rejoin, waiting for nodes: %s", sorted(struck), e)
            return
        self.job.generation += 1
        self._release(left)
        view = await asyncio.to_thread(self.lighthouse.last_quorum) if self.lighthouse else None
        await self._launch(only=struck)
        self.joining |= dict.fromkeys(struck, None if view is None else view.quorum_id)

    def _release(self, nodes: list[str]) -> None:
        for node in nodes:
            self.launcher.release(node)

    def repair_path(self, plan: RepairPlan) -> Recovery:
        """The path of this repair: the one the job asks for (`supervisor.recovery`) where the
        fault allows it, else the fault's own; then the nearest one the launcher can take
        (live is only for jobs whose replicas are fault domains)."""
        wanted = self.cfg.recovery if self.cfg.recovery in plan.paths else plan.path
        return self._path_from(wanted)

    def _path_from(self, wanted: Recovery) -> Recovery:
        """`wanted`, or the nearest more disruptive path the launcher can take."""
        order = list(Recovery)  # least to most disruptive
        able = self.launcher.paths | ({Recovery.LIVE} if self.layout else set())
        for path in order[order.index(wanted) :]:
            if path in able:
                return path
        return Recovery.RESTART

    # --- the gang ----------------------------------------------------------------------------

    async def _launch(self, only: set[int] | None = None) -> None:
        """Launch the job's next generation, off the event loop (a warm launcher waits for
        its node hosts the first time, and for new rank processes after a loss). `only`: the
        replicas that rejoin after a live repair (their peers run on)."""
        plans = self._plans(only)
        await self._lighthouse_forgets(only)
        log.info(
            "launching generation %d on %s",
            self.job.generation,
            self.job.nodes,
            extra={
                "argv": next(iter(plans.values())).argv,
                "generation": self.job.generation,
                "nodes": list(self.job.nodes),
                # a live repair's rejoining replicas start; their peers run on
                "launched": [n for p in plans.values() for n in p.nodes],
                "replicas": sorted(r for r in plans if r is not None),
            },
        )
        try:
            gangs = {r: await asyncio.to_thread(self.launcher.launch, p) for r, p in plans.items()}
        except GangStartError as e:  # a node's processes did not come up: its ranks crashed
            log.error("generation %d did not start: %s", self.job.generation, e)
            self.job.state = JobState.CRASHED
            await self._report_crashes(
                e.ranks, self.job.generation, self.job.resume_step, reason=f"did not start: {e}"
            )
            return
        except (OSError, RuntimeError, ValueError) as e:  # hosts that never came, a bad command
            log.error("cannot launch generation %d: %s", self.job.generation, e)
            self.job.state = JobState.FAILED
            self.exit_code = 1
            self.done.set()
            return
        if self.layout is None:
            self.gang = gangs[None]
        elif only is not None and isinstance(self.gang, ReplicaGang):
            for r, g in gangs.items():
                assert r is not None
                self.gang.rejoin(r, g)
        else:  # every replica starts from the same checkpoint (or the seed)
            per_replica = self.layout.nodes_per_replica * self.job.gpus_per_node
            self.gang = ReplicaGang({r: g for r, g in gangs.items() if r is not None}, per_replica)
            self.joining.clear()
        self.job.state = JobState.RUNNING

    async def _lighthouse_forgets(self, only: set[int] | None) -> None:
        """Wait until the lighthouse no longer puts the replicas of the processes last ended in a
        quorum. One that was waiting for a quorum when it ended stays asked for one until its
        last heartbeat is `forgets_s` old: a new replica asking before then was put in a quorum
        with it, and tried to heal from its dead peer for 50 s (the TCP store's connect
        timeouts). When every replica was ended (`only` None), none that still counts as asking
        is a live one: the launch goes on as soon as none does (most often at once: a replica
        stopped in a collective asked for nothing). A live repair's joiners (`only`) wait the
        whole time: the survivors ask at every step."""
        lighthouse, stopped = self.lighthouse, self._stopped_at
        if lighthouse is None or stopped is None:
            return
        deadline = stopped + lighthouse.forgets_s
        while (wait := deadline - time.monotonic()) > 0:
            if only is None and await asyncio.to_thread(lighthouse.asking) == 0:
                return
            await asyncio.sleep(min(wait, LIGHTHOUSE_LOOK_S))

    def _plans(self, only: set[int] | None) -> dict[int | None, GangPlan]:
        """The gang plans to launch: the whole job's, or one per replica (`only`: those)."""
        layout = self.layout
        # A replica that rejoins heals from a live peer: it reads no checkpoint.
        flags = self.job.trainer_flags(resume=only is None)
        whole = GangPlan(
            argv=[*self.argv, *flags],
            nodes=list(self.job.nodes),
            gpus_per_node=self.job.gpus_per_node,
            generation=self.job.generation,
            master_addr=self.cfg.master_addr,
            master_port=self._port(0),
            env={"SENTINEL_JOB": self.cfg.job_id, "SENTINEL_CONTROL_FILE": str(self.control_file)},
            rank_socket_template=self.cfg.rank_socket_template,
            spares=list(self.job.spares),
        )
        if layout is None:
            return {None: whole}
        assert self.lighthouse is not None
        meet = {LIGHTHOUSE_ENV: self.lighthouse.address}
        return {
            r: dataclasses.replace(
                whole,
                nodes=layout.nodes(self.job.nodes, r),
                master_port=self._port(r),
                env=whole.env | meet | {REPLICA_ENV: str(r)},
                label=f"replica{r}",
            )
            for r in range(layout.replicas)
            if only is None or r in only
        }

    def _port(self, offset: int) -> int:
        """Each launch's rendezvous port: a fixed base moved by generation (and replica), or a
        free one (a stale rendezvous would hang the new gang)."""
        if self.cfg.master_port is None:
            return free_rendezvous_port()
        return self.cfg.master_port + (self.job.generation * 8 + offset) % 1000

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
        self._stopped_at = time.monotonic()
        detail = {"generation": self.job.generation, **result.as_json()}
        if result.verified:
            log.info(
                "gang of generation %d gone in %.1f s",
                self.job.generation,
                result.seconds,
                extra={"teardown": detail},
            )
        else:
            log.error(
                "processes of generation %d survived SIGKILL: %s",
                self.job.generation,
                result.survivors,
                extra={"teardown": detail},
            )
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
        log.warning(
            "ranks %s exited abnormally",
            [e.rank for e in failed],
            extra={
                "exits": [
                    {"rank": e.rank, "node": e.node, "code": e.returncode, "why": e.why}
                    for e in failed
                ]
            },
        )
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
            if self.gang is None:
                continue
            async with self._gang_lock:  # a stop or restart command waits for this stop
                exits = self.gang.poll() if self.gang is not None else []
                failed = [e for e in exits if e.returncode != 0]
                if failed:  # a gang with a dead rank cannot progress; the others may stay warm
                    await self._stop_and_report(failed, keep=frozenset(self.job.nodes))
                    self.job.state = JobState.CRASHED
            if failed:
                await self.report_status()
            elif self.gang is not None and self.gang.running() == 0:
                self.job.state = JobState.FINISHED
                self.gang = None
                await self.report_status()
                self.done.set()

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("flight-recorder analysis failed", exc_info=task.exception())

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
            if self.layout is not None:  # where the replicas meet (the supervisor's address)
                self.lighthouse = await asyncio.to_thread(
                    Lighthouse,
                    self.control_file.parent / "lighthouse.log",
                    self.launcher.advertise,
                )
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
                self.job.state = JobState.STOPPED
                await self.report_status()
            if self.lighthouse is not None:
                self.lighthouse.close()
        return self.exit_code

    def _terminate(self, sig: int) -> None:
        log.warning("signal %d: stopping the gang and exiting", sig)
        self.exit_code = 128 + sig
        self.done.set()
