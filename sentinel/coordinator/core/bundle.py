"""An incident's evidence bundle: what its `evidence` step captured (`actions/evidence.py`),
sealed into one archive that is never replaced.

The archive (a tar.gz) holds:
- `fr/<node>/<file>`: the ranks' flight-recorder dumps and sidecars carried under the step's
  check (`PUT /v1/fr/{check}/...`, by the nodes' agents or the job's supervisor), and their
  dumps with stack traces (`<dump>.stacks`);
- `nodes/<node>.json`: each node's own evidence (`node.evidence`: NVML snapshot, XID history,
  kernel-log tail, verdicts), carried under the same check;
- `stacks.json`: every rank's Python stacks, grouped (`coordinator/stacks.py`);
- `incident.json`: the incident's timeline as it stood at sealing (its events, runs, steps,
  audit and repair stages);
- `manifest.json`: what it holds (each file's bytes and sha256), what is missing and why, what
  timed out (the dumps with stack traces, past their own deadline), and when the capture
  began, when the ranks' part was in, when it was sealed.
The engine seals an incident's bundle once every part asked for is in, or `bundle_s` after the
evidence step began, whichever comes first; what is missing then is named, never waited for. A
capture cut short (its run closed while the `evidence` step still waited) is sealed at once
with what came, `capture` named among the missing.
The archive's bytes are reproducible from its files (fixed order, owner and times), and its
sha256 names it: `GET /v1/incidents/{id}/bundle`, `sentinel incident bundle ID`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import tarfile
from typing import Any

from pydantic_core import to_jsonable_python

from sentinel.coordinator.core.rows import BundleRow, StepRow
from sentinel.coordinator.core.stacks import answers
from sentinel.coordinator.core.store import Fenced, StateStore, StoreUnavailable
from sentinel.fr.dumps import dumped_ranks
from sentinel.protocol import WITH_STACKS_SUFFIX

log = logging.getLogger("sentinel.coordinator.bundle")

FORMAT = "sentinel-bundle/1"
NODE_FILE = "node-evidence.json"  # a node's own evidence, among its check's files
# The ranks' dumps with stack traces: best effort under their own deadline (`timed_out` in
# the manifest when they do not all come), never what holds the bundle back past it.
WITH_STACKS_PART = "fr with stack traces"
SEAL_BATCH = 16  # bundles considered per engine tick
CUT_SHORT = "cut short: the repair's run was closed before the capture finished"
TIMELINE_EVENTS = 1000  # the incident's events kept in its timeline at most


def _json(value: Any) -> bytes:
    return json.dumps(to_jsonable_python(value), indent=1, sort_keys=True).encode()


def missing_parts(step: StepRow, carried: list[tuple[str, str]]) -> dict[str, str]:
    """What the bundle still lacks, and why, given the (node, file) names carried so far: what
    the engine checks each tick while it waits (names only; the bytes are read to seal)."""
    result = step.result
    missing: dict[str, str] = {}
    names = {f"{node}/{name}" for node, name in carried}
    for node in result.get("nodes", []):
        if f"{node}/{NODE_FILE}" not in names:
            missing[f"nodes/{node}.json"] = "its agent has sent no node evidence"
    dumped = int(result.get("fr_dumps", 0))
    written = len(dumped_ranks(name for _, name in carried if name != NODE_FILE))
    if written < dumped:
        missing["fr"] = f"{dumped} rank(s) dumped, the files of {written} reached the coordinator"
    for part in result.get("timed_out", []):
        missing.setdefault(part, "the ranks' capture deadline passed first")
    with_stacks = sum(name.endswith(WITH_STACKS_SUFFIX) for _, name in carried)
    if with_stacks < dumped:
        missing[WITH_STACKS_PART] = (
            f"{with_stacks} of the {dumped} rank(s) that dumped wrote theirs with stack traces"
        )
    return missing


def files_of(store: StateStore, step: StepRow, check: str) -> dict[str, bytes]:
    """The files the bundle holds, by archive name: the carried ones and the ranks' stacks."""
    files: dict[str, bytes] = {}
    for node, name, data in store.fr_dumps(check) if check else []:
        files[f"nodes/{node}.json" if name == NODE_FILE else f"fr/{node}/{name}"] = data
    stacks = step.result.get("stacks")
    if isinstance(stacks, dict) and step.incident_id is not None:
        incident = store.incident(step.incident_id)
        job = incident.job if incident is not None else None
        try:
            grouped = answers(store, job, str(stacks.get("request"))) if job else None
        except LookupError:
            grouped = None
        if grouped is not None:
            files["stacks.json"] = _json(grouped.as_json())
    return files


def archive(files: dict[str, bytes], mtime: int) -> bytes:
    """A tar.gz of `files` whose bytes depend on the files only (and `mtime`): sorted names,
    no owner, fixed modes."""
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), mtime, 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return raw.getvalue()


def seal(
    store: StateStore, step: StepRow, now: float, failed: str | None = None
) -> BundleRow | None:
    """The incident's bundle, sealed now if every part is in or its time is up; None: not
    yet (or the incident has one already). `failed`: gathering the parts failed so; the
    bundle is sealed at once with its timeline, and says so."""
    assert step.incident_id is not None  # an incident's step
    check = str(step.result.get("check", ""))
    if failed is not None:
        files, missing = {}, {"parts": f"gathering them failed: {failed}"}
    elif step.done_at is None:  # its run was closed mid-capture: sealed at once, with what came
        names = store.fr_dump_names(check) if check else []
        files, missing = files_of(store, step, check), {"capture": CUT_SHORT}
        missing |= missing_parts(step, names)
    else:
        missing = missing_parts(step, store.fr_dump_names(check) if check else [])
        if missing and now < step.started_at + float(step.result.get("bundle_s", 60.0)):
            # The dumps with stack traces are waited for only until their own deadline: a rank
            # holding the GIL, or torn down, never writes one; then they are timed out.
            stacks_by = step.started_at + float(step.result.get("with_stacks_s", 10.0))
            if set(missing) != {WITH_STACKS_PART} or now < stacks_by:
                return None
        files = files_of(store, step, check)
    timed_out = (
        {WITH_STACKS_PART: missing.pop(WITH_STACKS_PART)} if WITH_STACKS_PART in missing else {}
    )
    view = store.incident_view(step.incident_id, TIMELINE_EVENTS)
    files["incident.json"] = _json(view)
    manifest = {
        "format": FORMAT,
        "incident": step.incident_id,
        "check": step.result.get("check"),
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in sorted(files.items())
        },
        "missing": missing,
        "timed_out": timed_out,
        "started_at": step.started_at,
        "captured_at": step.done_at,
        "sealed_at": now,
        "capture_s": None if step.done_at is None else round(step.done_at - step.started_at, 3),
        "seal_s": round(now - step.started_at, 3),
    }
    files["manifest.json"] = _json(manifest)
    data = archive(files, int(step.started_at))
    row = BundleRow(
        incident_id=step.incident_id,
        sha256=hashlib.sha256(data).hexdigest(),
        manifest=manifest,
        data=data,
        started_at=step.started_at,
        captured_at=now if step.done_at is None else step.done_at,
        sealed_at=now,
    )
    return row if store.insert_bundle(row) else None


def seal_due(store: StateStore, now: float) -> list[BundleRow]:
    """Seal the bundles that are ready (the engine's tick)."""
    sealed = []
    for step in store.unsealed_evidence(SEAL_BATCH):
        try:
            with store.tx():
                row = seal(store, step, now)
        except (StoreUnavailable, Fenced):
            raise  # the engine's loop says so once
        except Exception as e:  # one incident's bundle never stops the engine's tick
            log.exception("incident %s: gathering its evidence bundle failed", step.incident_id)
            with store.tx():
                row = seal(store, step, now, failed=f"{type(e).__name__}: {e}"[:500])
        if row is not None:
            log.info(
                "incident %s: evidence bundle sealed (%d bytes, sha256 %s, missing %s)",
                row.incident_id,
                len(row.data),
                row.sha256[:12],
                sorted(row.manifest["missing"]) or "nothing",
            )
            sealed.append(row)
    return sealed
