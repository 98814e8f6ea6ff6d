"""`SentinelHooks`: the one object a training loop holds.

    hooks = SentinelHooks.from_env(model=model, flops_per_token=fpt)   # on every rank
    for step in range(start, steps):
        with hooks.step(step, tokens=batch_tokens):
            loss = model(x).loss; loss.backward()
            hooks.observe(loss=loss, grad_norm=clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
        if hooks.should_checkpoint(): save(...)
        # when a save is complete (committed: a restart could resume from it)
        hooks.checkpoint_saved(saved_step, blocked_s=seconds_it_held_training)
    hooks.close()

Nothing here raises into the loop: every entry point is guarded, and internal failures are
counted in `errors` (and reported in `rank.step`). Nothing here syncs host and device in a step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch import nn

from sentinel.beacon import Beacon, beacon_path, fr_trigger_path, remove_leftovers
from sentinel.protocol import (
    WITH_STACKS,
    Command,
    CommandKind,
    EventKind,
    RankAnomalyPayload,
    RankCheckpointPayload,
    RankFrDumpPayload,
    RankHangPayload,
    RankLaunchPayload,
    RankRegistration,
    RankStepPayload,
    RankStragglerPayload,
    Source,
    encode_registration,
    make_event,
)
from trainer_hooks import mfu, stacks, timing
from trainer_hooks.anomaly import AnomalyMonitor
from trainer_hooks.config import HooksConfig
from trainer_hooks.exchange import ExchangeRow, GangExchange, Gathered
from trainer_hooks.flight import FlightRecorder, SignalDumper, recorder_enabled
from trainer_hooks.scalars import ScalarReader
from trainer_hooks.sdc_check import Finish, SdcCheck
from trainer_hooks.straggler import StepLog, StragglerScorer, decode_row
from trainer_hooks.transport import AgentTransport
from trainer_hooks.watchdog import HangWatchdog

log = logging.getLogger("trainer_hooks")
P = ParamSpec("P")
R = TypeVar("R")


def _guarded(fn: Callable[P, R]) -> Callable[P, R | None]:
    """Count and log (once per place) any internal error instead of raising into the loop."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        self = args[0]
        try:
            return fn(*args, **kwargs)
        except Exception:
            self.errors += 1  # type: ignore[attr-defined]
            if fn.__name__ not in self._logged:  # type: ignore[attr-defined]
                self._logged.add(fn.__name__)  # type: ignore[attr-defined]
                log.exception(
                    "sentinel hooks: %s failed (counted, training continues)", fn.__name__
                )
            return None

    return wrapper


class SentinelHooks:
    def __init__(
        self,
        config: HooksConfig | None = None,
        *,
        model: nn.Module | None = None,
        flops_per_token: float | None = None,
        device: torch.device | None = None,
        replica_groups: list[list[int]] | None = None,
        peer_groups: list[list[int]] | None = None,
        transport: AgentTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        world: str | None = None,
        rank_offset: int = 0,
    ) -> None:
        """`world`, `rank_offset`: this process group's world is one of several in the job (a
        data-parallel replica of its own): the hooks report the job's rank (the world's rank
        plus `rank_offset`) and label the flight recorder's dumps with the world."""
        self.config = cfg = config or HooksConfig()
        self.errors = 0
        self._logged: set[str] = set()
        self._clock = clock
        self.world, self.rank_offset = world, rank_offset
        local = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        self.rank = local + rank_offset
        self.source = Source(node=cfg.node, rank=self.rank, job=cfg.job or "local")
        self.device = device or _default_device()
        self.model = model
        self.replica_groups = replica_groups
        # Ranks doing the same work, compared for stragglers (default: the replicas).
        self.peer_groups = peer_groups or replica_groups
        self.timer = timing.StepTimer(self.device)
        self.scalars = ScalarReader()
        self.anomalies = AnomalyMonitor(cfg.anomaly_policy)
        self.stragglers = StragglerScorer(
            threshold=cfg.straggler_threshold,
            persist=cfg.straggler_persist,
            window=cfg.straggler_window,
            over=cfg.straggler_over,
            baseline=cfg.straggler_baseline,
            baseline_max=cfg.straggler_baseline_max,
            history=cfg.straggler_history,
        )
        # One exchange carries the steps since the last (one more if a GPU timing came late).
        self.steplog = StepLog(cfg.exchange_every + 1)
        fpt = flops_per_token or cfg.flops_per_token
        if fpt is None and model is not None:
            fpt = mfu.flops_per_token(mfu.non_embedding_params(model))
        # Turned off, the hooks cost nothing: no peak-FLOP/s measurement, no side group.
        peak = mfu.device_peak_flops(self.device, cfg.peak_flops) if fpt and cfg.enabled else None
        self.mfu = mfu.MfuMeter(fpt, peak)
        self.exchange = GangExchange(enabled=cfg.enabled)
        self.transport = transport or AgentTransport(cfg.agent_socket)
        self.transport.on_command(self._on_command)
        self.flight = (
            FlightRecorder(cfg.fr_dir, self.rank, prefix=cfg.fr_prefix, meta=self._fr_meta())
            if cfg.fr_dir
            else None
        )
        if self.flight and not recorder_enabled():
            log.warning("TORCH_FR_BUFFER_SIZE is not set: flight-recorder dumps will be empty")
        self.beacon = self._open_beacon(cfg)
        if self.flight and self.beacon:  # an agent watches: it can ask for a dump without GIL
            self.flight.arm_native(fr_trigger_path(os.getpid(), self.rank))
        self.watchdog = HangWatchdog(
            self._on_hang,
            k=cfg.hang_k,
            floor_s=cfg.hang_floor_s,
            first_step_s=cfg.hang_first_step_s,
            clock=clock,
            poll_s=cfg.watchdog_poll_s,
            beacon=self.beacon,
        )
        self.sdc_check = SdcCheck(cfg, self.device, model, self._send, rank_offset, replica_groups)
        self._requests = {"sdc": threading.Event(), "checkpoint": threading.Event()}
        self._checkpoint_due = False
        self._save_began = 0.0  # wall clock: every `checkpoint.now` issued before is answered
        self._launch: RankLaunchPayload | None = None  # reported after the next step ends
        self._steps_done = 0
        self._step: int | None = None
        self._tokens: int | None = None
        self._step_wall0 = 0.0
        self._last_scalars: dict[str, float | None] = {}
        # Gathers posted at one hooked step and finished at the next (`trainer_hooks.exchange`),
        # in the order they were posted: the same order on every rank.
        self._inflight: list[tuple[Gathered[Any], Finish]] = []
        # What the last end_step did beyond the step's own work: "sdc" (computed an SDC check's
        # digests), "exchange" (posted or took a gather), or None.
        self.periodic_work: str | None = None
        self.signals = SignalDumper(self._dump_before_exit)
        if cfg.enabled:
            self.transport.start()
            self.watchdog.start()
            if cfg.instrument_collectives:
                timing.instrument_collectives(self.timer)
            if self.flight and cfg.fr_on_signal:
                self.signals.install()

    @classmethod
    def from_env(cls, **kwargs: Any) -> SentinelHooks:
        """Settings from `SENTINEL_*` variables (see `HooksConfig`); keyword args as `__init__`."""
        return cls(HooksConfig.from_env(), **kwargs)

    # --- the loop's API -------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, step: int, tokens: int | None = None) -> Iterator[SentinelHooks]:
        self.begin_step(step, tokens)
        try:
            yield self
        finally:
            self.end_step()

    @_guarded
    def begin_step(self, step: int, tokens: int | None = None) -> None:
        if not self.config.enabled:
            return
        self._step, self._tokens = step, tokens
        self.sdc_check.saw_step(step)
        self._step_wall0 = self._clock()
        self.timer.begin(step)

    @_guarded
    def observe(
        self,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        tokens: int | None = None,
        step: int | None = None,
    ) -> None:
        """Hand over this step's loss / grad norm (tensors stay on the device) and tokens;
        `step`: the step's number where it changed inside the step (a replica that healed from
        a live peer in it took its peers' step), so that its reports name the step it trained."""
        if not self.config.enabled:
            return
        if step is not None and self._step is not None and step != self._step:
            self._step = step
            self.timer.renumber(step)
        if loss is not None:
            self.scalars.observe("loss", loss)
        if grad_norm is not None:
            self.scalars.observe("grad_norm", grad_norm)
        if tokens is not None:
            self._tokens = tokens

    def comm(self) -> contextlib.AbstractContextManager[None]:
        """Mark a region as communication wait (e.g. around an async collective's `.wait()`)."""
        return self.timer.comm() if self.config.enabled else contextlib.nullcontext()

    @_guarded
    def end_step(self) -> None:
        if not self.config.enabled or self._step is None:
            return
        step, self._step = self._step, None
        self.periodic_work = None
        self.timer.end()
        self.scalars.end_step(step)
        self.watchdog.progress(step, self._clock() - self._step_wall0)
        self._steps_done += 1
        if self._launch is not None:
            self._report_launch()
        for t in self.timer.poll():
            self.steplog.add(t.step, t.compute_s)
            if t.step % self.config.report_every == 0:
                self._report_step(t)
        for s in self.scalars.poll():
            self._check_scalars(s.step, s.loss, s.grad_norm)
        self._finish_inflight(step)
        if self._steps_done % self.config.exchange_every == 0:
            self._exchange(step)

    def should_checkpoint(self) -> bool:
        """True once, on every rank at the same step, after a `checkpoint.now` command."""
        due, self._checkpoint_due = self._checkpoint_due, False
        return due

    def checkpoint_asked(self) -> bool:
        """A `checkpoint.now` reached this rank and no save has begun since. A trainer with a
        collective of its own every step agrees on it there, a step after the command, rather
        than at the hooks' next exchange (`should_checkpoint`: up to `exchange_every` steps,
        20 shipped); it then calls `saving()`."""
        return self._requests["checkpoint"].is_set()

    def saving(self) -> None:
        """The trainer begins a save (call it on every rank at the same step): it answers every
        `checkpoint.now` issued before now, whether this rank has seen it yet or not."""
        self._save_began = time.time()
        self._requests["checkpoint"].clear()
        self._checkpoint_due = False

    @_guarded
    def checkpoint_saved(
        self, step: int, *, blocked_s: float | None = None, path: str | None = None
    ) -> None:
        """Report a checkpoint at `step` that a restart can resume from: call it once the save
        is complete (committed), not when it starts, since a save torn by a crash is no
        checkpoint. One rank reporting it is enough (the one that commits); `blocked_s` is how
        long the save held up training, if the trainer measures it."""
        if not self.config.enabled:
            return
        payload = RankCheckpointPayload(step=step, blocked_s=blocked_s, path=path)
        self._send(EventKind.RANK_CHECKPOINT, payload)

    @_guarded
    def launched(
        self,
        *,
        main_at: float,
        rendezvous_s: float,
        load_s: float,
        ready_at: float,
        resume_step: int,
    ) -> None:
        """Report this launch's start-up (wall-clock epochs, seconds) with the end of the
        next step, the first this launch trains: the coordinator places a repair's relaunch,
        rendezvous, checkpoint load and first step with it. One rank calling it is enough."""
        if not self.config.enabled:
            return
        self._launch = RankLaunchPayload(  # checked here, once, outside any step
            main_at=main_at,
            rendezvous_s=rendezvous_s,
            load_s=load_s,
            ready_at=ready_at,
            first_step_at=ready_at,
            resume_step=resume_step,
        )

    def register_rank(
        self, *, tp: int = 0, pp: int = 0, dp: int = 0, gpu: int | None = None
    ) -> None:
        """Tell the node's agent which GPU this rank owns and where the rank sits in the
        parallel groups, so the GPU's telemetry carries the job and rank while the rank runs.
        On a GPU the agent finds it by this process's pid in NVML's process list (the device
        index CUDA sees need not be NVML's); pass `gpu` (NVML's index) to name it instead. On
        CPU (simulated GPUs) the rank's LOCAL_RANK names it."""
        if not self.config.enabled:
            return
        on_gpu = self.device.type == "cuda"
        if gpu is None and not on_gpu:
            gpu = int(os.environ.get("LOCAL_RANK", "0"))
        reg = RankRegistration(
            job=self.source.job or "local",
            rank=self.rank,
            gpu=gpu,
            pid=os.getpid() if on_gpu or self.beacon else None,
            tp=tp,
            pp=pp,
            dp=dp,
            beacon=str(self.beacon.path) if self.beacon else None,
        )
        self.transport.register(encode_registration(reg))

    def request_sdc_check(self) -> None:
        """Run the SDC check at the next exchange (all ranks together)."""
        self._requests["sdc"].set()

    def pause_watchdog(self) -> contextlib.AbstractContextManager[None]:
        return self.watchdog.paused()

    @property
    def steps_done(self) -> int:
        """Steps this object has seen end (its own count: exchange and SDC cadence follow it)."""
        return self._steps_done

    @contextlib.contextmanager
    def bypassed(self) -> Iterator[None]:
        """For steps the loop runs without calling the hooks (an overhead benchmark's "off"
        blocks): the watchdog is paused, so the missing progress is no hang, and the collective
        wrappers are taken off, so those steps run exactly as without hooks. Enter and leave it
        between steps, never inside one."""
        wrapped = self.config.enabled and self.config.instrument_collectives
        with self.watchdog.paused():
            if wrapped:
                timing.uninstrument_collectives()
            try:
                yield
            finally:
                if wrapped:
                    timing.instrument_collectives(self.timer)

    def dump_flight_recorder(
        self, reason: str = "manual", check_id: str | None = None, with_stacks: bool = False
    ) -> Path | None:
        if self.flight is None:
            return None
        try:
            path, entries = self.flight.dump(reason, self.watchdog.last_step, with_stacks)
        except Exception:
            self.errors += 1
            log.exception("flight recorder dump failed")
            return None
        self._send(
            EventKind.RANK_FR_DUMP,
            RankFrDumpPayload(
                step=self.watchdog.last_step,
                path=str(path),
                reason=reason,
                entries=entries,
                check_id=check_id,
            ),
        )
        return path

    def close(self) -> None:
        """Stop the threads; take the results of gathers still in flight (no new collective:
        a rank closing on an error path may have peers that never will)."""
        with contextlib.suppress(Exception):
            self._finish_inflight(None, timeout_s=5.0)
        with contextlib.suppress(Exception):
            self.watchdog.stop()
            timing.uninstrument_collectives()
            self.transport.stop()
        if self.beacon is not None:
            self.beacon.close()
        if self.flight is not None:
            self.flight.close()

    # --- internals ---------------------------------------------------------------------------

    def _open_beacon(self, cfg: HooksConfig) -> Beacon | None:
        """The beacon the node's agent watches this rank's progress through (only where an
        agent listens); a host without /dev/shm goes without, said once."""
        if not (cfg.enabled and self.transport.socket_path):
            return None
        remove_leftovers()  # what this user's ranks killed before left in /dev/shm
        try:
            return Beacon(beacon_path(os.getpid(), self.rank), cfg.hang_first_step_s)
        except OSError as e:
            log.warning("no beacon for the agent's outside watchdog: %s", e)
            return None

    def _send(self, kind: EventKind, payload: BaseModel) -> None:
        self.transport.send(make_event(kind, self.source, payload))

    def _report_launch(self) -> None:
        """The launch's report, with the first step's end: the host's clock as the loop left
        the step (on a GPU, the step's kernels may still run; no sync is added for it)."""
        launch, self._launch = self._launch, None
        if launch is None:
            return
        ended = max(time.time(), launch.ready_at)
        payload = launch.model_copy(update={"first_step_at": ended})
        source = self.source
        self.transport.send(lambda: make_event(EventKind.RANK_LAUNCH, source, payload))

    def _report_step(self, t: timing.StepTiming) -> None:
        tokens = self._tokens
        tflops, util = self.mfu.compute(tokens, t.step_s)
        fields: dict[str, Any] = dict(
            step=t.step,
            step_s=t.step_s,
            compute_s=t.compute_s,
            comm_s=t.comm_s,
            tokens_per_s=tokens / t.step_s if tokens and t.step_s > 0 else None,
            tflops=tflops,
            mfu=util,
            loss=_finite_or_none(self._last_scalars.get("loss")),
            grad_norm=_finite_or_none(self._last_scalars.get("grad_norm")),
            mem_bytes=_memory_bytes(self.device),
            hook_errors=self.errors,
            dropped_events=self.transport.dropped,
        )
        # Validation and serialisation happen on the transport thread, not in the step.
        source = self.source
        self.transport.send(
            lambda: make_event(EventKind.RANK_STEP, source, RankStepPayload(**fields))
        )

    def _check_scalars(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        self._last_scalars = {"loss": loss, "grad_norm": grad_norm}
        for metric, value in (("loss", loss), ("grad_norm", grad_norm)):
            found = self.anomalies.update(step, metric, value)
            if found is None:
                continue
            payload = RankAnomalyPayload(
                step=found.step,
                metric=found.metric,
                anomaly=found.anomaly,
                value=_finite_or_none(found.value),
                baseline=found.baseline,
                threshold=found.threshold,
            )
            self._send(EventKind.RANK_ANOMALY, payload)

    def _finish_inflight(self, now: int | None, timeout_s: float | None = None) -> None:
        """Act on the gathers posted at the previous hooked step; `now`: this step, or None
        when the hooks close (then nothing that needs a new collective is started)."""
        inflight, self._inflight = self._inflight, []
        if inflight:
            self.periodic_work = "exchange"
        for gathered, finish in inflight:
            finish(gathered.rows(timeout_s), now)

    def _exchange(self, step: int) -> None:
        """Post this rank's window and requests; every rank acts on them at its next step."""
        sdc_req = self._requests["sdc"].is_set()
        ckpt_req = self._requests["checkpoint"].is_set()
        if sdc_req:
            self._requests["sdc"].clear()
        if ckpt_req:
            self._requests["checkpoint"].clear()
        sdc_every = self.config.sdc_every or 0
        periodic = bool(sdc_every) and self._steps_done % sdc_every == 0
        row = ExchangeRow(self.steplog.take(), sdc=sdc_req, checkpoint=ckpt_req)
        gathered = self.exchange.gather(row.values())
        posted = time.time()
        self._inflight.append(
            (gathered, lambda rows, now: self._exchanged(step, periodic, rows, now, posted))
        )
        self.periodic_work = self.periodic_work or "exchange"

    def _exchanged(
        self,
        step: int,
        periodic_sdc: bool,
        values: list[list[float]],
        now: int | None,
        posted: float,
    ) -> None:
        cfg = self.config
        rows = [ExchangeRow.parse(v) for v in values]
        timings = [decode_row(r.window) for r in rows]
        for found in self.stragglers.update(timings, self.peer_groups):
            if found.rank == self.exchange.rank:
                payload = RankStragglerPayload(
                    step=step,
                    slowdown=found.slowdown,
                    window=cfg.straggler_window * cfg.straggler_persist,
                    compute_s=found.compute_s,
                    median_compute_s=found.median_compute_s,
                )
                self._send(EventKind.RANK_STRAGGLER, payload)
        # a save begun since this exchange was posted answered the requests it carried
        if any(r.checkpoint for r in rows) and posted > self._save_began:
            self._checkpoint_due = True
        if periodic_sdc or any(r.sdc for r in rows):
            if now is None:
                log.info("sentinel hooks: an SDC check fell due at close; not started")
            else:
                self.periodic_work = "sdc"
                self._inflight.append(self.sdc_check.start(now, self.exchange))

    def _on_hang(self, step: int | None, waited_s: float, timeout_s: float) -> None:
        path = self.dump_flight_recorder("hang")
        self._send(
            EventKind.RANK_HANG,
            RankHangPayload(
                step=step,
                waited_s=waited_s,
                timeout_s=timeout_s,
                dump_path=str(path) if path else None,
            ),
        )

    def _on_command(self, cmd: Command) -> None:
        """Runs on the transport thread: a dump happens now, the rest at the next exchange (a
        checkpoint sooner, where the trainer asks `checkpoint_asked` every step)."""
        if cmd.target.rank is not None and cmd.target.rank != self.rank:
            return
        if cmd.kind == CommandKind.FR_DUMP:
            check = str(cmd.args["check_id"]) if cmd.args.get("check_id") else None
            self.dump_flight_recorder("command", check)
            if cmd.args.get("purpose") == "evidence":  # then with stacks, on a thread: the
                # symbolizing needs the GIL and may never finish; the coordinator's deadline
                # bounds the wait for it, and nothing here waits
                threading.Thread(
                    target=self.dump_flight_recorder,
                    args=(WITH_STACKS, check, True),
                    name="sentinel-fr-stacks",
                    daemon=True,
                ).start()
        elif cmd.kind == CommandKind.SDC_CHECK:
            check_id = cmd.args.get("check_id")
            self.sdc_check.requested_id = str(check_id) if check_id else None  # quoted back
            self._requests["sdc"].set()
        elif cmd.kind == CommandKind.CHECKPOINT_NOW:
            if cmd.ts > self._save_began:  # else a save begun since it was issued answered it
                self._requests["checkpoint"].set()
        elif cmd.kind == CommandKind.STACKS_DUMP:
            self._answer_stacks(cmd)

    def _answer_stacks(self, cmd: Command) -> None:
        """Every thread's stack, taken here on the transport thread: the training thread is
        never paused for it, and one stuck in a collective (GIL released) is seen waiting."""
        request_id = cmd.args.get("request_id")
        if not isinstance(request_id, str):
            log.warning("a stacks.dump without a request id: not answered")
            return
        payload = stacks.capture(request_id, self.watchdog.last_step)
        self._send(EventKind.RANK_STACKS, payload)

    def _dump_before_exit(self, reason: str) -> None:
        self.dump_flight_recorder(reason)
        self.transport.flush(timeout_s=1.0)  # the process is about to end: deliver the news

    def _fr_meta(self) -> dict[str, Any]:
        size = dist.get_world_size() if dist.is_initialized() else 1
        meta = {"world_size": size, "job": self.config.job, "node": self.config.node}
        if self.world is not None:  # one of several worlds: its ranks start at the offset
            meta |= {"world": self.world, "rank_offset": self.rank_offset}
        return meta


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _finite_or_none(value: float | None) -> float | None:
    import math

    return value if value is not None and math.isfinite(value) else None


def _memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
