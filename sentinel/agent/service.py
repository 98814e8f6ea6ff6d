"""The agent daemon: wires collection, health, /metrics, rank socket and delivery together.

Lifecycle is explicit: `start()` brings every part up, `stop()` takes them down in reverse.
Collection runs in one dedicated daemon thread so that a slow NVML call (a GPU falling off the
bus can stall the driver for seconds, an error storm for minutes) never stalls /metrics or the
rank socket. The event loop watches that thread: a call past `nvml_call_deadline_s` makes the
node unhealthy (`nvml_unresponsive`, naming the call) while the agent itself stays healthy and
keeps pinging systemd's watchdog: the driver is broken, not the agent, and a restart would not
help. When the call returns, the next full sweep clears the finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric

from sentinel import __version__
from sentinel.agent.export.exposition import CONTENT_TYPE, TextRenderer
from sentinel.agent.export.metrics import AgentCollector
from sentinel.agent.export.pipeline_metrics import (
    backend_error_families,
    delivery_families,
    rank_socket_families,
)
from sentinel.agent.export.rank_metrics import RankMetrics
from sentinel.agent.fingerprint import FingerprintReporter
from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.health.kmsg import RULES as KMSG_RULES
from sentinel.agent.health.kmsg import KernelLog, watched_devices
from sentinel.agent.health.sources import HOST, KMSG, NVML, RANK_SOCKET, SourceStates
from sentinel.agent.host import HostSource
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.deadline import SweepThread
from sentinel.agent.nvml.expected import expected_gpus
from sentinel.agent.nvml.readings import GpuBackend
from sentinel.agent.ranks.listener import RankSocketServer
from sentinel.agent.ranks.watch import EVERY_S, OutsideWatchdog
from sentinel.agent.systemd import Notifier
from sentinel.agent.uplink.commands import CommandRelay
from sentinel.agent.uplink.delivery import Deliverer
from sentinel.agent.uplink.evidence import EvidenceGatherer
from sentinel.agent.uplink.fr_carry import FrCarrier
from sentinel.agent.uplink.spool import Spool
from sentinel.agent.uplink.validation import NodeValidator
from sentinel.config import AgentConfig, ConfigError, host_port, load_config
from sentinel.exitcodes import InputError
from sentinel.failover import Coordinators
from sentinel.inputs import read_token, writable_dir
from sentinel.protocol import AgentHeartbeatEvent, AgentHeartbeatPayload, Event, Verdict

log = logging.getLogger("sentinel.agent")


def _socket_problem(path: Path) -> str | None:
    """Why the ranks cannot reach the agent's socket at `path`, or None (it is there)."""
    try:
        is_socket = stat.S_ISSOCK(path.lstat().st_mode)
    except OSError as e:
        return f"{path}: {e.strerror or e} (ranks cannot connect)"
    return None if is_socket else f"{path} is no longer a socket (ranks cannot connect)"


def _bound(listen: str) -> socket.socket:
    """A socket bound to the agent's listen address (InputError when it cannot be)."""
    host, port = host_port(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InputError(f"agent.listen {listen}: cannot listen there: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


class AgentMetrics:
    """The agent's own cost and plumbing, as real prometheus_client metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.collection_seconds = Histogram(
            "sentinel_agent_collection_duration_seconds",
            "Time of one collection sweep (GPUs, host, health).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
            registry=registry,
        )
        self.collection_errors = Counter(
            "sentinel_agent_collection_errors", "Sweeps that failed.", registry=registry
        )
        self.events = Counter(
            "sentinel_agent_events", "Events emitted, by kind.", ["kind"], registry=registry
        )
        self.build = Gauge(
            "sentinel_agent_build_info", "Agent version.", ["version"], registry=registry
        )
        self.build.labels(__version__).set(1)


def kernel_log_of(cfg: AgentConfig) -> KernelLog | None:
    """The kernel log to watch: /dev/kmsg on a real node, nothing for simulated GPUs."""
    if cfg.kmsg == "auto" and cfg.sim is not None:
        return None
    if cfg.kmsg == "off":
        blind = ", ".join(KMSG_RULES)
        log.warning("the kernel log is not read (agent.kmsg: off): %s cannot fire", blind)
        return None
    path = Path("/dev/kmsg") if cfg.kmsg == "auto" else Path(cfg.kmsg)
    watched = watched_devices(cfg.mounts_file, [Path("/"), *cfg.checkpoint_dirs])
    return KernelLog(path, watched)


class Agent:
    def __init__(
        self,
        cfg: AgentConfig,
        backend: GpuBackend,
        host: HostSource | None,
        *,
        config_path: Path | None = None,
        notifier: Notifier | None = None,
        registry: CollectorRegistry | None = None,
        sim_faults: Path | None = None,  # a simulated node's faults (its validation reads them)
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.backend = backend
        self.notifier = notifier or Notifier()
        self.registry = registry or CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self.evaluator = HealthEvaluator(cfg.thresholds)
        self.kernel_log = kernel_log_of(cfg)
        watched = [NVML, *([HOST] if host else []), *([KMSG] if self.kernel_log else [])]
        self.sources = SourceStates(watched + ([RANK_SOCKET] if cfg.rank_socket else []))
        self.monitor = NodeMonitor(
            cfg.node_id,
            backend,
            host,
            self.evaluator,
            # Simulated GPUs have no PCI devices: only a configured count applies to them.
            expected_gpus=cfg.expected_gpus
            if cfg.sim is not None
            else expected_gpus(cfg.expected_gpus, cfg.pci_devices_dir),
            kernel_log=self.kernel_log,
            host_interval_s=cfg.host_interval_s,
            sources=self.sources,
        )
        self.ranks = RankMetrics()
        self.spool: Spool | None = None
        self.deliverer: Deliverer | None = None
        self.rank_server = (
            RankSocketServer(cfg.rank_socket, cfg.node_id, self._on_rank_event)
            if cfg.rank_socket
            else None
        )
        self.outside = OutsideWatchdog(cfg.node_id, cfg.outside_hang_margin_s)
        self.relay: CommandRelay | None = None
        self.fingerprints: FingerprintReporter | None = None
        if cfg.coordinator_url:
            if cfg.token_file is None:  # every request would be refused, forever
                raise InputError(
                    "agent.token_file is needed to report to a coordinator: a node token "
                    "(sentinel token create --role node --node NAME)"
                )
            token = read_token(cfg.token_file, "agent.token_file")
            writable_dir(cfg.spool_dir, "agent.spool_dir")
            try:
                self.spool = Spool(cfg.spool_dir, cfg.spool_max_events)
            except sqlite3.Error as e:
                raise InputError(
                    f"agent.spool_dir {cfg.spool_dir}: cannot keep events: {e}"
                ) from None
            # One rotation for delivery and commands: a replica one finds dead, both leave.
            coordinators = Coordinators(cfg.coordinator_url)
            self.deliverer = Deliverer(self.spool, coordinators, token, cfg.batch_max_events)
            fr = FrCarrier(cfg.fr_dir, cfg.node_id) if cfg.fr_dir is not None else None
            gpus = cfg.sim.gpus if cfg.sim is not None else max(1, backend.gpu_count())
            validator = NodeValidator(
                cfg.node_id,
                gpus,
                self.emit,
                sim_faults,
                cfg.validation,
                cfg.job_python,
            )
            # The node's configuration, for the coordinator's drift judgement: with no
            # coordinator there is no one to tell (and no reason to run the job's interpreter
            # every hour).
            self.fingerprints = FingerprintReporter(
                self.monitor.source,
                self._nvml_fingerprint,
                self.emit,
                every_s=cfg.fingerprint_every_s,
                job_python=cfg.job_python,
                job_env_file=cfg.job_env_file,
            )
            evidence = EvidenceGatherer(
                cfg.node_id,
                self.monitor,
                self.kernel_log,
                self.rank_server.registry if self.rank_server is not None else None,
                self.fingerprints,
            )
            self.relay = CommandRelay(
                coordinators,
                token,
                cfg.node_id,
                self.rank_server,
                fr=fr,
                validator=validator,
                evidence=evidence,
            )
        self.registry.register(
            AgentCollector(cfg.node_id, self.monitor, self._extra_metrics, cfg.dcgm_names)
        )
        self.stopped = asyncio.Event()
        self._sweeper = SweepThread()
        self._urgent_sweeps: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.metrics_port: int | None = None
        self._renderer = TextRenderer()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        # Its addresses first: one in use or out of reach stops the agent before it has said
        # anything of the node (a verdict, ready).
        listening = _bound(self.cfg.listen)
        if self.rank_server is not None and self.cfg.rank_socket is not None:
            try:
                writable_dir(self.cfg.rank_socket.parent, "agent.rank_socket's directory")
                await self.rank_server.start()
            except (InputError, OSError) as e:
                listening.close()
                if isinstance(e, InputError):
                    raise
                where = f"agent.rank_socket {self.cfg.rank_socket}"
                raise InputError(f"{where}: {e.strerror or e}") from None
        first = asyncio.ensure_future(self.collect_once())
        # /metrics has data from the first scrape on, unless NVML wedges on the very first sweep
        await asyncio.wait([first], timeout=self.cfg.nvml_call_deadline_s)
        await self._start_http(listening)
        self._tasks = [
            asyncio.create_task(self._collect_loop(first), name="collect"),
            asyncio.create_task(self._watch_loop(), name="watch"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
        ]
        self._watch_urgent(asyncio.get_running_loop())
        if self.deliverer is not None:
            self._tasks.append(asyncio.create_task(self.deliverer.run(), name="deliver"))
        if self.relay is not None:
            self._tasks.append(asyncio.create_task(self.relay.run(), name="commands"))
        if self.fingerprints is not None:  # NVML is up: the first sweep is in (or wedged)
            self._tasks.append(asyncio.create_task(self.fingerprints.run(), name="fingerprint"))
        if self.rank_server is not None:
            self._tasks.append(asyncio.create_task(self._outside_loop(), name="ranks-watch"))
        self.notifier.ready(f"watching {self.backend.gpu_count()} GPUs")
        log.info(
            "agent ready",
            extra={
                "node": self.cfg.node_id,
                "gpus": self.backend.gpu_count(),
                "metrics": f"http://{self.cfg.listen.rpartition(':')[0]}:{self.metrics_port}/metrics",
            },
        )

    async def stop(self) -> None:
        self.notifier.stopping()
        self._sweeper.when_idle(0.0, None)  # no more checks between sweeps
        for task in [*self._tasks, *self._urgent_sweeps]:
            task.cancel()
        for task in [*self._tasks, *self._urgent_sweeps]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.rank_server is not None:
            await self.rank_server.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.spool is not None:
            self.spool.close()  # events not yet delivered stay on disk for the next start
        if self.kernel_log is not None:
            self.kernel_log.close()
        stall = self.backend.stalled(0.0)
        if stall is None:
            self.backend.close()
        else:  # shutting NVML down under a call still inside it is asking for a crash
            log.warning("leaving NVML as it is: %s", stall.describe())
        log.info("agent stopped")

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopped.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        await self.start()
        try:
            await self.stopped.wait()
        finally:
            await self.stop()

    def reload(self) -> None:
        """SIGHUP: re-read the config file; thresholds and intervals apply from the next sweep."""
        self.notifier.reloading()
        try:
            cfg = load_config(self.config_path).agent if self.config_path else self.cfg
        except ConfigError as e:
            log.error("reload refused, keeping the running config", extra={"error": str(e)})
        else:
            # Keep identity and endpoints: changing them needs a restart, not a reload.
            self.cfg = self.cfg.model_copy(
                update={
                    "thresholds": cfg.thresholds,
                    "interval_s": cfg.interval_s,
                    "heartbeat_s": cfg.heartbeat_s,
                    "host_interval_s": cfg.host_interval_s,
                }
            )
            self.evaluator.thresholds = cfg.thresholds
            self.monitor.host_interval_s = cfg.host_interval_s
            log.info("config reloaded", extra={"interval_s": cfg.interval_s})
        if self.fingerprints is not None:  # an edited job_env_file is reported at once
            self.fingerprints.wake()
        self.notifier.ready()

    # --- work -----------------------------------------------------------------------------

    async def collect_once(self) -> None:
        try:
            snapshot, events = await self._sweeper.submit(self.monitor.collect)
        except Exception as e:
            self.metrics.collection_errors.inc()
            if NVML not in self.sources.down():  # the traceback once, not every sweep
                log.exception("collection sweep failed")
            self.sources.mark(NVML, f"{type(e).__name__}: {e}")
            return
        self.sources.mark(NVML, None)
        self.metrics.collection_seconds.observe(snapshot.sweep_s)
        self.emit(events)

    async def _nvml_fingerprint(self) -> dict[str, str]:
        # On the sweep thread like every NVML call: between sweeps, under the call deadline.
        return await self._sweeper.submit(self.backend.fingerprint)

    def emit(self, events: list[Event]) -> None:
        for e in events:
            self.metrics.events.labels(e.kind.value).inc()
        if self.spool is None or not events:
            return
        dropped = self.spool.append(events)
        if dropped:
            log.warning("spool full, dropped the oldest events", extra={"dropped": dropped})
        assert self.deliverer is not None
        self.deliverer.wake()

    def _on_rank_event(self, event: Event) -> None:
        self.ranks.observe(event)
        self.emit([event])

    async def _collect_loop(self, first: asyncio.Future[None]) -> None:
        await first  # a first sweep wedged in NVML: no second one queued behind it
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            # A fixed cadence, not interval-after-sweep: sweeps do not drift the schedule, and a
            # late sweep is not followed by a burst of catch-up sweeps.
            next_at = max(next_at + self.cfg.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())
            await self.collect_once()

    async def _outside_loop(self) -> None:
        """The ranks' beacons, every `watch.EVERY_S` (agent/ranks/watch.py): on the event loop,
        not the sweep thread, so a wedged NVML does not stop it; a read of a few small files."""
        assert self.rank_server is not None
        while True:
            await asyncio.sleep(EVERY_S)
            try:
                self.emit(self.outside.check(self.rank_server.registry.watched()))
            except Exception:
                log.exception("the outside watchdog's check failed")

    def _watch_urgent(self, loop: asyncio.AbstractEventLoop) -> None:
        """Between sweeps, every `urgent_poll_s` of the sweep thread's idle time, a cheap look
        at what cannot wait for the next sweep (an XID, a double-bit ECC error, a GPU past its
        critical temperature); when one shows, a full sweep runs at once, so a hardware fault
        is judged within a fraction of the interval instead of up to a whole one. It runs on
        the sweep thread like every NVML call: a wedged driver stops it, never the event loop."""
        critical = self.cfg.thresholds.gpu_temp_unhealthy_c

        def check() -> None:
            try:
                found = self.backend.urgent(critical)
            except Exception:
                log.exception("urgent check failed")
                return
            if found is not None:
                loop.call_soon_threadsafe(self._sweep_now, found)

        self._sweeper.when_idle(self.cfg.urgent_poll_s, check)

    def _sweep_now(self, found: str) -> None:
        log.info("urgent signal: sweeping now", extra={"signal": found})
        task = asyncio.create_task(self.collect_once(), name="urgent-sweep")
        self._urgent_sweeps.add(task)
        task.add_done_callback(self._urgent_sweeps.discard)

    async def _watch_loop(self) -> None:
        """Deadline on NVML calls, the kernel log, and the watchdog ping: none of it waits on
        a sweep, so a wedged driver changes the verdict and does not get the agent restarted."""
        # A quarter of the deadline (the verdict moves at most that much late), at most a
        # second, and a quarter of systemd's watchdog interval: the ping is due at half of it.
        dog = self.notifier.watchdog_interval_s
        tick = min(1.0, self.cfg.nvml_call_deadline_s / 4, (dog or 4.0) / 4)
        while True:
            stall = self.backend.stalled(self.cfg.nvml_call_deadline_s)
            if stall is not None:
                self.emit(self.monitor.check_stall(stall))
            self.emit(self.monitor.poll_kernel())
            if self.cfg.rank_socket is not None:
                self.sources.mark(RANK_SOCKET, _socket_problem(self.cfg.rank_socket))
            self.notifier.watchdog()
            await asyncio.sleep(tick)

    async def _heartbeat_loop(self) -> None:
        while True:
            snap = self.monitor.snapshot
            if snap is not None:
                payload = AgentHeartbeatPayload(
                    gpus=len(snap.readings),
                    verdict=snap.health.verdict,
                    agent_version=__version__,
                    spooled_events=len(self.spool) if self.spool else 0,
                )
                self.emit([AgentHeartbeatEvent(source=self.monitor.source, payload=payload)])
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def _start_http(self, listening: socket.socket) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, listening).start()
        self.metrics_port = listening.getsockname()[1]

    async def _metrics(self, _: web.Request) -> web.Response:
        body = self._renderer.render(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, _: web.Request) -> web.Response:
        """Liveness of the agent itself: fresh sweeps, or a stall it knows about and reports.
        A wedged driver is the node's problem (see /readyz), not a reason to restart the agent."""
        snap = self.monitor.snapshot
        swept = self.monitor.last_sweep_ts
        age = time.time() - swept if swept else None
        fresh = age is not None and age < 5 * self.cfg.interval_s + 5
        stall = self.backend.stalled(self.cfg.nvml_call_deadline_s)
        ok = fresh or stall is not None
        body = {
            "ok": ok,
            "last_sweep_age_s": age,
            "verdict": snap.health.verdict.value if snap else None,
            "nvml_unresponsive": stall.describe() if stall else None,
        }
        return web.json_response(body, status=200 if ok else 503)

    async def _readyz(self, _: web.Request) -> web.Response:
        """Whether this node can take work: 503 with the reasons while it is unhealthy."""
        snap = self.monitor.snapshot
        if snap is None:
            return web.json_response({"ready": False, "reasons": ["no sweep yet"]}, status=503)
        health = snap.health
        down = self.sources.down()
        # A source it cannot read leaves the agent unable to vouch for the node: its rules
        # there cannot fire, whatever the verdict says.
        ready = health.verdict is not Verdict.UNHEALTHY and not down
        body = {
            "ready": ready,
            "verdict": health.verdict.value,
            "expected_gpus": self.monitor.expected_gpus,
            "visible_gpus": len(snap.readings),
            "sources_down": down,
            "reasons": [
                f"{f.rule}: {f.detail}" for f in health.findings if f.verdict is not Verdict.HEALTHY
            ]
            + [f"source {source} down: {why}" for source, why in down.items()],
        }
        return web.json_response(body, status=200 if ready else 503)

    def _extra_metrics(self) -> Iterator[Metric]:
        yield self.sources.family(self.cfg.node_id)
        yield from self.ranks.collect(self.cfg.node_id)
        yield from backend_error_families(self.backend)
        if self.spool is not None and self.deliverer is not None:
            yield from delivery_families(self.spool, self.deliverer)
        if self.rank_server is not None:
            yield from rank_socket_families(self.rank_server)
            snap = self.monitor.snapshot
            readings = snap.readings if snap is not None else ()
            yield from self.rank_server.registry.collect(self.cfg.node_id, readings)
