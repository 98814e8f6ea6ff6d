"""An incident's evidence bundle on the store (SQLite and PostgreSQL) and through the API: the
`evidence` step waits only for the ranks that can answer, the bundle is sealed once every part
is in (or at its deadline, naming what is missing), is reproducible from its files, and is
never replaced; a playbook cannot destroy before it captures."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from coord_util import cfg, crash, job_status, one, xid
from test_coordinator_logic import heartbeat, setup

from sentinel.coordinator.core import bundle, fr_dumps, lifecycle
from sentinel.coordinator.core.auth import Principal, Role
from sentinel.coordinator.core.operator import ack_command
from sentinel.coordinator.core.playbooks import PlaybookError, load_playbook
from sentinel.coordinator.core.states import Entity, StepState
from sentinel.coordinator.http.app import build_app
from sentinel.coordinator.http.common import SERVICE
from sentinel.coordinator.store import SqlStore
from sentinel.protocol import (
    EventBatch,
    EventKind,
    RankFrDumpPayload,
    RankStacksPayload,
    Source,
    StackFrame,
    ThreadStack,
    make_event,
)


def _stacks(rank: int, request_id: str) -> Any:
    frames = [StackFrame(file="t.py", line=1, func="all_reduce")]
    payload = RankStacksPayload(
        request_id=request_id,
        pid=100 + rank,
        threads=[ThreadStack(name="MainThread", frames=frames)],
    )
    return make_event(
        EventKind.RANK_STACKS, Source(node=f"node-{rank // 2}", rank=rank, job="job1"), payload
    )


def _dumped(rank: int, check: str) -> Any:
    payload = RankFrDumpPayload(path=f"/fr/{rank}", reason="command", check_id=check)
    return make_event(
        EventKind.RANK_FR_DUMP, Source(node=f"node-{rank // 2}", rank=rank, job="job1"), payload
    )


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_the_struck_nodes_ranks_alive_are_captured_and_the_bundle_sealed_once_whole(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """An ECC error on node-0, whose rank 0 had already ended: the repair waits only for the
    ranks it ends (node-0's) that its agent reached; the rest comes beside it."""
    store, ingest, engine, clock = setup(tmp_path, new_store)

    def post(*events: Any) -> None:
        ingest.ingest(EventBatch(events=list(events)), clock())

    status = job_status("job1", ["node-0", "node-1"], ["spare-0"], checkpoints=[10])
    post(status, heartbeat("node-0"), heartbeat("node-1"), xid("node-0"))
    engine.tick()
    assert one(store, "SELECT state FROM actions WHERE action='evidence'")["state"] != "done"
    check = one(store, "SELECT args FROM commands WHERE kind='fr.dump' AND target='node-0'")[
        "args"
    ]["check_id"]
    rid = one(store, "SELECT args FROM commands WHERE kind='stacks.dump' AND target='node-0'")[
        "args"
    ]["request_id"]
    # Rank 0's process is gone: node-0's agent reached one rank, node-1's two.
    for node, reached in (("node-0", 1), ("node-1", 2)):
        for command in (f"{check}@{node}", f"{rid}@{node}"):
            ack_command(
                store, command, True, {"relayed_to_ranks": reached}, f"node:{node}", clock()
            )
    clock.t += 0.5
    post(*[_dumped(r, check) for r in (2, 3)], *[_stacks(r, rid) for r in (1, 2, 3)])
    engine.tick()  # node-1's ranks keep their processes; node-0's rank 1 has not dumped yet
    assert one(store, "SELECT state FROM actions WHERE action='evidence'")["state"] != "done"
    post(_dumped(1, check))
    engine.tick()  # every rank the repair ends wrote its part: captured, the repair goes on
    done = one(store, "SELECT result, state FROM actions WHERE action='evidence'")
    assert done["state"] == "done" and done["result"]["timed_out"] == []
    assert done["result"]["fr_dumped_ranks"] == "1-3" and done["result"]["captured_s"] == 0.5
    assert done["result"]["nodes"] == ["node-0"]
    assert one(store, "SELECT 1 FROM actions WHERE action='resume'") is not None

    # The files come beside the repair; the node's own evidence is not in yet: not sealed.
    for r in (1, 2, 3):
        node = f"node-{r // 2}"
        store.put_fr_dump(check, node, f"fr_trace_rank_{r}", b"dump %d" % r, clock())
        store.put_fr_dump(check, node, f"sentinel_fr_meta.{r}.json", b'{"rank": %d}' % r, clock())
    for r in (1, 3):  # rank 2's dump with stack traces never comes (its GIL held, say)
        node = f"node-{r // 2}"
        store.put_fr_dump(check, node, f"fr_trace_rank_{r}.stacks", b"stacks %d" % r, clock())
    clock.t += 1.0
    engine.tick()
    assert store.bundle(1) is None
    node_doc = json.dumps({"format": "sentinel-node-evidence/1", "node": "node-0"}).encode()
    store.put_fr_dump(check, "node-0", bundle.NODE_FILE, node_doc, clock())
    clock.t += 1.0
    engine.tick()  # only a dump with stack traces lacks: waited for until its own deadline
    assert store.bundle(1) is None
    clock.t += 8.0  # 10.5 s since the capture began
    engine.tick()
    sealed = store.bundle(1)
    assert sealed is not None and sealed.manifest["missing"] == {}
    assert sealed.manifest["timed_out"] == {
        "fr with stack traces": "2 of the 3 rank(s) that dumped wrote theirs with stack traces"
    }
    assert sealed.sha256 == hashlib.sha256(sealed.data).hexdigest()
    assert sealed.manifest["capture_s"] == 0.5 and sealed.manifest["seal_s"] == 10.5
    files = _members(sealed.data)
    assert files["fr/node-0/fr_trace_rank_1.stacks"] == b"stacks 1"
    assert (
        files["nodes/node-0.json"] == node_doc and files["fr/node-1/fr_trace_rank_3"] == b"dump 3"
    )
    assert {json.loads(files["stacks.json"])["answered"]} == {3}
    manifest = json.loads(files["manifest.json"])
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256(files[name]).hexdigest()
    timeline = json.loads(files["incident.json"])
    assert timeline["events"][0]["kind"] == "node.health"  # and the symptoms it absorbed
    assert "evidence" in [a["action"] for a in timeline["actions"]]

    # Reproducible from its files, and never replaced.
    assert bundle.archive({n: d for n, d in files.items()}, int(sealed.started_at)) == sealed.data
    again = bundle.seal(store, store.incident_steps(1)[0], clock() + 5)
    assert again is None and store.bundle(1) == sealed
    clock.t += 120
    engine.tick()
    assert store.bundle(1) == sealed


def test_a_warm_repair_ends_no_rank_and_waits_for_none(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """A crash repaired warm keeps every other rank's process, and its recorder: the capture is
    asked for and the repair goes on at once."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"], checkpoints=[10])
    beats = [heartbeat("node-0"), heartbeat("node-1")]
    ingest.ingest(EventBatch(events=[status, *beats, crash("node-0", 0)]), clock())
    engine.tick()
    done = one(store, "SELECT result, state FROM actions WHERE action='evidence'")
    assert done["state"] == "done" and done["result"]["captured_s"] == 0.0
    assert one(store, "SELECT 1 FROM commands WHERE kind='stacks.dump'") is not None
    assert one(store, "SELECT 1 FROM commands WHERE kind='job.restart'") is not None


def test_a_part_that_never_comes_is_named_and_the_bundle_sealed_at_its_deadline(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)
    ingest.ingest(EventBatch(events=[xid("node-3")]), clock())  # no job: the node's part only
    engine.tick()
    step = one(store, "SELECT result, started_at FROM actions WHERE action='evidence'")
    assert step["result"]["nodes"] == ["node-3"]
    clock.t += 59.0
    engine.tick()
    assert store.bundle(1) is None
    clock.t += 2.0
    engine.tick()
    sealed = store.bundle(1)
    assert sealed is not None
    assert sealed.manifest["missing"] == {
        "nodes/node-3.json": "its agent has sent no node evidence"
    }
    assert sealed.manifest["seal_s"] == 61.0
    assert set(_members(sealed.data)) == {"incident.json", "manifest.json"}


def test_a_bundle_whose_parts_cannot_be_gathered_is_sealed_saying_so_and_the_engine_goes_on(
    tmp_path: Path, new_store: Callable[[], SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ingest, engine, clock = setup(tmp_path, new_store)

    def broken(*_: object) -> dict[str, bytes]:
        raise RuntimeError("a carried file cannot be read")

    monkeypatch.setattr(bundle, "files_of", broken)
    monkeypatch.setattr(bundle, "missing_parts", lambda *_: {})  # every part is in
    ingest.ingest(EventBatch(events=[xid("node-3")]), clock())
    engine.tick()  # the tick that seals it does not fail
    sealed = store.bundle(1)
    assert sealed is not None
    assert sealed.manifest["missing"] == {
        "parts": "gathering them failed: RuntimeError: a carried file cannot be read"
    }
    assert set(_members(sealed.data)) == {"incident.json", "manifest.json"}
    clock.t += 1.0
    ingest.ingest(EventBatch(events=[xid("node-5")]), clock())
    engine.tick()  # the next incident is handled as ever
    assert store.bundle(2) is not None


def test_a_playbook_cannot_destroy_before_it_captures(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nincident: {fault: f, scope: node}\ntrigger:\n  - kinds: [node.health]\n"
        "steps:\n  - {action: notify, params: {message: hot}}\n  - {action: evict_node}\n"
        "  - {action: evidence}\n"
    )
    with pytest.raises(PlaybookError, match=r"step 2 \(evict_node\) destroys .* put an `evidence`"):
        load_playbook(path)
    path.write_text(
        path.read_text().replace("  - {action: evict_node}\n", "") + "  - {action: evict_node}\n"
    )
    assert [s.action for s in load_playbook(path).steps] == ["notify", "evidence", "evict_node"]
    assert "bundle" in load_playbook(path).all_stages()


async def test_the_bundle_through_the_api_and_the_command(tmp_path: Path) -> None:
    app = build_app(cfg(tmp_path, engine_tick_s=0.05))
    async with TestClient(TestServer(app)) as client:
        service = client.app[SERVICE]
        op = (await service.db(service.tokens.create, Role.OPERATOR, None, None))[1]
        node = (await service.db(service.tokens.create, Role.NODE, "node-3", None))[1]
        other = (await service.db(service.tokens.create, Role.NODE, "node-4", None))[1]
        (tmp_path / "op.token").write_text(op)
        auth = {"Authorization": f"Bearer {op}"}
        events = json.loads(EventBatch(events=[xid("node-3")]).model_dump_json())
        r = await client.post(
            "/v1/events", json=events, headers={"Authorization": f"Bearer {node}"}
        )
        assert r.status == 200
        for _ in range(100):  # the engine runs the evidence step and asks node-3's agent
            r = await client.get(
                "/v1/commands?node=node-3&wait=0", headers={"Authorization": f"Bearer {node}"}
            )
            asked = [c for c in (await r.json())["commands"] if c["kind"] == "node.evidence"]
            if asked:
                break
            await asyncio.sleep(0.05)
        check = asked[0]["args"]["check_id"]
        assert (await client.get("/v1/incidents/1/bundle", headers=auth)).status == 404
        put = f"/v1/fr/{check}/node-3/node-evidence.json"
        r = await client.put(
            put, data=b'{"node": "node-3"}', headers={"Authorization": f"Bearer {other}"}
        )
        assert r.status == 403  # a node speaks only for itself
        r = await client.put(
            put, data=b'{"node": "node-3"}', headers={"Authorization": f"Bearer {node}"}
        )
        assert r.status == 200
        for _ in range(100):
            r = await client.get("/v1/incidents/1/bundle", headers=auth)
            if r.status == 200:
                break
            await asyncio.sleep(0.05)
        data = await r.read()
        sha = r.headers["X-Sentinel-Bundle-Sha256"]
        assert hashlib.sha256(data).hexdigest() == sha and r.content_type == "application/gzip"
        assert _members(data)["nodes/node-3.json"] == b'{"node": "node-3"}'
        assert (await client.get("/v1/incidents/1/bundle")).status == 401
        r = await client.get("/v1/incidents/1/bundle", headers={"Authorization": f"Bearer {node}"})
        assert r.status == 403
        assert (await client.get("/v1/incidents/99/bundle", headers=auth)).status == 404
        detail = await (await client.get("/v1/incidents/1", headers=auth)).json()
        assert detail["bundle"]["sha256"] == sha and detail["bundle"]["missing"] == {}

        url = str(client.make_url(""))

        async def command(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sentinel",
                "incident",
                "bundle",
                *args,
                "--coordinator",
                url,
                "--token-file",
                str(tmp_path / "op.token"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=tmp_path,
            )
            out, err = await proc.communicate()
            return proc.returncode or 0, out.decode(), err.decode()

        code, out, _ = await command("1")
        written = tmp_path / f"incident-1-{sha[:12]}.tar.gz"
        assert (
            code == 0 and written.read_bytes() == data and sha in out and "missing: nothing" in out
        )
        code, _, _ = await command("1", "-o", str(written))  # the same bytes again: fine
        assert code == 0
        (tmp_path / "taken").write_bytes(b"something else")
        code, _, err = await command("1", "-o", str(tmp_path / "taken"))
        assert code == 2 and "holds other bytes" in err
        assert (tmp_path / "taken").read_bytes() == b"something else"
        code, _, err = await command("99")
        assert code == 2 and "no such incident" in err


def test_a_jobs_supervisor_uploads_the_evidence_of_a_node_the_repair_took_out(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """The supervisor carries its ranks' dumps as they are written; the repair may take their
    node out of the job before the upload lands. It may still upload for a node whose ranks
    dumped for that check, and for no other."""
    store, ingest, _, clock = setup(tmp_path, new_store)
    ingest.ingest(
        EventBatch(
            events=[job_status("job1", ["node-0", "node-1"], ["spare-0"]), _dumped(0, "c1")]
        ),
        clock(),
    )
    job = Principal("t", Role.JOB, job="job1")
    assert fr_dumps.may_upload(store, job, "node-0", "c1")
    swapped = job_status("job1", ["spare-0", "node-1"], [], generation=1)
    ingest.ingest(EventBatch(events=[swapped]), clock())
    assert fr_dumps.may_upload(store, job, "node-0", "c1")  # its ranks dumped for c1
    assert not fr_dumps.may_upload(store, job, "node-0", "c2")  # not for another check
    assert not fr_dumps.may_upload(store, job, "node-9", "c1")  # never the job's
    assert not fr_dumps.may_upload(store, Principal("u", Role.JOB, job="k"), "node-0", "c1")


def test_a_capture_its_runs_close_cut_short_is_sealed_at_once_saying_so(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """A run closed while its `evidence` step still waits (the step is done, never finished):
    its incident still gets a bundle, sealed on the next tick with what came, `capture` named
    among the missing."""
    store, ingest, engine, clock = setup(tmp_path, new_store)
    events = [job_status("job1", ["node-0", "node-1"], ["spare-0"]), heartbeat("node-1")]
    ingest.ingest(EventBatch(events=[*events, xid("node-1")]), clock())
    engine.tick()
    step = one(store, "SELECT key, result FROM actions WHERE action='evidence'")
    assert step is not None and step["result"]["waiting_for"] == ["fr_dumps", "stacks"]
    check = step["result"]["check"]
    ingest.ingest(EventBatch(events=[_dumped(2, check)]), clock())  # one of node-1's two ranks
    with store.tx():  # as a run's close moves the step it waits on
        lifecycle.move(store, Entity.STEP, step["key"], StepState.DONE, clock(), "test", "closed")
    clock.t += 0.1
    engine.tick()
    sealed = store.bundle(1)
    assert sealed is not None and sealed.manifest["capture_s"] is None
    assert sealed.manifest["missing"]["capture"] == bundle.CUT_SHORT
    assert sealed.manifest["missing"]["nodes/node-1.json"] == "its agent has sent no node evidence"
