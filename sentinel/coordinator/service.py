"""The coordinator's moving parts outside HTTP: group commit, the engine loop, command wake-ups.

All store access runs in one thread (`Service.db`), so SQLite sees one writer and the event loop
keeps parsing requests while a commit waits for the disk. Batches that arrive together share
one commit (group commit); each is its own savepoint, so one bad batch fails alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.actions import make_backend
from sentinel.coordinator.auth import TokenStore
from sentinel.coordinator.engine import Engine
from sentinel.coordinator.ingest import Ingestor, IngestResult
from sentinel.coordinator.playbooks import Playbook, default_playbooks_dir, load_playbooks
from sentinel.coordinator.store import Store
from sentinel.protocol import EventBatch

log = logging.getLogger("sentinel.coordinator")
T = TypeVar("T")
STORE_FILE = "coordinator.db"


class Service:
    def __init__(self, cfg: CoordinatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.playbooks: list[Playbook] = load_playbooks(
            cfg.playbooks_dir or default_playbooks_dir()
        )
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(cfg.state_dir / STORE_FILE)
        self.tokens = TokenStore(self.store)
        self.ingestor = Ingestor(self.store, self.playbooks, cfg)
        self.engine = Engine(self.store, self.playbooks, cfg, make_backend(cfg), clock)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentinel-store")
        self._pending: list[tuple[EventBatch, asyncio.Future[IngestResult]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self.commands_changed = asyncio.Condition()
        self._engine_task: asyncio.Task[None] | None = None
        self.on_ingest: Callable[[IngestResult], None] = lambda _r: None

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self) -> Path | None:
        admin = await self.db(self.tokens.ensure_admin, self.cfg.state_dir, self.clock())
        await self.db(self.store.start_checkpointer)
        self._engine_task = asyncio.create_task(self._engine_loop(), name="sentinel-engine")
        return admin

    async def stop(self) -> None:
        if self._engine_task is not None:
            self._engine_task.cancel()
            await asyncio.gather(self._engine_task, return_exceptions=True)
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self.db(self.store.close)
        self._pool.shutdown(wait=True)

    # --- ingest with group commit ------------------------------------------------------------

    async def ingest(self, batch: EventBatch) -> IngestResult:
        """Returns once the batch is committed (durable); that is when the API acknowledges."""
        fut: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            try:
                outcomes = await self.db(self._commit_group, [b for b, _ in group])
            except Exception as e:  # the commit itself failed: nothing of the group is stored
                outcomes = [e] * len(group)
            opened = False
            stored = IngestResult()  # counted once per group, not per batch
            for (_, fut), outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    fut.set_exception(outcome)
                else:
                    opened |= bool(outcome.opened) or outcome.linked > 0
                    stored.accepted += outcome.accepted
                    stored.duplicates += outcome.duplicates
                    fut.set_result(outcome)
            self.on_ingest(stored)
            if opened:
                self._kick.set()

    def _commit_group(self, batches: list[EventBatch]) -> list[IngestResult | Exception]:
        with self.store.tx():
            return self.ingestor.ingest_group(batches, self.clock())

    # --- engine ------------------------------------------------------------------------------

    def kick(self) -> None:
        self._kick.set()

    async def _engine_loop(self) -> None:
        while True:
            try:
                finished = await self.db(self._tick)
            except Exception:
                log.exception("engine tick failed")
                finished = 0
            if finished or await self.db(self._has_undelivered):
                await self.notify_commands()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.cfg.engine_tick_s)
            self._kick.clear()

    def _tick(self) -> int:
        self.tokens.drop_cache_if_changed()
        return self.engine.tick()

    def _has_undelivered(self) -> bool:
        return (
            self.store.one("SELECT 1 AS x FROM commands WHERE delivered_at IS NULL LIMIT 1")
            is not None
        )

    async def notify_commands(self) -> None:
        async with self.commands_changed:
            self.commands_changed.notify_all()
