"""The coordinator's moving parts outside HTTP: group commit, the engine loop, command wake-ups.

All store access runs in one thread (`Service.db`), so SQLite sees one writer and the event loop
keeps parsing requests while a commit waits for the disk. Batches that arrive together share
one commit (group commit); each is its own savepoint, so one bad batch fails alone. A batch
waits up to `commit_window_s` for others to join its group: a commit costs about as much CPU as
ten plain batches' rows, and a paced fleet's batches arrive one at a time. They are decoded
together too, one after another just before their commit: decoded each in its own
request, between the rest of that request's work, a batch took 2.5x the CPU (190 against
75 µs), its validators evicted from the core's caches every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core import scheduler
from sentinel.coordinator.core.auth import TokenStore
from sentinel.coordinator.core.effects import Outcome, SchedulerNode
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor, IngestResult
from sentinel.coordinator.core.playbooks import (
    Playbook,
    PlaybookError,
    default_playbooks_dir,
    load_playbooks,
)
from sentinel.coordinator.core.retention import EventPruner, windows_past_retention
from sentinel.coordinator.core.rows import EffectRow
from sentinel.coordinator.core.store import Fenced, StoreUnavailable
from sentinel.coordinator.store import open_store
from sentinel.precision.gate import gate
from sentinel.protocol import Event, EventBatch, decode_batch

log = logging.getLogger("sentinel.coordinator")
T = TypeVar("T")

# Why the sender may not report one of these events, or None: the API's authorization rule.
ReportCheck = Callable[[list[Event]], str | None]


class Refused(Exception):
    """The sender may not report an event of the batch (the API answers 403)."""


class _Pending(NamedTuple):
    body: bytes
    may_report: ReportCheck
    fut: asyncio.Future[IngestResult]


class Service:
    def __init__(self, cfg: CoordinatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.playbooks: list[Playbook] = load_playbooks(
            cfg.playbooks_dir or default_playbooks_dir(), cfg.validation.baseline
        )
        gate(self.playbooks, cfg.precision_file)
        too_long = windows_past_retention(self.playbooks, cfg.event_retention_s)
        if too_long:
            raise PlaybookError(too_long)
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.store, self.leadership = open_store(cfg)
        self.tokens = TokenStore(self.store)
        self.ingestor = Ingestor(self.store, self.playbooks, cfg)
        self.engine = Engine(
            self.store, self.playbooks, cfg, make_backend(cfg), clock, inline_effects=False
        )
        self.pruner = EventPruner(self.store, cfg.event_retention_s)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentinel-store")
        self._effects_in_flight: dict[str, asyncio.Task[None]] = {}
        self._pending: list[_Pending] = []
        self._group_opened = 0.0  # loop time the oldest pending batch arrived
        self._flushing: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self.commands_changed = asyncio.Condition()
        self._engine_task: asyncio.Task[None] | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        # The scheduler bridge's last poll: None before the first (or with no scheduler to
        # read), then whether it was read; and how many polls failed.
        self.scheduler_up: bool | None = None
        self.scheduler_failures = 0
        # (events accepted, duplicates) of each group commit: the API's counters
        self.on_ingest: Callable[[int, int], None] = lambda _a, _d: None

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self) -> Path | None:
        admin = await self.db(self.tokens.ensure_admin, self.cfg.state_dir, self.clock())
        await self.db(self.tokens.reload_if_revoked)
        await self.db(self.store.start_background)
        await asyncio.get_running_loop().run_in_executor(None, self.leadership.start)
        self._engine_task = asyncio.create_task(self._engine_loop(), name="sentinel-engine")
        if self.cfg.scheduler_poll_s > 0 and self.engine.effects.backend.polls_scheduler:
            self._scheduler_task = asyncio.create_task(
                self._scheduler_loop(), name="sentinel-scheduler"
            )
        return admin

    async def stop(self) -> None:
        for task in (self._engine_task, self._scheduler_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        # An effect cut short here stays intended; the next start reconciles it.
        for task in list(self._effects_in_flight.values()):
            task.cancel()
        await asyncio.gather(*self._effects_in_flight.values(), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.leadership.stop)
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self.db(self.store.close)
        self._pool.shutdown(wait=True)

    # --- ingest with group commit ------------------------------------------------------------

    async def ingest(self, body: bytes, may_report: ReportCheck) -> IngestResult:
        """Decode, check and store a batch; returns once it is committed (durable), which is
        when the API acknowledges. Raises `ProtocolError` for a malformed batch and `Refused`
        for one with an event `may_report` refuses; neither stores anything."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[IngestResult] = loop.create_future()
        if not self._pending:
            self._group_opened = loop.time()
        self._pending.append(_Pending(body, may_report, fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            # The window runs from the oldest batch's arrival: one that waited through the last
            # commit goes into the next at once.
            wait = self._group_opened + self.cfg.commit_window_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            group, self._pending = self._pending, []
            batches, futs = _decode_group(group)
            if not batches:
                continue
            try:
                outcomes = await self.db(self._commit_group, batches)
            except Exception as e:  # the commit itself failed: nothing of the group is stored
                outcomes = [e] * len(batches)
            opened = False
            accepted = duplicates = 0  # counted once per group, not per batch
            for fut, outcome in zip(futs, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    _settle(fut, error=outcome)
                else:
                    opened |= bool(outcome.opened) or outcome.linked > 0
                    accepted += outcome.accepted
                    duplicates += outcome.duplicates
                    _settle(fut, result=outcome)
            self.on_ingest(accepted, duplicates)
            if opened:
                self._kick.set()

    def _commit_group(self, batches: list[EventBatch]) -> list[IngestResult | Exception]:
        with self.store.tx():
            return self.ingestor.ingest_group(batches, self.clock())

    # --- engine ------------------------------------------------------------------------------

    def kick(self) -> None:
        self._kick.set()

    async def _engine_loop(self) -> None:
        """The leader advances playbook runs and starts effects; every replica drops tokens
        revoked elsewhere and wakes the long-polls of commands it holds for delivery (the leader
        may have queued them)."""
        away = False  # the store is unreachable: said once, not every tick
        while True:
            finished = 0
            try:
                if self.leadership.leads():
                    try:
                        finished = await self.db(self._as_leader, self._tick)
                    except Fenced:
                        log.warning("engine writes refused: another replica leads now")
                    await self._start_effects()
                undelivered = await self.db(self._between_ticks)
                if finished or undelivered:
                    await self.notify_commands()
                if away:
                    log.warning("the store is back; the engine goes on")
                away = False
            except StoreUnavailable as e:
                if not away:
                    log.error("the store is unavailable (%s); the engine waits for it", e)
                away = True
            except Exception:
                log.exception("engine tick failed")
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that lands as
            # the kick is set (stop does both), and the engine then never ends.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.engine_tick_s):
                    await self._kick.wait()
            self._kick.clear()

    async def _start_effects(self) -> None:
        """Start every recorded effect not already under way (each in a task of its own)."""
        try:
            pending = await self.db(self._as_leader, self.engine.effects.pending)
        except (StoreUnavailable, Fenced):
            raise  # the engine loop says so once
        except Exception:
            log.exception("reading pending effects failed")
            return
        for effect in pending:
            if effect.key not in self._effects_in_flight:
                task = asyncio.create_task(self._perform(effect), name=f"effect {effect.key}")
                self._effects_in_flight[effect.key] = task

    async def _perform(self, effect: EffectRow) -> None:
        """Count the attempt, make the call off the store thread with a timeout, settle it."""
        effects, timeout = self.engine.effects, self.cfg.effect_timeout_s
        try:
            reconcile = await self.db(self._as_leader, effects.begin, effect)
            if not self.leadership.leads():  # paused past our lease: the successor acts
                return
            try:
                outcome = await asyncio.wait_for(
                    _off_thread(effects.perform, effect, reconcile), timeout
                )
            except TimeoutError:
                outcome = Outcome(False, {"error": f"no answer in {timeout:g} s"})
            await self.db(self._as_leader, effects.settle, effect, outcome, self.clock())
        except Exception:
            log.exception("effect %s could not be settled; it is tried again", effect.key)
        finally:
            self._effects_in_flight.pop(effect.key, None)
        self.kick()

    async def _scheduler_loop(self) -> None:
        """The scheduler bridge (`core/scheduler.py`), on the leader: read every node's state
        where the scheduler looks, off the store's thread with the effects' timeout; ingest the
        disagreements it finds. A read that fails changes nothing (the last state stands) and
        is counted, said once when it starts failing and once when it is read again."""
        backend = self.engine.effects.backend
        while True:
            await asyncio.sleep(self.cfg.scheduler_poll_s)
            if not self.leadership.leads():
                continue
            try:
                seen = await asyncio.wait_for(
                    _off_thread(backend.scheduler_nodes), self.cfg.effect_timeout_s
                )
            except Exception as e:  # EvictionError, a timeout: never an empty answer
                self.scheduler_failures += 1
                if self.scheduler_up is not False:
                    why = str(e) or type(e).__name__
                    log.error("cannot read the scheduler (%s): its last state stands", why)
                self.scheduler_up = False
                continue
            if self.scheduler_up is False:
                log.warning("the scheduler is read again")
            self.scheduler_up = True
            try:
                opened = await self.db(self._as_leader, self._observe_scheduler, seen)
            except (StoreUnavailable, Fenced):
                continue  # the engine's loop says so
            except Exception:
                log.exception("the scheduler's node states could not be compared")
                continue
            if opened:
                self.kick()

    def _observe_scheduler(self, seen: dict[str, SchedulerNode]) -> bool:
        """Ingest what the scheduler says that Sentinel does not know; whether that opened or
        joined an incident."""
        now = self.clock()
        nodes, settle = self.store.nodes(scheduler.MAX_NODES), self.cfg.scheduler_poll_s
        events = scheduler.disagreements(seen, nodes, now, settle)
        if not events:
            return False
        result = self.ingestor.ingest(EventBatch(events=events), now)
        return bool(result.opened) or result.linked > 0

    def _as_leader(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` with every write fenced by our epoch: refused by the store (and we
        follow) once another replica holds a newer one."""
        epoch = self.leadership.epoch
        if epoch is None:
            raise Fenced("not the leader")
        try:
            with self.store.fenced(epoch):
                return fn(*args)
        except Fenced:
            self.leadership.deposed()
            raise

    def _tick(self) -> int:
        try:
            self.pruner.maybe_prune(self.clock())
        except Exception:  # retention is housekeeping: incidents go on being handled
            log.exception("pruning old events failed")
        return self.engine.tick()

    def _between_ticks(self) -> bool:
        """Every replica's own upkeep: tokens revoked elsewhere stop here too; whether commands
        wait for delivery."""
        self.tokens.reload_if_revoked()
        return self.store.has_undelivered_commands()

    async def notify_commands(self) -> None:
        async with self.commands_changed:
            self.commands_changed.notify_all()


def _off_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` on a daemon thread of its own: never the store's thread, and a call still
    hanging at shutdown (a stuck `scontrol`) does not hold the process up. Its effect stays
    recorded as intended, and the next start reconciles it."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)  # type: ignore[arg-type]

    def work() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = fn(*args)
        except Exception as e:  # the caller's to handle, as if the call ran in its own task
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="sentinel-effect", daemon=True).start()
    return fut


def _decode_group(
    group: list[_Pending],
) -> tuple[list[EventBatch], list[asyncio.Future[IngestResult]]]:
    """The group's batches that decode and pass their sender's check, with their futures; the
    others' futures get the reason."""
    batches, futs = [], []
    for p in group:
        try:
            batch = decode_batch(p.body)
        except Exception as e:  # a decoder bug must fail its batch, never leave it waiting
            _settle(p.fut, error=e)
            continue
        refusal = p.may_report(batch.events)
        if refusal:
            _settle(p.fut, error=Refused(refusal))
            continue
        batches.append(batch)
        futs.append(p.fut)
    return batches, futs


def _settle(
    fut: asyncio.Future[IngestResult],
    result: IngestResult | None = None,
    error: BaseException | None = None,
) -> None:
    if fut.done():  # its request was cancelled (the client went away); what is stored stays
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)  # type: ignore[arg-type]
