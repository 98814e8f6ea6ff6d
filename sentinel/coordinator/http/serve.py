"""Running the coordinator's HTTP side until SIGINT or SIGTERM: the API (aiohttp) and, when
configured, the ingest listener (`listener.py`), each bound before anything is said of it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable

from aiohttp import web

from sentinel.coordinator.http.listener import IngestListener
from sentinel.exitcodes import InputError

log = logging.getLogger("sentinel.coordinator")


async def _listening(start: Awaitable[None], host: str, port: int) -> None:
    """Start a listener; InputError when its address cannot be had (another daemon's port, an
    address this host does not have)."""
    try:
        await start
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


async def serve(
    app: web.Application, host: str, port: int, ingest: tuple[str, int] | None = None
) -> None:
    """Run `app` on host:port, and the ingest listener on `ingest` when given, until SIGINT
    or SIGTERM."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    listener = None
    try:
        await _listening(web.TCPSite(runner, host, port, backlog=1024).start(), host, port)
        if ingest is not None:
            listener = IngestListener(app, *ingest)
            await _listening(listener.start(), *ingest)
        log.info("listening on %s:%d", host, port, extra={"ingest": ingest})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if listener is not None:
            await listener.stop()  # batches being answered finish before the store closes
        with contextlib.suppress(asyncio.CancelledError):
            await runner.cleanup()
