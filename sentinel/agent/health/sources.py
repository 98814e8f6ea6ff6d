"""Whether the agent can read each of its sources: NVML, the kernel log, the host's statistics
and the ranks' socket.

A source the agent cannot read blinds the rules that read it without moving any verdict (a
kernel log it may not open: `fs_read_only`, `machine_check`, `pcie_aer_fatal` and `hung_task`
can never fire), so a node would look healthy while nobody watches it. Each source's state is
therefore told on its own: `sentinel_agent_source_up{source}` (1 or 0), the reason on `/readyz`
(503 while a source is down) and one log line when a source goes down and one when it is back,
not one a poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("sentinel.agent.sources")

NVML, KMSG, HOST, RANK_SOCKET = "nvml", "kmsg", "host", "rank_socket"


class SourceStates:
    """The sources this agent reads and the ones it cannot, with why. Marked from the sweep
    thread and the event loop."""

    def __init__(self, watched: Iterable[str]) -> None:
        self.watched = tuple(watched)
        self._down: dict[str, str] = {}
        self._lock = threading.Lock()

    def mark(self, source: str, problem: str | None) -> None:
        """`source` read fine (`problem` None) or not, and why; logs a change only."""
        with self._lock:
            before = self._down.get(source)
            if problem is None:
                self._down.pop(source, None)
            else:
                self._down[source] = problem
        if before is None and problem is not None:
            log.warning("source %s down: %s", source, problem, extra={"source": source})
        elif before is not None and problem is None:
            log.info("source %s back", source, extra={"source": source, "was": before})

    def down(self) -> dict[str, str]:
        """Source -> why it cannot be read, for every source down now."""
        with self._lock:
            return dict(self._down)

    def family(self, node: str) -> GaugeMetricFamily:
        down = self.down()
        fam = GaugeMetricFamily(
            "sentinel_agent_source_up",
            "Whether the agent can read this source (0: the rules that read it are blind).",
            labels=["node", "source"],
        )
        for source in self.watched:
            fam.add_metric([node, source], 0.0 if source in down else 1.0)
        return fam
