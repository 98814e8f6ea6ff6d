"""`sentinel coordinator`: the control plane service."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from sentinel.exitcodes import ExitCode, InputError

log = logging.getLogger("sentinel.coordinator")
GC_GEN0_THRESHOLD = 20_000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coordinator", help="run the coordinator (API, incidents, playbooks)")
    p.add_argument("--config", type=Path, help="config file (YAML or TOML)")
    p.add_argument("--listen", help="HOST:PORT (default from config: 127.0.0.1:8470)")
    p.add_argument(
        "--ingest-listen",
        metavar="HOST:PORT",
        help="also serve POST /v1/events alone on this port, past aiohttp (for a large fleet)",
    )
    p.add_argument("--state-dir", type=Path, help="where the SQLite store and tokens live")
    p.add_argument(
        "--store",
        metavar="URL",
        help="a shared PostgreSQL (postgresql://USER@HOST:PORT/DB, no password: PGPASSFILE, "
        "PGPASSWORD or store_password_file); default: SQLite in the state directory",
    )
    p.add_argument("--playbooks", type=Path, help="playbooks directory (default: shipped ones)")
    p.set_defaults(handler=run)


def coordinator_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from sentinel.config import load_config

    cfg = load_config(getattr(args, "config", None)).coordinator
    updates = {}
    if getattr(args, "listen", None):
        updates["listen"] = args.listen
    if getattr(args, "ingest_listen", None):
        updates["ingest_listen"] = args.ingest_listen
    if getattr(args, "state_dir", None):
        updates["state_dir"] = args.state_dir
    if getattr(args, "store", None):
        updates["store"] = args.store
    if getattr(args, "playbooks", None):
        updates["playbooks_dir"] = args.playbooks
    if "store" in updates:  # validated like the config file's key (no password in a URL)
        from pydantic import ValidationError

        from sentinel.config import ConfigError, CoordinatorConfig, config_errors

        try:
            CoordinatorConfig(store=updates["store"])
        except ValidationError as e:
            raise ConfigError("--store", config_errors(e)) from None
    return cfg.model_copy(update=updates)


def run(args: argparse.Namespace) -> int:
    import gc

    import uvloop

    from sentinel.config import host_port
    from sentinel.coordinator.core.playbooks import PlaybookError
    from sentinel.coordinator.core.store import StoreUnavailable
    from sentinel.coordinator.http.app import build_app
    from sentinel.coordinator.http.serve import serve
    from sentinel.coordinator.runtime import Service
    from sentinel.inputs import writable_dir

    cfg = coordinator_config(args)
    writable_dir(cfg.state_dir, "coordinator.state_dir")
    host, port = host_port(cfg.listen)
    ingest = host_port(cfg.ingest_listen) if cfg.ingest_listen else None
    try:
        service = Service(cfg)
    except PlaybookError as e:
        raise InputError("playbooks are invalid:\n  " + "\n  ".join(e.errors)) from None
    except StoreUnavailable as e:  # systemd (or Kubernetes) starts it again; say why
        log.error("cannot start: %s", e)
        return ExitCode.PROBLEM_FOUND
    admin = cfg.state_dir / "admin.token"
    log.info(
        "coordinator starting on %s:%d, state in %s",
        host,
        port,
        cfg.state_dir,
        extra={"playbooks": len(service.playbooks), "backend": cfg.eviction_backend},
    )
    if not admin.exists():
        log.info("no admin token file yet; one is created at %s if no token exists", admin)
    # What is loaded by now (modules, schemas, playbooks) lives as long as the process: kept
    # out of the collector's full passes, which every acknowledgement would wait behind.
    gc.freeze()
    # Ingest allocates in bursts (a commit group's decoded batches) freed by reference count:
    # at 2,048 nodes the default threshold (700) ran the collector ~90 times a second, which
    # found no cycle, and fed full passes over every connection's objects (~40 ms each on a
    # slow core, a stall of every acknowledgement). At 20,000 the bursts pass under it.
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    # uvloop (libuv's event loop) spends less CPU per request than asyncio's own; at fleet
    # scale the requests themselves are much of what the coordinator does, which is also why
    # an ingest port serves event batches past aiohttp (sentinel.coordinator.http.listener).
    uvloop.run(serve(build_app(cfg, service), host, port, ingest))
    return ExitCode.OK
