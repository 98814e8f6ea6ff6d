"""The supervisor's part in a hang's diagnosis: after an `fr.dump`, wait for every rank's
flight-recorder dump (in `supervisor.fr_dir`, or carried by the nodes' agents to the
coordinator), run the analyzer (`supervisor.fr_analyze_command`, by default `sentinel fr
analyze`) and report its verdict and culprit ranks as `fr.analysis`, which `collective_hang`
acts on."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sentinel.config import SupervisorConfig
from sentinel.failover import Reply, Unreachable
from sentinel.fr.dumps import SIDECAR_RE, dumped_ranks
from sentinel.protocol import WITH_STACKS_SUFFIX, FrAnalysisEvent, FrAnalysisPayload, Source

log = logging.getLogger("sentinel.supervisor")

Call = Callable[..., Awaitable[Reply]]
Post = Callable[[list[Any]], Awaitable[None]]


def written_since(directory: Path, since: float) -> list[str]:
    """Names of the files written in `directory` at or after `since` (a rank's temporary file
    may vanish while it is looked at: it is renamed into place)."""
    names = []
    for entry in os.scandir(directory) if directory.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            if entry.stat().st_mtime >= since:
                names.append(entry.name)
    return names


class FlightAnalysis:
    def __init__(self, cfg: SupervisorConfig, call: Call, post: Post) -> None:
        self.cfg, self.call, self.post = cfg, call, post

    async def analyze(self, check_id: str | None, since: float, world: int) -> None:
        """Wait for the `world` ranks' dumps (written since `since`), run the analyzer, report
        what it found."""
        if self.cfg.fr_from_coordinator:
            if check_id is None:
                log.error("an fr.dump without a check id: its node-local dumps cannot be found")
                return
            with tempfile.TemporaryDirectory(prefix="sentinel-fr-") as tmp:
                await self._collect(check_id, Path(tmp), world)
                await self._run_analyzer(Path(tmp), check_id)
            return
        fr_dir = self.cfg.fr_dir
        assert fr_dir is not None
        deadline = since + self.cfg.fr_wait_s
        while time.time() < deadline:
            if len(dumped_ranks(written_since(fr_dir, since))) >= world:
                break  # a rank's sidecar lands after its dump: every dump is whole
            await asyncio.sleep(0.1)
        await self._run_analyzer(fr_dir, check_id)

    async def keep(self, check_id: str, since: float, world: int) -> None:
        """An `fr.dump` for an incident's evidence (`purpose: evidence`) with the ranks dumping
        into `fr_dir`: carry each rank's dump and sidecar to the coordinator under the check
        as soon as they are written (a later dump, such as the one a rank writes as it is torn
        down, replaces them here), then its dump with stack traces when that comes, for the
        incident's bundle. No analysis: nothing waits on one."""
        fr_dir = self.cfg.fr_dir
        assert fr_dir is not None
        nodes: dict[str, str] = {}  # dump file -> its rank's node, from the sidecar
        sidecars: set[str] = set()
        stacks: set[str] = set()
        deadline = time.time() + self.cfg.fr_wait_s
        while (len(sidecars) < world or len(stacks) < len(nodes)) and time.time() < deadline:
            for name in sorted(written_since(fr_dir, since)):
                if SIDECAR_RE.match(name) and name not in sidecars:
                    sidecars.add(name)
                    found = await self._carry_dump(fr_dir / name, check_id)
                    if found is not None:
                        nodes[found[0]] = found[1]
                base = name.removesuffix(WITH_STACKS_SUFFIX)
                if base != name and base in nodes and name not in stacks:
                    stacks.add(name)
                    await self._put(check_id, nodes[base], name, fr_dir / name)
            await asyncio.sleep(0.1)
        log.info(
            "kept %d rank(s)' dumps, %d with stacks, for %s", len(nodes), len(stacks), check_id
        )

    async def _carry_dump(self, sidecar: Path, check_id: str) -> tuple[str, str] | None:
        """Carry a rank's dump and sidecar; (its dump's file name, its node)."""
        try:
            meta = json.loads(sidecar.read_bytes())
            node, dump = str(meta["node"]), sidecar.with_name(Path(str(meta["dump_file"])).name)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cannot keep the dump of %s for %s: %s", sidecar.name, check_id, e)
            return None
        await self._put(check_id, node, dump.name, dump)
        await self._put(check_id, node, sidecar.name, sidecar)
        return dump.name, node

    async def _put(self, check_id: str, node: str, name: str, path: Path) -> None:
        try:
            data = path.read_bytes()
            r = await self.call("PUT", f"/v1/fr/{check_id}/{node}/{name}", data=data)
        except (OSError, Unreachable) as e:
            log.warning("cannot keep %s for %s: %s", name, check_id, e)
            return
        if r.status != 200:
            log.warning("coordinator refused %s for %s: %s", name, check_id, r.status)

    async def _collect(self, check_id: str, into: Path, world: int) -> None:
        """The dumps the nodes' agents carried to the coordinator: until every rank's dump and
        sidecar are there (an agent carries a node's files together), or fr_wait_s."""
        deadline = time.time() + self.cfg.fr_wait_s
        files: list[dict[str, Any]] = []
        while time.time() < deadline:
            try:
                r = await self.call("GET", f"/v1/fr/{check_id}")
                files = r.json()["files"] if r.status == 200 else files
            except (Unreachable, ValueError) as e:
                log.warning("cannot read carried dumps (%s); retrying", e)
            if len(dumped_ranks(Path(f["name"]).name for f in files)) >= world:
                break
            await asyncio.sleep(0.25)
        for f in files:  # one directory, as the analyzer reads it; names are per rank
            (into / Path(f["name"]).name).write_bytes(base64.b64decode(f["data"]))
        log.info(
            "collected %d dump file(s) of %s from %d node(s)",
            len(files),
            check_id,
            len({f["node"] for f in files}),
        )

    async def _run_analyzer(self, fr_dir: Path, check_id: str | None) -> None:
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
            log.error(
                "flight-recorder analysis failed (%s, exit %s): %s",
                e,
                proc.returncode,
                err.decode(errors="replace")[-500:],
            )
            return
        log.info("flight recorder: %s, culprits %s", payload.verdict, payload.culprit_ranks)
        await self.post([FrAnalysisEvent(source=Source(job=self.cfg.job_id), payload=payload)])
