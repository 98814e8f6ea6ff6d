"""systemd's notify protocol (sd_notify): READY, WATCHDOG, RELOADING, STOPPING, STATUS.

A datagram to the socket named by NOTIFY_SOCKET ('@' means the abstract namespace). Without
NOTIFY_SOCKET (not started by systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID, when set, names the process the watchdog is meant for.
        ours = not pid or pid == str(os.getpid())
        self.watchdog_interval_s = int(usec) / 1e6 if usec.isdigit() and ours else None
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self._addr)

    def notify(self, *fields: str) -> None:
        if not self._addr:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto("\n".join(fields).encode(), self._addr)

    def ready(self, status: str = "") -> None:
        self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1 for Type=notify-reload.
        self.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")

    def watchdog(self, now: float | None = None) -> bool:
        """Ping at half the watchdog interval. Called by the collection loop after each sweep, so
        a wedged collection (an NVML call that never returns) stops the pings and systemd
        restarts the agent."""
        if self.watchdog_interval_s is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_ping < self.watchdog_interval_s / 2:
            return False
        self._last_ping = now
        self.notify("WATCHDOG=1")
        return True
